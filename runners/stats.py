"""Pure summaries of timing samples (stdlib only, no I/O): median, p10, p90, IQR, mean, min, max, n.

Quantiles use linear interpolation between order statistics (numpy's default "linear" method), so a summary
here equals `numpy.quantile` of the same samples. `rel_iqr` is the noise measure of the stop rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Summary", "quantile", "rel_iqr", "summarize"]


@dataclass(frozen=True)
class Summary:
    """Summary of one point's samples (milliseconds)."""

    median: float
    p10: float
    p90: float
    iqr: float
    mean: float
    min: float
    max: float
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        """The measurement row's summary fields: `median_ms`, `p10_ms`, ... and `n` (`db.crud.store_measurement`)."""
        return {f"{k}_ms" if k != "n" else k: v for k, v in self.as_dict().items()}


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of already sorted values, linear interpolation between order statistics."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got q={q!r}")
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return float(sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac)


def summarize(samples: Sequence[float]) -> Summary:
    """Median, p10, p90, IQR (p75 - p25), mean, min, max and count of `samples`."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("summarize needs at least one sample, got samples=[]")
    if any(not math.isfinite(x) for x in xs):
        raise ValueError(f"samples must be finite, got {[x for x in xs if not math.isfinite(x)][:3]}")
    return Summary(
        median=quantile(xs, 0.5),
        p10=quantile(xs, 0.1),
        p90=quantile(xs, 0.9),
        iqr=quantile(xs, 0.75) - quantile(xs, 0.25),
        mean=math.fsum(xs) / len(xs),
        min=xs[0],
        max=xs[-1],
        n=len(xs),
    )


def rel_iqr(samples: Sequence[float]) -> float:
    """IQR over median: the stop rule's noise measure (inf for fewer than 2 samples or a zero median)."""
    if len(samples) < 2:
        return math.inf
    xs = sorted(samples)
    med = quantile(xs, 0.5)
    if med <= 0:
        return math.inf
    return (quantile(xs, 0.75) - quantile(xs, 0.25)) / med
