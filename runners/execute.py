"""One grid point on the ranks of a gang: inputs -> correctness gate -> timing -> one profiled step.

`run_point_job(ctx, payload)` is the job function the worker sends to every rank of a W-rank gang
(`runners.gang`). Each rank builds the same global inputs from the point's seed (`runners.workload`), takes
its shard and runs the mode; rank 0 gathers the output and holds the checks (`runners.correctness`); all ranks
learn the verdict through one all-reduce, so a failed gate skips timing everywhere. Then every rank times its
step together (`runners.timing`: sample = max over ranks) and profiles one step (`runners.profile`; rank 0
keeps the trace file). Every rank returns a `runners.results.PointResult`: rank 0 with the measurement, every
rank with its profile and kernels.cp's count of its collectives, in all and per direction the step runs
(`runners.collective_check`; `runners.results.store_rows` compares them). The point arrives as a
`runners.point.PointSpec` inside a `PointJob`.

Modes (DESIGN §2): `none` is `kernels.forward` on the whole (dense or varlen) batch; `warmup_correct` is
`kernels.cp.warmup_correct` on one device; every other mode is `kernels.cp.forward(mode, ...)` on the rank's
shard of the flattened batch (`kernels.cp.build_context` / `shard`, built once per point, outside the step).
The timed step is only that call: no gather, no host read. A `direction: fwd+bwd` point times the training
step instead (`runners.training`: forward + backward with the point's fixed `do`, gradients reset each sample)
and its gate adds every input gradient (vs `none`'s and the reference's, max folded into the two errors).
A real-model gate or `l2norm_in_kernel` (`runners.workload.Activation`): the step activates the raw gate and
normalises q, k on its own shard (per token), then runs the mode; A_log and dt_bias are step inputs replicated on every
rank, their gradient in the gate is the sum of the ranks' contributions (as FLA's CP leaves it to data parallelism).
Around every step (timed, checked, profiled) a peer's `step_context(options)` is entered. Our backends' kernels calls
get the point's launch plan (`launch_plan`: the tuned configs `tune_job` found, the recompute policy `keep` of the
triton options, `runners.backend_options`, and a recorder of what launched, which gives the stored `configs`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from kernels.vocabulary import SINGLE_DEVICE
from runners import backend_options, training
from runners.collective_check import expected_by_direction, step_directions, step_total
from runners.correctness import judge, rel_l2
from runners.gang import RankContext
from runners.point import PointJob, PointSpec
from runners.profile import profile_step
from runners.results import PointResult
from runners.timing import L2Flush, StopRule, time_step
from runners.workload import Activation, Workload, make_workload, reduced_params

if TYPE_CHECKING:
    from kernels.plan import LaunchPlan
    from runners.tuner.sweep import TuningOutcome

__all__ = ["ModeRun", "build_mode", "launch_plan", "run_point_job", "tune_job", "tune_shape"]

logger = logging.getLogger(__name__)


@dataclass
class ModeRun:
    """A point's mode ready to run on this rank: `step()` is the timed call; `full_output()` the checked one."""

    step: Callable[[], Any]
    full_output: Callable[[], Tensor]  # the whole output [1, N, H, V] (or [B, T, H, V]) on rank 0, gathered
    report: Callable[[], dict[str, Any]]  # the scheme's own report (host values; call after timing)
    expected_collectives: dict[str, int] = field(default_factory=dict)  # kernels.cp's count for this rank
    # the same per direction the step runs (runners.collective_check); None: the backend states no count
    expected_by_direction: dict[str, dict[str, int]] | None = None
    full_grads: Callable[[], list[Tensor]] | None = None  # fwd+bwd: the input gradients, gathered on rank 0
    grad_errors: dict[str, float] = field(default_factory=dict)  # fwd+bwd: rel L2 error of each gradient vs none


