"""How the tuner searches: `TuneSpec`, the one place of its defaults (torch-free; `runners.spec` reads it).

    spec = TuneSpec(strategy="random", budget=8, samples=10)           # or TuneSpec.of(sweep_spec["tuning"])
    result = tune_kernels(op="gdn", shapes=[...], spec=spec)            # runners.tuner.tune / .fla measure with it

`cpbench tune`'s options, a sweep spec's `tuning` block (`runners.spec.TuningSpec`), the worker's tune job and the
search functions (`runners.tuner.search`) take their defaults from `TuneSpec()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

__all__ = ["STRATEGIES", "Strategy", "TuneSpec"]

Strategy = Literal["exhaustive", "random", "halving"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)


@dataclass(frozen=True)
class TuneSpec:
    """A tuning run's search options, every default filled in (FLA's tuner measures every config of a kernel, or
    `budget` of them drawn with `seed`, FLA's own pick always among them; it uses no `strategy`)."""

    strategy: Strategy = "halving"  # exhaustive | random | halving (runners.tuner.search)
    budget: int | None = None  # configs measured per kernel and key (random; halving's first rung); None: all
    seed: int = 0  # of the random draws
    samples: int = 20  # per config (exhaustive, random, FLA)
    min_samples: int = 5  # halving: per config on the first rung,
    max_samples: int = 60  # ... at most on the later ones,
    eta: int = 3  # ... which keep the best 1/eta with eta times the samples
    direction: str = "fwd"  # fwd | fwd+bwd (the training step: the backward's kernels are tuned too)
    kernels: tuple[str, ...] | None = None  # tune only these kernel names (None: every kernel the op launches)
    # relative L2 tolerance of a trial's outputs against the defaults' (None: the case dtype's, tune.case_tol)
    tol: float | None = None
    # FLA only: how much faster than FLA's own pick (a fraction of its time) a config must run the whole op to
    # replace it; smaller gains are within the trial noise
    min_gain: float = 0.01

    @classmethod
    def of(cls, options: Mapping[str, Any] | None = None, **changes: Any) -> TuneSpec:
        """A TuneSpec from a mapping of its fields (e.g. a stored sweep spec's `tuning` block) plus `changes`."""
        names = {f.name for f in fields(cls)}
        given = {**dict(options or {}), **changes}
        unknown = sorted(set(given) - names)
        if unknown:
            raise ValueError(f"unknown tuning option(s) {unknown}; expected a subset of {sorted(names)}")
        if given.get("kernels") is not None:
            given["kernels"] = tuple(given["kernels"])
        return replace(cls(), **given)
