"""The tuner's measuring and deciding: for an op and its shapes, search every Triton kernel the op launches.

    result = tune_kernels(op="gdn", shapes=[{"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128}],
                          spec=TuneSpec(strategy="halving"), device="cuda")       # a TuneResult, no store
    crud.store_tuning(session, result=result, sweep_id=None)                      # the caller stores it

Per shape (`tune_case` for any callable that runs an op):
1. run the op once (imports and compiles), then once with every kernel at its default config: the outputs of
   that run are the correctness reference, and the recorder of its launch plan (`kernels.plan.LaunchRecorder`)
   tells which kernels launched with which shape keys (observed, not assumed);
2. for each launched kernel with a non-empty space, in launch order, search its space (runners.tuner.search)
   with the op's other kernels fixed at their best so far (coordinate descent: later kernels are tuned on top
   of the earlier winners, and their `default_ms` is measured that way too);
3. decide: every trial is kept, and the best `ok` trial per (kernel, key) is the winner, with the runner-up's
   and the default's medians and the kernel's source hash (`runners.tuner.result.KernelResult`).
No store session is open while anything is measured: the caller stores the `TuneResult` afterwards
(`db.crud.store_tuning`; a worker's rank process measures and its parent stores: runners.tuner.sweep). A device
crash raises `TuningStopped` carrying the trials so far, so the caller stores them too.

Multi-rank (`group`, or whenever torch.distributed is initialised): only rank 0 of the group tunes; its result
is broadcast (`broadcast_object_list`) and every rank returns the same winners, so all ranks launch identically
(the failure mode of per-rank autotuning: Megatron-LM#6966). Every rank launches with them through a plan:
`LaunchPlan(table=tuned_table(result.tuned_rows()))`.

CPU tuning (wall clock) is allowed for tests; CPU rows are never exported (runners.tuner.export).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from kernels.autotune import key_str, normalize_key, source_hash
from kernels.configs import KERNELS, LaunchConfig, get_spec
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.tuner.clock import Timer, make_timer
from runners.tuner.miscompiles import known_bad as known_bad_configs
from runners.tuner.result import KernelResult, OnResult, TuneProgress, TuneResult, report_new
from runners.tuner.search import SearchResult, candidates, first_rung, pinned, search
from runners.tuner.spec import TuneSpec
from runners.tuner.trials import RunFn, Trial, TrialContext, run_trial
from runners.workload import INPUT_NAMES, TORCH_DTYPES, make_inputs

if TYPE_CHECKING:
    from db.models import TunedConfig

__all__ = ["TRIAL_TOL", "Shape", "case_inputs", "case_tol", "device_facts", "launched_configs", "make_case",
           "training_step", "tune_case", "tune_kernels", "tuned_table"]

DEFAULTS = TuneSpec()

logger = logging.getLogger(__name__)

# relative L2 tolerance of a trial's outputs against the default config's: configs only reorder fp32
# accumulations, so honest configs agree to a few output ulps; a wrong config is off by O(1)
TRIAL_TOL = {"float32": 2e-3, "bfloat16": 2e-2, "float16": 2e-2}  # by dtype name


@dataclass(frozen=True)
class Shape:
    """One tuning shape: dense `[B, T, ...]`, or varlen with `lengths` (then B must be 1)."""

    B: int = 1
    T: int = 8192
    H: int = 16
    K: int = 128
    V: int = 128
    dtype: str = "bfloat16"
    lengths: tuple[int, ...] | None = None
    lb: float = -2.0
    initial_state: bool = False
    seed: int = 0

    @classmethod
    def of(cls, s: Shape | Mapping[str, Any]) -> Shape:
        if isinstance(s, Shape):
            return s
        names = {f.name for f in fields(cls)}
        unknown = set(s) - names
        if unknown:
            raise ValueError(f"shape has unknown fields {sorted(unknown)}; expected a subset of {sorted(names)}")
        d = dict(s)
        if d.get("lengths") is not None:
            d["lengths"] = tuple(int(x) for x in d["lengths"])
            d.setdefault("T", sum(d["lengths"]))
            d.setdefault("B", 1)
            if d["B"] != 1 or d["T"] != sum(d["lengths"]):
                raise ValueError(f"varlen shape needs B=1 and T=sum(lengths), got B={d['B']}, T={d['T']}, lengths={d['lengths']}")
        if d.get("dtype", "bfloat16") not in TORCH_DTYPES:
            raise ValueError(f"shape dtype must be one of {sorted(TORCH_DTYPES)}, got dtype={d.get('dtype')!r}")
        for dim in ("B", "T", "H", "K", "V"):
            if dim in d and (isinstance(d[dim], bool) or not isinstance(d[dim], int) or d[dim] < 1):
                raise ValueError(f"shape {dim} must be a positive integer, got {dim}={d[dim]!r}")
        if d.get("lengths") is not None and (not d["lengths"] or min(d["lengths"]) < 1):
            raise ValueError(f"shape lengths must be positive integers, got lengths={list(d['lengths'])}")
        return cls(**d)


def make_case(op: str, shape: Shape, device: torch.device | str) -> dict[str, Any]:
    """Seeded inputs for `kernels.forward` from the one maker (`runners.workload.make_inputs`: FLA layout, never
    zeros; k L2-normalised, g = lb * sigmoid(x)), with the output gradient `do` of a fwd+bwd run drawn last; varlen
    bounds both on the device (`cu_seqlens`) and on the host (`cu_seqlens_cpu`), so no call reads them back."""
    w = make_inputs(op, B=shape.B, T=shape.T, H=shape.H, K=shape.K, V=shape.V, dtype=shape.dtype, lb=shape.lb,
                    seed=shape.seed, lengths=shape.lengths, device=device, initial_state=shape.initial_state,
                    grad_out=True)
    bounds = w.cu_seqlens_cpu if shape.lengths is not None else None
    return {"q": w.q, "k": w.k, "v": w.v, "g": w.g, "beta": w.beta, "cu_seqlens": w.cu_seqlens,
            "cu_seqlens_cpu": bounds, "initial_state": w.initial_state, "do": w.do}


def op_runner(op: str, case: Mapping[str, Any], *, backend: str = "triton", direction: str = "fwd") -> RunFn:
    """A RunFn: `kernels.forward(op, ..., output_final_state=True, plan=plan)` -> (o, final_state).

    direction `"fwd+bwd"`: the training step, so the backward kernels are tuned on the whole step: `o.backward(do)`
    with the case's seeded `do` through the op's autograd Function (which hands the same plan to the backward
    kernels), fresh leaves each call -> (o, final_state, dq, dk, dv, dg, dbeta[, dh0 when the case has an initial
    state]).
    """
    import kernels
    from kernels.vocabulary import POINT_DIRECTIONS as DIRECTIONS

    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'fwd' or 'fwd+bwd', got direction={direction!r}")

    def forward(plan: LaunchPlan, *xs: torch.Tensor,
                h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return kernels.forward(op, *xs, initial_state=h0, output_final_state=True, cu_seqlens=case["cu_seqlens"],
                               cu_seqlens_cpu=case.get("cu_seqlens_cpu"), backend=backend, plan=plan)

    def run(plan: LaunchPlan) -> tuple[torch.Tensor | None, ...]:
        return forward(plan, *(case[n] for n in INPUT_NAMES), h0=case["initial_state"])

    if direction == "fwd":
        return run

    def train(plan: LaunchPlan) -> tuple[torch.Tensor | None, ...]:
        return training_step(functools.partial(forward, plan), case)

    return train


def training_step(forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
                  case: Mapping[str, Any]) -> tuple[torch.Tensor | None, ...]:
    """One training step of `forward(q, k, v, g, beta, h0=...) -> (o, final_state)` on the case: fresh leaves (no
    gradient accumulates across calls), `o.backward(case["do"])` -> (o, final_state, dq, dk, dv, dg, dbeta[, dh0
    when the case has an initial state])."""
    h0 = case["initial_state"]
    xs = [case[n].detach().requires_grad_() for n in INPUT_NAMES]
    s0 = h0.detach().requires_grad_() if h0 is not None else None
    o, ht = forward(*xs, h0=s0)
    o.backward(case["do"])
    grads = [x.grad for x in xs] + ([s0.grad] if s0 is not None else [])
    return (o.detach(), ht.detach() if ht is not None else None, *grads)


def device_facts(device: torch.device | str) -> tuple[str, str | None]:
    """(device name as the autotune loader matches it, compute capability "major.minor" or None)."""
    d = torch.device(device)
    if d.type != "cuda":
        return "cpu", None
    major, minor = torch.cuda.get_device_capability(d)
    return torch.cuda.get_device_name(d), f"{major}.{minor}"


def launched_configs(recorder: Mapping[str, tuple[Any, LaunchConfig]]) -> dict[str, dict[str, Any]]:
    """{kernel: config dict} of the launches a plan's recorder saw: what a measurement actually ran with."""
    return {name: cfg.as_dict() for name, (_key, cfg) in recorder.items()}


