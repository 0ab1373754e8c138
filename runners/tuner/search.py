"""Search strategies over a kernel's declared space (`KernelSpec.space`): exhaustive, random, successive halving.

Each strategy takes the candidate configs (`candidates(spec)`: the default first, then the space in a
deterministic order) and `measure(cfg, n, rung) -> Trial` (runners.tuner.trials.run_trial bound to a context),
and returns a `SearchResult`. Only `ok` trials compete; invalid, disqualified and failed ones are kept as data.

- `exhaustive`: every candidate, `samples` samples each. Best = lowest median.
- `random_search`: the default (and the spec's hints: `pinned` leading candidates) plus `budget - pinned` other
  candidates drawn without replacement with `random.Random(seed)`, `samples` each. Best = lowest median among those measured.
- `successive_halving`: rung 0 measures every candidate with `min_samples`; each next rung keeps the best
  `ceil(len / eta)` (at least 2) and measures them afresh with `eta` times more samples (capped at
  `max_samples`), until 2 survive (3 with the pinned default) or the samples are capped; `budget` caps the rung-0 candidates (random
  draw, as random_search). Best = lowest median of the last rung, so the winner and the runner-up are
  compared with the most samples.

The default config is always measured and, in halving, always kept to the last rung, so `default_ms` is
measured like the winner and the winner is never worse than the default by more than noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernels.configs import KernelSpec, LaunchConfig
from runners.tuner.spec import STRATEGIES, TuneSpec
from runners.tuner.trials import Trial, static_invalid_reason

__all__ = ["STRATEGIES", "SearchResult", "candidates", "exhaustive", "first_rung", "pinned", "random_search", "search", "successive_halving"]

Measure = Callable[[LaunchConfig, int, int], Trial]
_D = TuneSpec()  # the defaults


@dataclass
class SearchResult:
    """Trials of one (kernel, key) search; best/runner-up/default are ok trials of the final comparison."""

    trials: list[Trial]
    best: Trial | None
    runner_up: Trial | None
    default: Trial | None


def candidates(spec: KernelSpec, default: LaunchConfig | None = None,
               key: Mapping[str, Any] | None = None) -> list[LaunchConfig]:
    """The default config first, then the spec's hints, then every config of the space (deduplicated,
    deterministic order). `pinned(spec, default, key)` of them lead: a budgeted draw always keeps those.

    default: the default as it actually launches, when the launcher adapts it to the shape (e.g. BV clamped
    to a small V); None = `spec.default`.
    key: the kernel's shape key; the configs that cannot launch for it (`trials.static_invalid_reason`, e.g.
    BV > V) are left out, so a budget is never spent on them (the default always stays: it launched).
    """
    default = default or spec.default
    out = [default]
    seen = {default}
    for cfg in (*spec.hints, *spec.configs()):
        if cfg not in seen and (key is None or static_invalid_reason(cfg, key) is None):
            seen.add(cfg)
            out.append(cfg)
    return out


def _finish(trials: list[Trial], final: Sequence[Trial], default_cfg: LaunchConfig) -> SearchResult:
    # an exact tie keeps the default (no change without evidence), then a deterministic order
    ok = sorted((t for t in final if t.status == "ok"),
                key=lambda t: (t.median_ms, t.config != default_cfg, repr(t.config.as_dict())))
    default = next((t for t in final if t.config == default_cfg and t.status == "ok"), None)
    return SearchResult(trials=trials, best=ok[0] if ok else None, runner_up=ok[1] if len(ok) > 1 else None, default=default)


def pinned(spec: KernelSpec, default: LaunchConfig | None = None, key: Mapping[str, Any] | None = None) -> int:
    """How many leading `candidates(spec, default, key)` a budgeted draw keeps: the default and the distinct hints
    (those that can launch for `key`)."""
    default = default or spec.default
    return 1 + len({h for h in spec.hints if h != default and (key is None or static_invalid_reason(h, key) is None)})


def first_rung(spec: KernelSpec, default: LaunchConfig | None, budget: int | None, seed: int,
               key: Mapping[str, Any] | None = None) -> list[LaunchConfig]:
    """The configs a budgeted search of `spec` measures first (random_search's all, halving's rung 0): the default,
    the hints, then a seeded draw of the rest up to `budget` (those that can launch for `key`)."""
    return _draw(candidates(spec, default, key), budget, seed, pinned(spec, default, key))


def _draw(configs: Sequence[LaunchConfig], budget: int | None, seed: int, pinned: int = 1) -> list[LaunchConfig]:
    if budget is None or budget >= len(configs):
        return list(configs)
    if budget < 1:
        raise ValueError(f"budget must be >= 1 (configs to measure), got budget={budget}")
    keep = max(1, min(pinned, budget))
    rest = random.Random(seed).sample(list(configs[keep:]), budget - keep)
    return [*configs[:keep], *rest]


def exhaustive(configs: Sequence[LaunchConfig], measure: Measure, *, samples: int) -> SearchResult:
    trials = [measure(c, samples, 0) for c in configs]
    return _finish(trials, trials, configs[0])


def random_search(configs: Sequence[LaunchConfig], measure: Measure, *, budget: int | None, seed: int, samples: int,
                  pinned: int = 1) -> SearchResult:
    trials = [measure(c, samples, 0) for c in _draw(configs, budget, seed, pinned)]
    return _finish(trials, trials, configs[0])


def successive_halving(
    configs: Sequence[LaunchConfig],
    measure: Measure,
    *,
    min_samples: int,
    max_samples: int,
    eta: int = _D.eta,
    budget: int | None = None,
    seed: int = _D.seed,
    pinned: int = 1,
) -> SearchResult:
    if eta < 2:
        raise ValueError(f"eta must be >= 2, got eta={eta}")
    default = configs[0]
    alive = _draw(configs, budget, seed, pinned)
    n, rung = min_samples, 0
    trials: list[Trial] = []
    while True:
        this = [measure(c, n, rung) for c in alive]
        trials.extend(this)
        ok = sorted((t for t in this if t.status == "ok" and t.median_ms is not None), key=lambda t: t.median_ms or 0.0)
        if len(ok) <= 2 or n >= max_samples:
            return _finish(trials, this, default)
        keep = max(2, math.ceil(len(ok) / eta))
        nxt = [t.config for t in ok[:keep]]
        if default not in nxt and any(t.config == default for t in ok):
            nxt.append(default)
        if len(nxt) >= len(ok):  # nothing left to eliminate (2 survivors plus the pinned default)
            return _finish(trials, this, default)
        alive, n, rung = nxt, min(max_samples, n * eta), rung + 1


def search(strategy: str, configs: Sequence[LaunchConfig], measure: Measure, *, budget: int | None = _D.budget,
           seed: int = _D.seed, samples: int = _D.samples, min_samples: int = _D.min_samples,
           max_samples: int = _D.max_samples, eta: int = _D.eta, pinned: int = 1) -> SearchResult:
    """Dispatch by name: "exhaustive" | "random" | "halving" (see the module docstring). pinned: the leading
    configs a budgeted draw always keeps (`pinned(spec)`: the default and the spec's hints)."""
    if strategy == "exhaustive":
        return exhaustive(configs, measure, samples=samples)
    if strategy == "random":
        return random_search(configs, measure, budget=budget, seed=seed, samples=samples, pinned=pinned)
    if strategy == "halving":
        return successive_halving(configs, measure, min_samples=min_samples, max_samples=max_samples, eta=eta,
                                  budget=budget, seed=seed, pinned=pinned)
    raise ValueError(f"strategy must be one of {STRATEGIES}, got strategy={strategy!r}")