def _gather(o_local: Tensor, ctx_cp: Any, group: Any) -> Tensor:
    from kernels import cp

    world = dist.get_world_size(group)
    if world == 1:
        return cp.unshard([o_local], ctx_cp)
    shards = [torch.empty_like(o_local) for _ in range(world)]
    dist.all_gather(shards, o_local.contiguous(), group=group)
    return cp.unshard(shards, ctx_cp)


def build_mode(point: PointSpec, wl: Workload, rc: RankContext, options: dict[str, Any], plan: LaunchPlan) -> ModeRun:
    """The step and checked output of the point's mode on this rank (inputs sharded here, once); our kernels launch
    with `plan`."""
    from runners.plugins import peer_of_point

    peer = peer_of_point(point)
    if peer is not None:
        return _peer_mode(peer, point, wl, rc)
    return _our_mode(point, wl, rc, plan)


def _in_context(run: ModeRun, context: Callable[[], contextlib.AbstractContextManager[Any]]) -> ModeRun:
    """`run` with its step, checked output and gradients each entered in a fresh `context()`."""

    def wrap(fn: Callable[[], Any]) -> Callable[[], Any]:
        def inside() -> Any:
            with context():
                return fn()

        return inside

    run.step, run.full_output = wrap(run.step), wrap(run.full_output)
    if run.full_grads is not None:
        run.full_grads = wrap(run.full_grads)
    return run


def _our_mode(point: PointSpec, wl: Workload, rc: RankContext, plan: LaunchPlan) -> ModeRun:
    """Our backend's (torch, triton) implementation of the point's mode on this rank."""
    import kernels

    op, mode, backend = point.op, point.mode, point.backend
    train = training.is_training(point)
    no_comm: dict[str, dict[str, int]] = {d: {} for d in step_directions(point.direction)}
    act = _activation(point)
    if mode == "none":
        args = _inputs(wl, train)
        cu = wl.cu_seqlens

        def step() -> Tensor:
            return kernels.forward(op, *act(args), cu_seqlens=cu, backend=backend, plan=plan)[0]

        if train:
            with torch.no_grad():
                do = training.global_do(point, step())
            tstep = training.train_step(step, args, do)
            return ModeRun(step=tstep, full_output=tstep, report=lambda: {}, expected_by_direction=no_comm,
                           full_grads=lambda: training.grads_of(tstep, args, lambda g: g))
        return ModeRun(step=step, full_output=step, report=lambda: {}, expected_by_direction=no_comm)

    from kernels import cp

    flat = wl.flat()
    if mode == "warmup_correct":
        wc = dict(point.mode_options)
        holder: dict[str, Any] = {}
        bounds = flat.cu_seqlens_cpu
        wc_args = _inputs(flat, train)

        def wc_step() -> Tensor:
            o, rep = cp.warmup_correct(op, *act(wc_args), cu_seqlens=bounds, backend=backend, scale=None, plan=plan, **wc)
            holder["report"] = rep
            return o

        def wc_report() -> dict[str, Any]:
            rep = holder.get("report")
            return {"warmup_correct": rep.to_dict()} if rep is not None and hasattr(rep, "to_dict") else {}

        if train:
            with torch.no_grad():
                wc_do = training.global_do(point, wc_step())
            wc_train = training.train_step(wc_step, wc_args, wc_do)
            return ModeRun(step=wc_train, full_output=wc_train, report=wc_report, expected_by_direction=no_comm,
                           full_grads=lambda: training.grads_of(wc_train, wc_args, lambda g: g))
        return ModeRun(step=wc_step, full_output=wc_step, report=wc_report, expected_by_direction=no_comm)

    W = rc.world_size
    ctx_cp = cp.build_context(flat.cu_seqlens_cpu, W, rc.rank, point.layout)
    # a rank holds only its shard (a copy, so the global inputs can be freed before timing)
    shards = [*(cp.shard(x, ctx_cp).clone() for x in flat.tensors), *flat.params]  # params: replicated
    if train:
        shards = training.leaves(shards)
    mode_opts = point.mode_options or None

    def cp_step() -> Tensor:
        return cp.forward(mode, op, *act(shards), group=rc.group, ctx=ctx_cp, backend=backend, scale=None, options=mode_opts,
                          plan=plan)

    by_direction = expected_by_direction(mode, ctx_cp, mode_opts, "fwd+bwd" if train else "fwd")
    step, grads = cp_step, None
    if train:
        with torch.no_grad():
            o_local = cp_step()
        do_full = training.global_do(point, o_local.new_empty(1, ctx_cp.total_len, *o_local.shape[2:]))
        step = training.train_step(cp_step, shards, cp.shard(do_full, ctx_cp))
        grads = lambda: _cp_grads(step, shards, ctx_cp, rc.group)  # noqa: E731
    return ModeRun(
        step=step,
        full_output=lambda: _gather(step(), ctx_cp, rc.group),
        report=lambda: {},
        expected_collectives=step_total(by_direction),
        expected_by_direction=by_direction,
        full_grads=grads,
    )