def case_tol(spec: TuneSpec, dtype: str) -> float:
    """The relative L2 tolerance of a trial's outputs on a case of `dtype`: the spec's, else the dtype's."""
    return spec.tol if spec.tol is not None else TRIAL_TOL[dtype]


def case_inputs(case: Mapping[str, Any]) -> list[torch.Tensor]:
    """The op's differentiable inputs of a `make_case` case, in call order (q, k, v, g, beta)."""
    return [case[n] for n in INPUT_NAMES]


def tune_case(
    run: RunFn,
    *,
    device: torch.device | str,
    spec: TuneSpec = DEFAULTS,
    dtype: str = "bfloat16",
    known_bad: Mapping[str, Mapping[LaunchConfig, str]] | None = None,
    timer: Timer | None = None,
    on_result: OnResult | None = None,
    progress: TuneProgress | None = None,
) -> TuneResult:
    """Measure and decide, no store: tune every kernel `run` launches (or those in `spec.kernels`); see the module
    docstring. dtype: the case's (the trials' tolerance, `case_tol`). on_result: called with each kernel's result
    as soon as it is decided (`runners.tuner.result.OnResult`), the partial one of a device crash included.
    progress: told of each kernel's search and each trial (`runners.tuner.result.TuneProgress`). Configs that
    cannot launch for the kernel's key (BV > V, ...) are left out of its candidates before any budget is drawn.

    known_bad: {kernel: {config: error}} of configs that crashed the device elsewhere (a CUDA error poisons the
    process, so such configs are found in throwaway processes): recorded `failed` without launching.
    A device crash mid-search raises `TuningStopped` with the trials so far (the crashing one included).
    """
    timer = timer or make_timer(device)
    wanted = set(spec.kernels) if spec.kernels is not None else None
    # the first run imports the op's kernel modules (registering their specs) and compiles the defaults
    run(LaunchPlan())
    if wanted is not None and wanted - set(KERNELS):
        raise ValueError(f"kernels names unknown kernel(s) {sorted(wanted - set(KERNELS))}; registered: {sorted(KERNELS)}")
    defaults = {n: s.default for n, s in KERNELS.items()}
    seen = LaunchRecorder()
    reference = run(LaunchPlan(configs=defaults, recorder=seen))
    launched = {n: normalize_key(key) for n, (key, _cfg) in seen.items()}
    # the defaults as launched (a launcher may adapt a config to the shape, e.g. clamp BV to a small V)
    observed = {n: cfg for n, (_key, cfg) in seen.items()}
    if wanted is not None and wanted - set(launched):
        raise ValueError(f"kernel(s) {sorted(wanted - set(launched))} did not launch for this op/shape; launched: {sorted(launched)}")
    dev_name, cc = device_facts(device)
    bad = _known_bad(cc, launched, known_bad)
    # coordinate descent: each kernel is searched with the ones before it at their winners
    fixed = {n: defaults[n] for n in launched}
    out = TuneResult(device_name=dev_name, compute_capability=cc)
    for name in launched:
        if (wanted is not None and name not in wanted) or not get_spec(name).space:
            continue
        trials: list[Trial] = []
        ctx = TrialContext(spec=get_spec(name), key=launched[name], run=run, fixed=dict(fixed), reference=reference,
                           tol=case_tol(spec, dtype), timer=timer, strategy=spec.strategy,
                           record=functools.partial(_record, trials, progress), known_bad=dict(bad.get(name, {})),
                           default=observed[name])
        configs = candidates(ctx.spec, ctx.default, ctx.key)
        if progress is not None:
            progress.kernel_started(name, key_str(ctx.key), dropped=len(candidates(ctx.spec, ctx.default)) - len(configs),
                                    configs=len(configs) if spec.strategy == "exhaustive" else
                                    len(first_rung(ctx.spec, ctx.default, spec.budget, spec.seed, ctx.key)))
        try:
            res = search(spec.strategy, configs, functools.partial(_measure, ctx), budget=spec.budget,
                         seed=spec.seed, samples=spec.samples, min_samples=spec.min_samples,
                         max_samples=spec.max_samples, eta=spec.eta, pinned=pinned(ctx.spec, ctx.default, ctx.key))
        except Exception as err:  # a device crash ends the search: the trials so far go with it
            partial = out.extended([_decide(ctx, trials, None)] if trials else [])
            report_new(on_result, out, partial)
            partial.stop(err)
        done = out.extended([_decide(ctx, trials, res)])
        report_new(on_result, out, done)
        out = done
        if res.best is not None:
            fixed[name] = res.best.config
    return out


