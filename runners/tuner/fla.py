"""`cpbench tune --backend fla`: tune FLA's autotuned kernels by timing FLA's WHOLE op, one pinned config at a time.

`tune_fla(op=, shapes=, spec=TuneSpec(...))` is the sibling strategy of `runners.tuner.tune.tune_kernels`: it
measures and decides without a store and returns the same `TuneResult` (the caller stores it). FLA autotunes each kernel alone on the first call's shape. Here, per shape:
1. FLA's op runs once with its own autotune (compiles; its picks fill the tuners' caches); the kernels it touched
   and the keys FLA keys them by are recorded (`runners.peers.fla_autotune.record_touched`), and its output is
   the correctness reference;
2. for each touched kernel and key, in call order, every config of its space (or `budget` of them, FLA's own
   pick always among them) is pinned in the tuner's cache and the whole op is run: outputs checked against the
   reference (relative L2 within the dtype's tolerance), then timed (`samples` samples, the tuner's clock);
   the other kernels stay pinned at their best so far (coordinate descent, starting from FLA's picks);
3. every trial is kept (stored as a `TuningTrial`, kernel `fla.<kernel_name>`, key `{"autotune_key": [...]}`),
   and the winner per (kernel, key) is decided, its `default_ms` FLA's own pick's time.
   FLA's own pick stays the winner unless a config runs the whole op at least `min_gain` (default 1 %) faster:
   one kernel's config moves the whole op's median by less than the trial-to-trial noise (0.3 % on the H200,
   `benchmarks/results/fla_config_cache_train_h200.md`), so a smaller "gain" is a coin toss, not a finding.

Direction `fwd+bwd` (`cpbench tune --backend fla --direction fwd+bwd`): the op timed is FLA's training step,
forward + `o.backward(do)` with fresh leaves each call, so the kernels touched (and tuned) include FLA's backward
kernels, and the reference compares every input gradient too. FLA's Hopper guard on the GDN backward (FLA #640,
Triton >= 3.4.0, < 3.7.1) refuses such a run with FLA's reason unless `options={"bypass_hopper_guard": True}`
(`--fla-bypass-hopper-guard`), which lifts it around each step as the `fla` peer does.

`cpbench configs export --format fla -o DIR` turns the winners into FLA's config-cache directory
(`runners.tuner.fla_export`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from runners.peers import fla_autotune as fa
from runners.tuner.clock import Timer, make_timer
from runners.tuner.result import FLA_PREFIX as PREFIX
from runners.tuner.result import KernelResult, OnResult, Trial, TuneResult, TuningStopped, report_new
from runners.tuner.spec import TuneSpec
from runners.tuner.trials import output_error
from runners.tuner.tune import Shape, case_inputs, case_tol, device_facts, make_case, training_step

__all__ = ["PREFIX", "check_direction", "fla_key_str", "tune_fla"]

logger = logging.getLogger(__name__)

DEFAULTS = TuneSpec()


def fla_key_str(key: Sequence[Any]) -> str:
    """The stored key string of an FLA autotune key (its JSON, as FLA serializes it)."""
    import json

    return json.dumps(list(key), separators=(",", ":"), sort_keys=True)


def _source_hash(tuner: Any) -> str:
    src = getattr(getattr(tuner, "base_fn", None) or tuner.fn, "src", None) or repr(tuner.fn)
    return "fla:" + hashlib.sha256(str(src).encode()).hexdigest()[:40]


def _fla_runner(op: str, case: Mapping[str, Any], direction: str = "fwd",
                options: Mapping[str, Any] | None = None) -> Callable[[], Any]:
    """FLA's op on the case: the forward -> (o, final_state); fwd+bwd: forward + `o.backward(case["do"])` with fresh
    leaves, inside the `fla` peer's step context (`options`: the Hopper-guard opt-in) -> (o, final_state, dq, dk,
    dv, dg, dbeta[, dh0])."""
    from kernels import backends
    from runners.peers.fla import FLA

    cu, bounds = case["cu_seqlens"], case["cu_seqlens_cpu"]
    scale = case["q"].shape[-1] ** -0.5

    def forward(*xs: torch.Tensor, h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return backends.fla_forward(op, *xs, scale=scale, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                    cu_seqlens_cpu=bounds)

    def run() -> tuple[torch.Tensor, torch.Tensor | None]:
        return forward(*case_inputs(case), h0=case["initial_state"])

    if direction == "fwd":
        return run

    def train() -> tuple[torch.Tensor | None, ...]:
        with FLA.step_context(dict(options or {})):
            return training_step(forward, case)

    return train


def check_direction(op: str, K: int, direction: str, options: Mapping[str, Any] | None) -> None:
    """A one-line ValueError when FLA cannot run `op` in `direction` here: an unknown direction, or FLA's own
    refusal (the `fla` peer's skip reason: its Hopper guard on the GDN backward unless opted out)."""
    from kernels.vocabulary import POINT_DIRECTIONS as DIRECTIONS
    from runners.peers.fla import FLA, hopper_guard_refusal
    from runners.point import PointSpec

    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    opts = dict(options or {})
    reason = (FLA.skip_reason(PointSpec(op, "none", "fla", B=1, T=1, H=1, K=K, V=K, backend_options=opts))
              or hopper_guard_refusal(op, direction, opts, "--fla-bypass-hopper-guard (cpbench tune)"))
    if reason:
        raise ValueError(reason)


MIN_GAIN = DEFAULTS.min_gain


def winner(results: Sequence[tuple[float, Any]], own: Any, own_ms: float | None,
           min_gain: float = MIN_GAIN) -> tuple[float, Any, float | None]:
    """(ms, config, runner-up ms) of the ok trials `results` [(median ms, config)]: the fastest, unless FLA's own
    pick `own` was measured (`own_ms`) and the fastest beats it by less than `min_gain` of its time."""
    ranked = sorted(results, key=lambda r: r[0])
    if own_ms is not None and ranked[0][1] is not own and ranked[0][0] > own_ms * (1.0 - min_gain):
        ranked = [(own_ms, own)] + [r for r in ranked if r[1] is not own]
    return ranked[0][0], ranked[0][1], ranked[1][0] if len(ranked) > 1 else None


def _trial(run: Callable[[], Any], reference: Any, tol: float, timer: Timer, samples: int) -> tuple[str, float | None, str | None]:
    """(status, median ms, error) of the op with the current pins."""
    try:
        got = run()
    except Exception as err:  # a config that cannot launch (resources, compile) is invalid, never fatal
        text = f"{type(err).__name__}: {err}"
        if "CUDA error" in text or "Triton Error [CUDA]" in text:
            raise
        return "invalid", None, text[:2000]
    error = output_error(reference, got)
    if error > tol:
        return "disqualified", None, f"relative L2 error {error:.3g} vs FLA's own picks > tol {tol:g}"
    ts = sorted(timer(run, samples))
    return "ok", ts[len(ts) // 2], None


def tune_fla(
    *,
    op: str,
    shapes: Sequence[Shape | Mapping[str, Any]],
    spec: TuneSpec = DEFAULTS,
    device: torch.device | str | None = None,
    options: Mapping[str, Any] | None = None,
    timer: Timer | None = None,
    on_result: OnResult | None = None,
) -> TuneResult:
    """Measure and decide, no store: tune FLA's kernels of `op` at each shape (module docstring).

    spec: budget, samples, seed, direction ("fwd" or "fwd+bwd", FLA's training step), kernels (with or without
    the `fla.` prefix), min_gain (how much faster than FLA's own pick, a fraction of its time, a config must run
    the op to replace it); options: the `fla` peer's (`bypass_hopper_guard`). A device crash raises
    `TuningStopped` with the trials so far. on_result: called with each kernel's result as soon as it is decided
    (`runners.tuner.result.OnResult`), the partial one of a device crash included."""
    from kernels.backends import fla_op

    if not 0.0 <= spec.min_gain < 0.5:
        raise ValueError(f"min_gain must be a fraction in [0, 0.5), got {spec.min_gain!r}")
    for s in shapes:
        check_direction(op, Shape.of(s).K, spec.direction, options)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        raise ValueError(f"tune --backend fla needs a CUDA GPU (FLA's autotuner and kernels run on one), got device={device}")
    dev_name, cc = device_facts(device)
    timer = timer or make_timer(device)
    fla_op(op)  # import FLA's op (a clear ImportError when FLA is missing)
    wanted = {n.removeprefix(PREFIX) for n in spec.kernels} if spec.kernels else None
    out = TuneResult(device_name=dev_name, compute_capability=cc)
    for s in shapes:
        shape = Shape.of(s)
        case = make_case(op, shape, device)
        run = _fla_runner(op, case, spec.direction, options)
        try:
            touched = fa.record_touched(run)  # FLA's own autotune on the first call
            reference = run()
        except Exception as err:  # the shapes tuned before a device crash are kept
            out.stop(err)
        measure = functools.partial(_trial, run, reference, case_tol(spec, shape.dtype), timer, spec.samples)
        for name, key, tuner in touched:  # the Autotuner that ran: names repeat across FLA's modules
            if wanted is None or name in wanted:
                try:
                    done = out.extended([_tune_touched(name, key, tuner, measure, spec, out)])
                except TuningStopped as stop:
                    report_new(on_result, out, stop.result)
                    raise
                report_new(on_result, out, done)
                out = done
        del case
    return out


def _candidates(tuner: Any, own: Any, spec: TuneSpec) -> list[Any]:
    """The configs measured: every config of the tuner, or `budget` of them drawn with `seed`, FLA's pick first."""
    configs = list(tuner.configs)
    if spec.budget is not None and spec.budget < len(configs):
        rest = [c for c in configs if c is not own]
        configs = ([own] if own is not None else []) + random.Random(spec.seed).sample(rest, spec.budget - (own is not None))
    return configs


def _tune_touched(name: str, key: Sequence[Any], tuner: Any, measure: Callable[[], tuple[str, float | None, str | None]],
                  spec: TuneSpec, so_far: TuneResult) -> KernelResult:
    """Pin each candidate config of one touched kernel and key, measure the whole op, decide (FLA's pick stays
    unless beaten by `spec.min_gain`); the kernel is left pinned at the winner."""
    own = tuner.cache.get(tuple(key))
    results: list[tuple[float, Any]] = []
    trials: list[Trial[dict[str, Any]]] = []
    own_ms = None
    ks = fla_key_str(key)
    base = KernelResult(kernel=PREFIX + name, key={"autotune_key": list(key)}, key_str=ks,
                        source_hash=_source_hash(tuner), trials=())
    for cfg in _candidates(tuner, own, spec):
        fa.pin(tuner, key, cfg)
        try:
            status, ms, error = measure()
        except Exception as err:  # a device crash: the trials so far go with it
            so_far.extended([replace(base, trials=tuple(trials))] if trials else []).stop(err)
        trials.append(Trial(kernel=base.kernel, key=base.key, config=fa.config_dict(cfg), rung=0, status=status,
                            strategy="exhaustive" if spec.budget is None else "random", median_ms=ms,
                            n=spec.samples if ms is not None else 0, error=error))
        if status == "ok" and ms is not None:
            results.append((ms, cfg))
            own_ms = ms if cfg is own else own_ms
    base = replace(base, trials=tuple(trials))
    if not results:
        logger.warning("fla tuner: no config of %s at %s ran correctly; keeping FLA's pick", name, ks)
        if own is not None:
            fa.pin(tuner, key, own)
        return base
    best_ms, best, runner_up_ms = winner(results, own, own_ms, spec.min_gain)
    fa.pin(tuner, key, best)
    logger.info("fla tuner: %s at %s -> %s (%.4f ms; FLA's pick %s ms)", name, ks, fa.config_dict(best), best_ms,
                f"{own_ms:.4f}" if own_ms is not None else "n/a")
    return replace(base, config=fa.config_dict(best), median_ms=best_ms, default_ms=own_ms, runner_up_ms=runner_up_ms)