def _activation(point: PointSpec) -> Callable[[Sequence[Tensor]], Sequence[Tensor]]:
    """The step's per-token work on the stored inputs (`runners.workload.Activation`); the five inputs as they are for
    a point with a precomputed gate and no l2norm (every point before the real-model gates: the same step as then)."""
    act = Activation.of(point)
    return (lambda xs: xs) if act.identity else act


def _inputs(wl: Workload, train: bool) -> Sequence[Tensor]:
    """A single-device step's stored inputs: the op's five and the gate's parameters, leaves when it trains."""
    xs = [*wl.tensors, *wl.params]
    return training.leaves(xs) if train else xs


def _cp_grads(step: Callable[[], Tensor], shards: Sequence[Tensor], ctx_cp: Any, group: Any) -> list[Tensor]:
    """One training step's input gradients on rank 0 in the global layout: the five sharded inputs' gathered, the
    replicated gate parameters' summed over the ranks (each rank's is its shard's contribution)."""
    local = training.grads_of(step, shards, lambda g: g)
    out = [_gather(g, ctx_cp, group) for g in local[:5]]
    for g in local[5:]:
        if dist.get_world_size(group) > 1:
            dist.all_reduce(g, group=group)
        out.append(g)
    return out


def _peer_mode(peer: Any, point: PointSpec, wl: Workload, rc: RankContext) -> ModeRun:
    """A peer backend's implementation of the point's mode (`runners.peers`): the flattened batch, sharded for
    the multi-rank modes; `none` and `warmup_correct` get the whole batch with a one-rank context."""
    from kernels import cp
    from runners.peers import peer_options

    op, mode = point.op, point.mode
    train = training.is_training(point)
    begin = getattr(peer, "begin_point", None)  # optional: a new point on this rank
    if callable(begin):
        begin(point)
    flat = wl.flat()
    one = mode in SINGLE_DEVICE  # the whole batch with a one-rank context
    ctx_cp = cp.build_context(flat.cu_seqlens_cpu, 1 if one else rc.world_size, 0 if one else rc.rank,
                              "contiguous" if one else point.layout)
    xs = flat.tensors if one else [cp.shard(x, ctx_cp).clone() for x in flat.tensors]
    if train:
        xs = training.leaves(xs)
    opts = {**point.mode_options, **peer_options(peer, point)}
    group = None if one else rc.group
    shape = wl.tensors[2].shape[:-1]  # none: the caller's (dense or varlen) layout [B, T, H]

    first_calls: dict[str, float] = {}  # seconds of the point's first forward and first step (compile, autotune)

    def peer_fwd() -> Tensor:
        return peer.forward(mode, op, *xs, group=group, ctx=ctx_cp, scale=None, options=opts)

    fwd = _timed_first_call(peer_fwd, first_calls, "fwd", rc.device)

    def to_global(x: Tensor, dense: Sequence[int]) -> Tensor:
        """A local tensor (output or input gradient) in the global layout on rank 0 (`none`: the caller's `dense`)."""
        if one:
            return x.reshape(dense) if mode == "none" else x
        return _gather(x, ctx_cp, rc.group)

    base: Callable[[], Tensor] = fwd
    if train:  # forward + `o.backward(do)`: a peer's forward is differentiable by autograd
        with torch.no_grad():
            o_local = fwd()
        like = o_local if one else o_local.new_empty(1, ctx_cp.total_len, *o_local.shape[2:])
        do = training.global_do(point, like)
        base = _timed_first_call(training.train_step(fwd, xs, do if one else cp.shard(do, ctx_cp)), first_calls,
                                 "fwd+bwd", rc.device)

    def full_grads() -> list[Tensor]:
        local = training.grads_of(base, xs, lambda g: g)
        return [to_global(g, t.shape) for g, t in zip(local, wl.tensors, strict=True)]

    def full_output() -> Tensor:
        o = base()
        return to_global(o, (*shape, o.shape[-1]))

    count = getattr(peer, "expected_collectives", None)  # optional: what one step issues (else not stated)
    expected = dict(count(mode, ctx_cp, opts)) if callable(count) else {}
    own_report = getattr(peer, "point_report", None)  # optional: the peer's facts about the point

    def report() -> dict[str, Any]:
        return {**(dict(own_report(point)) if callable(own_report) else {}), "first_call_s": dict(first_calls)}

    run = ModeRun(step=base, full_output=full_output, report=report, expected_collectives=expected,
                  full_grads=full_grads if train else None)
    context = getattr(peer, "step_context", None)  # around every step (FLA: the Hopper-guard opt-in, for its backward)
    return _in_context(run, lambda: context(opts)) if callable(context) else run