def _record(trials: list[Trial], progress: TuneProgress | None, trial: Trial) -> None:
    trials.append(trial)
    if progress is not None:
        progress.trial_done(trial)


def _measure(ctx: TrialContext, cfg: LaunchConfig, n: int, rung: int) -> Trial:
    return run_trial(ctx, cfg, n=n, rung=rung)


def _known_bad(cc: str | None, launched: Iterable[str],
               given: Mapping[str, Mapping[LaunchConfig, str]] | None) -> dict[str, dict[LaunchConfig, str]]:
    """Configs a rule says crash or miscompute on this device and compiler, merged with the caller's crashers."""
    bad: dict[str, dict[LaunchConfig, str]] = known_bad_configs(cc, kernels=launched)
    for n, cfgs in (given or {}).items():
        bad.setdefault(n, {}).update(cfgs)
    return bad


def _decide(ctx: TrialContext, trials: Sequence[Trial], res: SearchResult | None) -> KernelResult:
    """The kernel's result: its trials and, when the search found a correct config, the winner."""
    name, ks = ctx.spec.name, key_str(ctx.key)
    records = tuple(replace(t, config=t.config.as_dict(), samples=[]) for t in trials)  # the trials as stored
    base = KernelResult(kernel=name, key=dict(ctx.key), key_str=ks, source_hash=source_hash(name), trials=records)
    if res is None or res.best is None:
        if res is not None:
            logger.warning("tuner: no config of %s at %s was correct and timed; keeping the default", name, ks)
        return base
    default_ms = res.default.median_ms if res.default else None
    logger.info("tuner: %s at %s -> %s (%.4f ms; default %s ms)", name, ks, res.best.config.as_dict(),
                res.best.median_ms, f"{default_ms:.4f}" if default_ms is not None else "n/a")
    return replace(base, config=res.best.config.as_dict(), median_ms=res.best.median_ms, default_ms=default_ms,
                   runner_up_ms=res.runner_up.median_ms if res.runner_up else None)


