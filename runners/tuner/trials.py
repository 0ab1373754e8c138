"""One tuning trial: a config of one kernel is checked for validity, run, checked for correctness, then timed.

Outcomes (db.models.TRIAL_STATUSES):
- `invalid`: the config cannot launch for this key: rejected before launching (BV > V, BK > K; never the
  default, which the reference run launched), or the launch
  raised a resource/compile/argument error (triton OutOfResources, CompilationError, a ValueError of the
  launcher). Recorded with the reason; never crashes the search.
- `disqualified`: it ran, but its outputs differ from the default config's outputs by more than the tolerance
  (relative L2), or are not finite, or the kernel did not launch with the trial config (observed through the
  `LaunchRecorder` of the trial's launch plan, never assumed). A wrong config can never win.
- `failed`: any other error (the text is kept).
- `ok`: correct, then timed: `n` samples, median kept.

Every trial goes through `record` (the tuner stores it as a `TuningTrial` row).
"""

from __future__ import annotations

import logging
import statistics
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from kernels.configs import KernelSpec, LaunchConfig
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.correctness import rel_l2
from runners.tuner.clock import Timer
from runners.tuner.result import Trial

__all__ = ["Trial", "TrialContext", "output_error", "run_trial", "static_invalid_reason"]

logger = logging.getLogger(__name__)

Outputs = Sequence[Tensor | None]
# runs the op once with a launch plan (explicit configs {kernel name: config}, a recorder) and returns its outputs
RunFn = Callable[[LaunchPlan], Outputs]


@dataclass
class TrialContext:
    """Everything a trial of `kernel` needs: how to run the op, what is correct, how to time, where to record."""

    spec: KernelSpec
    key: dict[str, Any]
    run: RunFn
    fixed: dict[str, LaunchConfig]  # the configs of the op's other kernels during this kernel's search
    reference: Outputs  # outputs with every kernel at its default config
    tol: float  # relative L2 tolerance against `reference`
    timer: Timer
    strategy: str
    record: Callable[[Trial[LaunchConfig]], None] | None = None
    # configs known to crash the device (found in a separate process): recorded `failed`, never launched here
    known_bad: Mapping[LaunchConfig, str] = field(default_factory=dict)
    # the default as it launched in the reference run: known to launch, so never rejected by the static check
    default: LaunchConfig | None = None


def static_invalid_reason(cfg: LaunchConfig, key: Mapping[str, Any]) -> str | None:
    """Why `cfg` cannot launch for `key` without trying it (tiles wider than the head dims), or None."""
    for blk, dim in (("BV", "V"), ("BK", "K")):
        b, n = getattr(cfg, blk), key.get(dim)
        if b is not None and isinstance(n, int) and not isinstance(n, bool) and b > n:
            return f"{blk}={b} > {dim}={n}"
    return None


def output_error(reference: Outputs, got: Outputs) -> float:
    """Largest relative L2 error over the outputs (`runners.correctness.rel_l2`; inf when a shape differs or a
    value is not finite)."""
    worst = 0.0
    for r, x in zip(reference, got, strict=True):
        if r is None and x is None:
            continue
        if r is None or x is None or r.shape != x.shape:
            return float("inf")
        worst = max(worst, rel_l2(x, r))
    return worst


def _is_invalid_launch(err: BaseException) -> bool:
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime import errors as rt_errors
    except ImportError:  # pragma: no cover - triton is a dependency of the triton backend
        return isinstance(err, ValueError)
    # under TRITON_INTERPRET=1, what would fail to compile on a GPU (e.g. a non-power-of-2 tl.arange) is an InterpreterError
    kinds = (rt_errors.OutOfResources, CompilationError, ValueError, getattr(rt_errors, "InterpreterError", ValueError))
    return isinstance(err, kinds)


def is_device_crash(err: BaseException) -> bool:
    """A CUDA error poisons the context: later trials would fail too, so the search stops.

    torch raises `torch.AcceleratorError` ("CUDA error: ..."); a Triton launch raises a RuntimeError
    ("Triton Error [CUDA]: an illegal memory access was encountered"): both end the search.
    """
    text = str(err)
    return isinstance(err, RuntimeError) and ("CUDA error" in text or "Triton Error [CUDA]" in text)


def run_trial(ctx: TrialContext, cfg: LaunchConfig, *, n: int, rung: int = 0) -> Trial[LaunchConfig]:
    """Check, run, verify and time one config (see the module docstring); records and returns the trial."""
    name = ctx.spec.name
    trial = Trial(kernel=name, key=dict(ctx.key), config=cfg, strategy=ctx.strategy, rung=rung, status="ok")
    seen = LaunchRecorder()
    plan = LaunchPlan(configs={**ctx.fixed, name: cfg}, recorder=seen)
    fatal: BaseException | None = None
    reason = static_invalid_reason(cfg, ctx.key) if cfg != ctx.default else None
    if reason is not None:
        trial.status, trial.error = "invalid", reason
    elif cfg in ctx.known_bad:
        trial.status, trial.error = "failed", ctx.known_bad[cfg]
    else:
        try:
            got = ctx.run(plan)
            launched = seen.get(name)
            err = output_error(ctx.reference, got)
            if launched is None or launched[1] != cfg:
                trial.status = "disqualified"
                trial.error = f"kernel {name} did not launch with the trial config (launched: {launched[1] if launched else None})"
            elif not err <= ctx.tol:
                trial.status, trial.error = "disqualified", f"relative L2 error {err:.3e} > tol {ctx.tol:.1e} vs the default config"
            else:
                trial.samples = ctx.timer(lambda: ctx.run(plan), n)
                trial.n = len(trial.samples)
                trial.median_ms = statistics.median(trial.samples)
        except Exception as e:  # noqa: BLE001 - every failure is data
            if _is_invalid_launch(e):
                trial.status = "invalid"
            else:
                trial.status = "failed"
                fatal = e if is_device_crash(e) else None
            trial.error = f"{type(e).__name__}: {e}"[:2000]
            logger.debug("trial %s %s: %s", name, cfg, traceback.format_exc())
    logger.info("trial %s %s rung %d: %s %s", name, cfg.as_dict(), rung, trial.status,
                f"{trial.median_ms:.4f} ms" if trial.median_ms is not None else trial.error)
    if ctx.record is not None:
        ctx.record(trial)
    if fatal is not None:
        raise fatal
    return trial