def _timed_first_call(fn: Callable[[], Tensor], into: dict[str, float], name: str,
                      device: torch.device) -> Callable[[], Tensor]:
    """`fn` whose first call is timed to completion (device synchronised; outside the timed steps: the first call is
    the gate's or the `do`'s) into `into[name]`: a peer's compile or autotune cost, about zero on a warm cache."""

    def call() -> Tensor:
        if name in into:
            return fn()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        into[name] = round(time.perf_counter() - t0, 3)
        return out

    return call


def _none_output(point: PointSpec, wl: Workload, rc: RankContext, plan: LaunchPlan) -> Tensor:
    """The `none` output the gate compares a mode with: the backend's own `none` (a peer's when it has one,
    else our torch/triton one) on the same inputs."""
    import kernels
    from runners.plugins import peer_of_point

    peer = peer_of_point(point)
    if peer is not None and "none" in peer.modes:
        return _peer_mode(peer, replace(point, mode="none"), wl, rc).full_output()
    backend = point.backend if peer is None else "auto"
    xs = _activation(point)([*wl.tensors, *wl.params])
    return kernels.forward(point.op, *xs, cu_seqlens=wl.cu_seqlens, backend=backend, plan=plan)[0]


def _jsonable(x: Any) -> Any:
    """`x` with tensors, tuples and non-finite floats made JSON-safe (reports go to a JSON column)."""
    if isinstance(x, Tensor):
        return _jsonable(x.detach().cpu().tolist()) if x.numel() <= 64 else f"<tensor {tuple(x.shape)} {x.dtype}>"
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "__dict__"):
        return _jsonable(vars(x))
    return str(x)


def _agree(rc: RankContext, failed: bool) -> bool:
    """True on every rank if any rank says failed (one all-reduce MAX of a flag)."""
    if rc.world_size == 1:
        return failed
    flag = torch.tensor([1.0 if failed else 0.0], device=rc.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=rc.group)
    return bool(flag.item())


