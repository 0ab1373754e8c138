"""Pure statistics (runners.stats) on synthetic samples: equal to numpy's linear quantiles; IQR noise measure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runners.stats import quantile, rel_iqr, summarize


@pytest.mark.parametrize("n", [1, 2, 7, 200])
def test_summarize_matches_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    xs = list(rng.lognormal(mean=0.0, sigma=0.3, size=n))
    s = summarize(xs)
    assert s.n == n
    assert s.median == pytest.approx(float(np.quantile(xs, 0.5)), rel=1e-12)
    assert s.p10 == pytest.approx(float(np.quantile(xs, 0.1)), rel=1e-12)
    assert s.p90 == pytest.approx(float(np.quantile(xs, 0.9)), rel=1e-12)
    assert s.iqr == pytest.approx(float(np.quantile(xs, 0.75) - np.quantile(xs, 0.25)), abs=1e-12)
    assert s.mean == pytest.approx(float(np.mean(xs)), rel=1e-12)
    assert (s.min, s.max) == (min(xs), max(xs))


def test_summarize_known_values() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.min, s.max, s.mean, s.iqr) == (3.0, 1.0, 5.0, 3.0, 2.0)
    assert s.p10 == pytest.approx(1.4) and s.p90 == pytest.approx(4.6)


def test_summarize_rejects_empty_and_nan() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])
    with pytest.raises(ValueError, match="finite"):
        summarize([1.0, math.nan])


def test_rel_iqr() -> None:
    assert rel_iqr([1.0]) == math.inf
    assert rel_iqr([2.0] * 10) == 0.0
    assert rel_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)
    with pytest.raises(ValueError, match="q must be in"):
        quantile([1.0], 1.5)
