"""The tuner's entry: for an op and its shapes, search every Triton kernel the op launches, store trials and winners.

    rows = tune_kernels(session, op="gdn", shapes=[{"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128}],
                        strategy="halving", budget=None, sweep_id=None, device="cuda")

Per shape (`tune_case` for any callable that runs an op):
1. run the op once (imports and compiles), then once with every kernel at its default config: the outputs of
   that run are the correctness reference, and the recorder of its launch plan (`kernels.plan.LaunchRecorder`)
   tells which kernels launched with which shape keys (observed, not assumed);
2. for each launched kernel with a non-empty space, in launch order, search its space (runners.tuner.search)
   with the op's other kernels fixed at their best so far (coordinate descent: later kernels are tuned on top
   of the earlier winners, and their `default_ms` is measured that way too);
3. every trial is stored as a `TuningTrial`; the best `ok` trial per (kernel, key, device) is upserted as the
   `TunedConfig`, with the runner-up's and the default's medians and the kernel's source hash (through
   `db.crud.store_trial` / `db.crud.upsert_tuned_config`). The session is committed before the search, after
   each trial and after each kernel's winner (a long GPU search must not hold SQLite's write lock). Without a
   session nothing is stored: the winners come back as transient rows and each trial's fields go to `on_trial`
   (how a worker's rank process tunes while its parent stays the only writer: runners.tuner.sweep).

Multi-rank (`group`, or whenever torch.distributed is initialised): only rank 0 of the group tunes and
stores; the winners are broadcast (`broadcast_object_list`) and every rank returns the same configs, so all
ranks launch identically (the failure mode of per-rank autotuning: Megatron-LM#6966). Every rank launches with
them through a plan: `LaunchPlan(table=tuned_table(rows))`.

CPU tuning (wall clock) is allowed for tests; CPU rows are never exported (runners.tuner.export).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import torch

from kernels.autotune import key_str, normalize_key, source_hash
from kernels.configs import KERNELS, LaunchConfig, get_spec
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.tuner.clock import Timer, make_timer
from runners.tuner.miscompiles import known_bad as known_bad_configs
from runners.tuner.search import SearchResult, candidates, pinned, search
from runners.tuner.trials import RunFn, Trial, TrialContext, run_trial

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.models import TunedConfig

__all__ = ["Shape", "device_facts", "launched_configs", "make_case", "training_step", "tune_case", "tune_kernels",
           "tuned_table"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# relative L2 tolerance of a trial's outputs against the default config's: configs only reorder fp32
# accumulations, so honest configs agree to a few output ulps; a wrong config is off by O(1)
_TOL = {torch.float32: 2e-3, torch.bfloat16: 2e-2, torch.float16: 2e-2}


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
        if d.get("dtype", "bfloat16") not in _DTYPES:
            raise ValueError(f"shape dtype must be one of {sorted(_DTYPES)}, got dtype={d.get('dtype')!r}")
        return cls(**d)


def make_case(op: str, shape: Shape, device: torch.device | str) -> dict[str, Any]:
    """Seeded inputs for `kernels.forward` (FLA layout, never zeros; k L2-normalised, g = lb * sigmoid(x)); varlen
    bounds both on the device (`cu_seqlens`) and on the host (`cu_seqlens_cpu`), so no call reads them back."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(shape.seed)
    B, T, H, K, V = shape.B, shape.T, shape.H, shape.K, shape.V
    dt = _DTYPES[shape.dtype]

    def rnd(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen, device=dev)

    q = rnd(B, T, H, K).to(dt)
    k = torch.nn.functional.normalize(rnd(B, T, H, K), p=2, dim=-1).to(dt)
    v = rnd(B, T, H, V).to(dt)
    g = shape.lb * torch.sigmoid(rnd(B, T, H) if op == "gdn" else rnd(B, T, H, K))
    beta = torch.sigmoid(rnd(B, T, H)).to(dt)
    cu, bounds = None, None
    n_seq = B
    if shape.lengths is not None:
        bounds = [0]
        for n in shape.lengths:
            bounds.append(bounds[-1] + n)
        cu = torch.tensor(bounds, dtype=torch.int32, device=dev)
        n_seq = len(shape.lengths)
    h0 = rnd(n_seq, H, K, V) if shape.initial_state else None
    do = rnd(B, T, H, V).to(dt)  # the output gradient of a fwd+bwd run (drawn last: forward inputs unchanged)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu, "cu_seqlens_cpu": bounds,
            "initial_state": h0, "do": do}


_INPUTS = ("q", "k", "v", "g", "beta")  # the op's differentiable inputs, in call order