def _check(point: PointSpec, wl: Workload, run: ModeRun, rc: RankContext, options: dict[str, Any],
           plan: LaunchPlan) -> dict[str, Any]:
    """Errors vs none and vs the reference (rank 0 computes; others only join the collectives)."""
    import kernels

    check = options.get("check") or {}
    o_full = run.full_output()
    err_none = err_ref = None
    if rc.rank == 0:
        if point.mode == "none":
            err_none = 0.0
        else:
            o_none = _none_output(point, wl, rc, plan)
            err_none = rel_l2(o_full, o_none)
    if check.get("reference", True):
        small = reduced_params(point, max_tokens=int(check.get("reference_tokens", 256)))
        same = (small.B, small.T, small.H, small.lengths) == (point.B, point.T, point.H, point.lengths)
        if same:
            wl_r, o_r = wl, o_full
        else:
            wl_r = make_workload(small, device=rc.device)
            o_r = build_mode(small, wl_r, rc, options, plan).full_output()
        if rc.rank == 0:
            f = wl_r.flat() if point.mode != "none" else wl_r
            o_ref = kernels.reference(point.op, *_activation(point)([*f.tensors, *f.params]), cu_seqlens=f.cu_seqlens)[0]
            err_ref = rel_l2(o_r, o_ref)
    if run.full_grads is not None:   # fwd+bwd: every input gradient, vs none's and vs the reference's
        err_none, err_ref = _check_grads(point, wl, run, rc, options, o_full, err_none, err_ref, plan)
    return {"err_vs_none": err_none, "err_vs_reference": err_ref}


def _check_grads(point: PointSpec, wl: Workload, run: ModeRun, rc: RankContext, options: dict[str, Any],
                 o_full: Tensor, err_none: float | None, err_ref: float | None,
                 plan: LaunchPlan) -> tuple[float | None, float | None]:
    """The gate's errors with the input gradients folded in (max over o, dq, dk, dv, dg, dbeta)."""
    check = options.get("check") or {}
    assert run.full_grads is not None
    got = run.full_grads()
    if rc.rank == 0:
        do = training.global_do(point, o_full)
        from runners.plugins import peer_of_point

        none_backend = "auto" if peer_of_point(point) is not None else point.backend  # a peer: against ours
        ref = training.reference_grads(point.op, wl.tensors, do, cu_seqlens=wl.cu_seqlens, backend=none_backend,
                                       params=wl.params, activation=_activation(point))
        errs = [rel_l2(a, b) for a, b in zip(got, ref, strict=True)]
        err_none = max([err_none or 0.0, *errs])
        run.grad_errors = dict(zip(training.grad_names(len(wl.params)), errs, strict=True))
    if check.get("reference", True):
        small = reduced_params(point, max_tokens=int(check.get("reference_tokens", 256)))
        wl_r = make_workload(small, device=rc.device)
        run_r = build_mode(small, wl_r, rc, options, plan)
        assert run_r.full_grads is not None
        got_r = run_r.full_grads()
        o_r = run_r.full_output()
        if rc.rank == 0:
            f = wl_r.flat() if point.mode != "none" else wl_r
            do_r = training.global_do(small, o_r)
            ref_r = training.reference_grads(point.op, f.tensors, do_r, cu_seqlens=f.cu_seqlens, backend=None,
                                             params=f.params, activation=_activation(point))
            err_ref = max([err_ref or 0.0, *(rel_l2(a, b) for a, b in zip(got_r, ref_r, strict=True))])
    return err_none, err_ref


def launch_plan(point: PointSpec, payload: PointJob) -> LaunchPlan:
    """The launch plan of a point's kernels calls: the default plan with the tuned configs of the payload (`autotune`,
    from `tune_job`; None: the default plan's), the recompute policy of its triton options and a fresh recorder."""
    from kernels.plan import LaunchRecorder, default_plan
    from runners.tuner import payload_table

    plan = default_plan()
    if payload.autotune is not None:
        plan = plan.replace(table=payload_table(payload.autotune))
    fields = backend_options.plan_fields(point.backend, point.backend_options)
    return plan.replace(recorder=LaunchRecorder(), **fields)


def _launch_configs(plan: LaunchPlan) -> dict[str, Any]:
    launched: Mapping[str, tuple[dict[str, Any], Any]] = plan.recorder or {}
    return {name: {"key": _jsonable(key), "config": cfg.as_dict()} for name, (key, cfg) in launched.items()}