def tune_kernels(
    *,
    op: str,
    shapes: Sequence[Shape | Mapping[str, Any]],
    spec: TuneSpec = DEFAULTS,
    device: torch.device | str | None = None,
    backend: str = "triton",
    group: Any = None,
    on_result: OnResult | None = None,
    progress: TuneProgress | None = None,
) -> TuneResult:
    """Tune the Triton kernels of `op` ("gdn" | "kda") at each shape, searching as `spec` says (module docstring).

    Args:
        shapes: `Shape`s or dicts with B, T, H, K, V, dtype, lengths, lb, initial_state, seed.
        spec: strategy, budget, samples, direction ("fwd+bwd": time forward + Triton backward, which tunes the
            backward kernels too, each on the whole step), kernels (default: every kernel the op launches).
        device: where to tune (default: "cuda" when available, else "cpu").
        group: process group whose rank 0 tunes and broadcasts (default: the world when torch.distributed is up).
        on_result: called on rank 0 with each kernel's result as soon as it is decided (`tune_case`).
        progress: told on rank 0 of each kernel's search and each trial (`tune_case`).
    A device crash raises `TuningStopped` with every shape's results so far.
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
    multi = dist_on and torch.distributed.get_world_size(group) > 1
    rank = torch.distributed.get_rank(group) if multi else 0
    result = _tune_shapes(op, shapes, spec, device, backend, on_result, progress) if rank == 0 else None
    if multi:
        payload: list[Any] = [result]
        src = torch.distributed.get_global_rank(group, 0) if group is not None else 0
        torch.distributed.broadcast_object_list(payload, src=src, group=group,
                                                device=device if device.type == "cuda" else None)
        result = payload[0]
    assert result is not None
    return result


def _tune_shapes(op: str, shapes: Sequence[Shape | Mapping[str, Any]], spec: TuneSpec, device: torch.device,
                 backend: str, on_result: OnResult | None, progress: TuneProgress | None = None) -> TuneResult:
    dev_name, cc = device_facts(device)
    out = TuneResult(device_name=dev_name, compute_capability=cc)
    for s in shapes:
        shape = Shape.of(s)
        case = make_case(op, shape, device)
        try:
            got = tune_case(op_runner(op, case, backend=backend, direction=spec.direction), device=device, spec=spec,
                            dtype=shape.dtype, on_result=on_result, progress=progress)
        except Exception as err:  # the shapes tuned before a device crash are kept
            out.stop(err)
        out = out.extended(got.kernels)
        del case
    return out


def tuned_table(rows: Sequence[TunedConfig], *, strict: bool = False) -> Any:
    """The table of `rows` (e.g. just tuned, or read back from the store) for a launch plan, or None without rows:
    `LaunchPlan(table=tuned_table(rows))` launches with them.

    The same table an exported file would give (runners.tuner.export).
    strict=False: rows of another device or a stale source hash are skipped with a warning.
    """
    from kernels.autotune import parse_autotune
    from runners.tuner.export import export_from_rows

    if not rows:
        return None
    return parse_autotune(export_from_rows(rows, allow_cpu=True), strict=strict)