def op_runner(op: str, case: Mapping[str, Any], *, backend: str = "triton", direction: str = "fwd") -> RunFn:
    """A RunFn: `kernels.forward(op, ..., output_final_state=True, plan=plan)` -> (o, final_state).

    direction `"fwd+bwd"`: the training step, so the backward kernels are tuned on the whole step: `o.backward(do)`
    with the case's seeded `do` through the op's autograd Function (which hands the same plan to the backward
    kernels), fresh leaves each call -> (o, final_state, dq, dk, dv, dg, dbeta[, dh0 when the case has an initial
    state]).
    """
    import kernels
    from runners.spec import DIRECTIONS

    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'fwd' or 'fwd+bwd', got direction={direction!r}")

    def forward(plan: LaunchPlan, *xs: torch.Tensor,
                h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return kernels.forward(op, *xs, initial_state=h0, output_final_state=True, cu_seqlens=case["cu_seqlens"],
                               cu_seqlens_cpu=case.get("cu_seqlens_cpu"), backend=backend, plan=plan)

    def run(plan: LaunchPlan) -> tuple[torch.Tensor | None, ...]:
        return forward(plan, *(case[n] for n in _INPUTS), h0=case["initial_state"])

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
    xs = [case[n].detach().requires_grad_() for n in _INPUTS]
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


def tune_case(
    session: Session | None,
    *,
    run: RunFn,
    device: torch.device | str,
    kernels: Iterable[str] | None = None,
    strategy: str = "halving",
    budget: int | None = None,
    seed: int = 0,
    samples: int = 20,
    min_samples: int = 5,
    max_samples: int = 60,
    eta: int = 3,
    tol: float = 2e-2,
    sweep_id: int | None = None,
    environment_id: int | None = None,
    timer: Timer | None = None,
    known_bad: Mapping[str, Mapping[LaunchConfig, str]] | None = None,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[TunedConfig], dict[str, SearchResult]]:
    """Tune every kernel `run` launches (or those named in `kernels`); see the module docstring.

    known_bad: {kernel: {config: error}} of configs that crashed the device elsewhere (a CUDA error poisons the
    process, so such configs are found in throwaway processes): recorded `failed` without launching.
    on_trial: called with each trial's `store_trial` fields (plain data) as it ends, stored or not.
    Returns the upserted TunedConfig rows (transient objects when `session` is None) and each kernel's SearchResult.
    """
    from db.models import TunedConfig

    if session is not None:
        from db import crud  # (db.crud needs pydantic settings; a session-less run needs only SQLAlchemy)

        # end the caller's (read) transaction: on SQLite a read snapshot that another process (e.g. a worker's
        # heartbeat) overtakes can never become a write ("database is locked"); each trial commits on its own
        session.commit()
    dev_name, cc = device_facts(device)
    timer = timer or make_timer(device)
    wanted = set(kernels) if kernels is not None else None
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
    if wanted is not None:
        missing = wanted - set(launched)
        if missing:
            raise ValueError(f"kernel(s) {sorted(missing)} did not launch for this op/shape; launched: {sorted(launched)}")
    fixed = {n: defaults[n] for n in launched}
    # configs a rule says crash or miscompute on this device and compiler, merged with the caller's crashers
    bad: dict[str, dict[LaunchConfig, str]] = known_bad_configs(cc, kernels=launched)
    for n, cfgs in (known_bad or {}).items():
        bad.setdefault(n, {}).update(cfgs)
    rows: list[TunedConfig] = []
    results: dict[str, SearchResult] = {}
    for name in launched:
        spec = get_spec(name)
        if (wanted is not None and name not in wanted) or not spec.space:
            continue
        key = launched[name]
        ks = key_str(key)

        def record(t: Trial, _ks: str = ks) -> None:
            row = {"sweep_id": sweep_id, "environment_id": environment_id, "device_name": dev_name, "kernel": t.kernel,
                   "key": t.key, "key_str": _ks, "config": t.config.as_dict(), "strategy": t.strategy, "rung": t.rung,
                   "status": t.status, "median_ms": t.median_ms, "n": t.n, "error": t.error}
            if on_trial is not None:
                on_trial(row)
            if session is not None:
                crud.store_trial(session, **row)
                session.commit()  # never hold the store's write lock while the next config is measured

        ctx = TrialContext(spec=spec, key=key, run=run, fixed=dict(fixed), reference=reference, tol=tol, timer=timer,
                           strategy=strategy, record=record, known_bad=dict(bad.get(name, {})),
                           default=observed[name])
        try:
            res = search(strategy, candidates(spec, observed[name]), lambda c, n, r, _ctx=ctx: run_trial(_ctx, c, n=n, rung=r),
                         budget=budget, seed=seed, samples=samples, min_samples=min_samples, max_samples=max_samples, eta=eta,
                         pinned=pinned(spec, observed[name]))
        except Exception:
            # a device crash ends the search: keep the trials so far (the crashing one included) before it propagates
            if session is not None:
                session.commit()
            raise
        results[name] = res
        if res.best is None:
            logger.warning("tuner: no config of %s at %s was correct and timed; keeping the default", name, ks)
            if session is not None:
                session.commit()
            continue
        fixed[name] = res.best.config
        tuned = {"kernel": name, "key": key, "key_str": ks, "device_name": dev_name, "compute_capability": cc,
                 "config": res.best.config.as_dict(), "median_ms": res.best.median_ms,
                 "default_ms": res.default.median_ms if res.default else None,
                 "runner_up_ms": res.runner_up.median_ms if res.runner_up else None,
                 "source_hash": source_hash(name), "sweep_id": sweep_id, "environment_id": environment_id}
        if session is not None:
            rows.append(crud.upsert_tuned_config(session, **tuned))
            session.commit()
        else:
            rows.append(TunedConfig(**tuned, measured_at=datetime.now(timezone.utc)))
        logger.info("tuner: %s at %s -> %s (%.4f ms; default %s ms)", name, ks, res.best.config.as_dict(),
                    res.best.median_ms, f"{res.default.median_ms:.4f}" if res.default else "n/a")
    return rows, results


def tune_kernels(
    session: Session | None,
    *,
    op: str,
    shapes: Sequence[Shape | Mapping[str, Any]],
    strategy: str = "halving",
    budget: int | None = None,
    sweep_id: int | None = None,
    device: torch.device | str | None = None,
    kernels: Iterable[str] | None = None,
    backend: str = "triton",
    seed: int = 0,
    samples: int = 20,
    min_samples: int = 5,
    max_samples: int = 60,
    eta: int = 3,
    environment_id: int | None = None,
    group: Any = None,
    direction: str = "fwd",
) -> list[TunedConfig]:
    """Tune the Triton kernels of `op` ("gdn" | "kda") at each shape; returns the TunedConfig rows (see module docstring).

    Args:
        session: the store (None: nothing stored, transient rows returned; non-zero ranks may pass None).
        shapes: `Shape`s or dicts with B, T, H, K, V, dtype, lengths, lb, initial_state, seed.
        strategy: "exhaustive" | "random" | "halving"; budget: configs measured per kernel and key (random,
            halving's first rung); None = the whole space.
        device: where to tune (default: "cuda" when available, else "cpu").
        kernels: restrict to these kernel names (default: every kernel the op launches).
        group: process group whose rank 0 tunes and broadcasts (default: the world when torch.distributed is up).
        direction: "fwd" (time the forward) or "fwd+bwd" (time forward + Triton backward: tunes the backward
            kernels too, each on the whole step).
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    dist_on = torch.distributed.is_available() and torch.distributed.is_initialized()
    multi = dist_on and torch.distributed.get_world_size(group) > 1
    rank = torch.distributed.get_rank(group) if multi else 0
    rows: list[TunedConfig] = []
    if rank == 0:
        kern = list(kernels) if kernels is not None else None
        for s in shapes:
            shape = Shape.of(s)
            case = make_case(op, shape, device)
            tol = _TOL[_DTYPES[shape.dtype]]
            got, _ = tune_case(session, run=op_runner(op, case, backend=backend, direction=direction), device=device, kernels=kern,
                               strategy=strategy, budget=budget, seed=seed, samples=samples, min_samples=min_samples,
                               max_samples=max_samples, eta=eta, tol=tol, sweep_id=sweep_id, environment_id=environment_id)
            rows.extend(got)
            del case
    if multi:
        rows = _broadcast_rows(rows, rank=rank, group=group, device=device)
    return rows


_ROW_FIELDS = ("kernel", "key", "key_str", "device_name", "compute_capability", "config", "median_ms", "default_ms",
               "runner_up_ms", "source_hash", "sweep_id", "environment_id", "measured_at")


def _broadcast_rows(rows: list[TunedConfig], *, rank: int, group: Any, device: torch.device) -> list[TunedConfig]:
    from db.models import TunedConfig

    payload: list[Any] = [[{f: getattr(r, f) for f in _ROW_FIELDS} for r in rows] if rank == 0 else None]
    src = torch.distributed.get_global_rank(group, 0) if group is not None else 0
    torch.distributed.broadcast_object_list(payload, src=src, group=group,
                                            device=device if device.type == "cuda" else None)
    if rank == 0:
        return rows
    return [TunedConfig(**d) for d in payload[0]]


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