def tune_shape(point: PointSpec) -> dict[str, Any]:
    """The shape the tuner tunes for a point: its global shape, flattened (varlen) for the CP modes, whose ranks
    launch varlen kernels, with H/W heads for headwise. Launch keys do not hold T, so this covers the shards."""
    shape: dict[str, Any] = {"B": point.B, "T": point.T, "H": point.H, "K": point.K, "V": point.V,
                             "dtype": point.dtype, "lb": point.lb, "seed": point.seed}
    lengths = point.lengths
    if point.mode != "none" and not lengths:
        lengths = (point.T,) * point.B
    if lengths:
        shape.update(B=1, T=int(sum(lengths)), lengths=list(lengths))
    if point.HV:  # grouped value heads: the kernels run with q/k expanded to HV heads
        shape["H"] = point.HV
    if point.mode == "headwise":
        shape["H"] = int(shape["H"]) // point.W
    return shape


def tune_job(rc: RankContext, payload: dict[str, Any]) -> TuningOutcome:
    """Gang job (one rank): tune the kernels a point launches that the store lacks (`runners.tuner.tune_missing`,
    searching as the sweep's `tuning` spec says) and return what it measured: the configs in the autotune-file
    format, the trials and the winners. No store session is opened here: the parent read the store into
    `payload["state"]` (`runners.tuner.tuning_state`) and stores the outcome; `payload["point"]` is the point
    (a `PointSpec`)."""
    from runners.tuner import TuneSpec, tune_missing

    point: PointSpec = payload["point"]
    return tune_missing(payload["state"], op=point.op, shape=tune_shape(point), device=rc.device,
                        spec=TuneSpec.of(payload.get("tuning"), direction=point.direction))


def run_point_job(rc: RankContext, payload: PointJob) -> PointResult:
    """Gang job: run one point on this rank (`runners.point.PointJob`: the point, the sweep spec's timing, check
    and profile options, rank 0's Chrome trace target and the tuned configs to launch with, from `tune_job`;
    None: the default plan's); the kernels calls get `launch_plan(point, payload)`."""
    point, options = payload.point, payload.options
    plan = launch_plan(point, payload)
    if rc.world_size != point.W:
        raise ValueError(f"point W={point.W} sent to a gang of {rc.world_size} ranks")
    wl = make_workload(point, device=rc.device)
    run = build_mode(point, wl, rc, options, plan)

    errs = _check(point, wl, run, rc, options, plan)
    gate = judge(point, **errs, check=options.get("check") or {})
    if _agree(rc, rc.rank == 0 and not gate.passed):
        return PointResult(ok=False, gate=gate.as_dict(), error=gate.message)
    if point.mode not in ("none",):
        del wl  # CP ranks keep only their shards (and none/warmup_correct their closures) while timed

    if plan.recorder is not None:
        plan.recorder.clear()  # the stored configs are those of the timed steps
    rule = StopRule.from_mapping(options.get("timing"))
    flush = None
    if rc.device.type == "cuda" and rule.flush_l2:
        flush = rc.cache.get("l2flush")
        if flush is None:
            flush = rc.cache["l2flush"] = L2Flush(rc.device)
    timing = time_step(run.step, rule=rule, device=rc.device, group=rc.group, flush=flush)
    configs = _launch_configs(plan)

    prof = None
    if options.get("profile", True):
        trace = payload.trace_path if rc.rank == 0 else None
        prof = profile_step(run.step, device=rc.device, trace_path=trace).as_dict()
    out = PointResult(ok=True, profile=prof, expected_collectives=run.expected_collectives,
                      expected_by_direction=run.expected_by_direction)
    if rc.rank == 0:
        out = replace(
            out,
            gate=gate.as_dict(),
            timing=timing.as_dict(),
            configs=configs,
            report=_jsonable({**run.report(), **({"grad_errors_vs_none": run.grad_errors} if run.grad_errors else {})}),
        )
    return out
