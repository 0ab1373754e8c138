"""Regression verdicts, pure: baseline runs vs new runs of each benchmark key -> SLOW / FAST / SAME / INCONCLUSIVE,
plus exact comparison of the deterministic signals (collective counts, host syncs, chosen configs) -> CHANGED.

The method is ../shared/anchors/bench-services.md (d), Level 1 and Level 2:

- The replicate is a *run* (one sweep of the suite), summarised by the median of its samples. Work in log space,
  `y = ln(median_ms)`: latency effects are multiplicative. A run whose IQR/median exceeds 2% is flagged noisy.
- Effect: the Hodges–Lehmann shift `Δ = median_{i,j}(y_new,i - y_base,j)`; the relative change is `e^Δ - 1`. Its
  distribution-free confidence interval (Moses) comes from the exact null distribution of Mann–Whitney U.
- Practical threshold `δ = max(1%, 3·σ̂)`, `σ̂ = 1.4826·MAD` of the baseline's log run-medians (both sides, each
  centred on its own median, when the baseline has fewer than 3 runs). **ours:** a key whose δ exceeds
  `max_effect` (10%) is flagged too noisy, and SAME never uses a margin wider than `max_effect`.
- Tests: Welch t on the log run-medians (primary), exact Mann–Whitney U as the check (must agree in sign with
  p < 0.05); Benjamini–Hochberg across all tested keys of one decision.
- Verdict: SLOW if `q < alpha`, `Δ > ln(1+δ)` and Mann–Whitney agrees; FAST the mirror; SAME if the 90% CI of Δ
  lies inside `(-ln(1+δ), ln(1+δ))` (TOST equivalence); otherwise INCONCLUSIVE, which the caller reruns with
  fresh runs (k doubled, at most twice) and then reports without failing.
- Screen stage (stage A): with only a couple of runs per side a key is SAME when `|Δ| < ln(1+δ)/2` and no run is
  noisy; every other key goes on to the confirm stage with fresh runs (screen data is not reused).
- Headline: the geometric mean of `e^Δ` over keys with a bootstrap CI over keys.

Deterministic signals are compared exactly and reported apart from the timing verdict: a key whose signals differ
carries `changes`, and a key `fails` when it is SLOW or has changes.

Only the standard library, numpy and scipy; no I/O. `runners/baseline.py` turns stored results into `Run`s;
`runners/report.py` writes the reports; `runners/regress_workflow.py` drives the rounds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "DETERMINISTIC_FIELDS",
    "VERDICTS",
    "Change",
    "KeyVerdict",
    "Policy",
    "Run",
    "benjamini_hochberg",
    "compare_deterministic",
    "decide",
    "geomean_ratio",
    "hodges_lehmann",
    "summarize_run",
]

VERDICTS = ("SLOW", "FAST", "SAME", "INCONCLUSIVE")
CHANGED = "CHANGED"
# signals that must not change between two runs of the same code on the same key; missing or None means "not recorded"
DETERMINISTIC_FIELDS = ("status", "collectives", "collective_bytes", "host_syncs", "configs")
# count dicts: an absent entry means zero, so {} and {"send": 0} are the same
_COUNT_FIELDS = frozenset({"collectives", "collective_bytes", "sync_events"})
_MAD_SCALE = 1.4826  # MAD -> sigma for a normal distribution
_EXACT_U_MAX = 60  # m + n up to which the null distribution of U is counted exactly (else normal approximation)

Stage = Literal["screen", "confirm"]


@dataclass(frozen=True)
class Policy:
    """The knobs of the verdict, with the defaults of bench-services.md (d)."""

    alpha: float = 0.05  # Benjamini–Hochberg level (q) across keys
    mw_alpha: float = 0.05  # Mann–Whitney must agree at this p
    min_effect: float = 0.01  # floor of the practical threshold δ (relative)
    noise_k: float = 3.0  # δ = max(min_effect, noise_k * σ̂)
    max_effect: float = 0.10  # ours: cap on δ; noise asking for more makes the key "too noisy"
    ci_level: float = 0.90  # confidence of the Hodges–Lehmann interval used for SAME (TOST at 5% per side)
    noisy_rel_iqr: float = 0.02  # a run with IQR/median above this is noisy
    min_runs: int = 2  # per side, for the confirm stage's tests

    def __post_init__(self) -> None:
        for name in ("alpha", "mw_alpha", "ci_level"):
            v = getattr(self, name)
            if not 0.0 < v < 1.0:
                raise ValueError(f"Policy.{name} must lie in (0, 1), got {v!r}")
        if not 0.0 < self.min_effect <= self.max_effect:
            raise ValueError(f"Policy needs 0 < min_effect <= max_effect, got min_effect={self.min_effect!r}, "
                             f"max_effect={self.max_effect!r}")
        if self.min_runs < 2:
            raise ValueError(f"Policy.min_runs must be >= 2 (a variance needs two runs), got {self.min_runs!r}")


@dataclass(frozen=True)
class Run:
    """One run of one key: the median of its samples, their IQR/median, and its deterministic signals.

    median_ms is None when the point did not produce a timing (failed or skipped); `signals["status"]` says why.
    """

    median_ms: float | None
    rel_iqr: float | None = None
    n: int | None = None
    signals: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    """One deterministic signal that differs: `field` is e.g. "collectives.all_gather" or "configs.chunk_state_fwd"."""

    field: str
    base: Any
    new: Any


@dataclass(frozen=True)
class KeyVerdict:
    """The verdict on one key. Logs are natural logs of milliseconds; `threshold` is δ as a fraction."""

    key: str
    verdict: str  # one of VERDICTS (timing)
    reason: str
    stage: Stage
    n_base: int
    n_new: int
    base_median_ms: float | None = None  # median of the run medians
    new_median_ms: float | None = None
    effect_log: float | None = None  # Hodges–Lehmann Δ
    ci_log: tuple[float, float] | None = None
    ci_coverage: float | None = None  # achieved coverage of ci_log (exact intervals are discrete)
    threshold: float | None = None
    p_welch: float | None = None
    p_mannwhitney: float | None = None
    q_value: float | None = None
    noisy_base: int = 0
    noisy_new: int = 0
    too_noisy: bool = False
    rerun: bool = False  # fresh runs could settle it (INCONCLUSIVE limited by the new side, not the baseline)
    changes: tuple[Change, ...] = ()

    @property
    def ratio(self) -> float | None:
        """new / base median of run medians."""
        if self.base_median_ms and self.new_median_ms is not None:
            return self.new_median_ms / self.base_median_ms
        return None

    @property
    def effect(self) -> float | None:
        """Relative change `e^Δ - 1` (0.10 = 10% slower)."""
        return None if self.effect_log is None else math.expm1(self.effect_log)

    @property
    def status(self) -> str:
        """CHANGED when a deterministic signal differs, else the timing verdict."""
        return CHANGED if self.changes else self.verdict

    @property
    def failed(self) -> bool:
        """A confirmed SLOW or a changed deterministic signal fails the regression run."""
        return self.verdict == "SLOW" or bool(self.changes)

    def as_detail(self) -> dict[str, Any]:
        """JSON-ready summary (the `detail` of a stored RegressionResult)."""
        return {
            "timing_verdict": self.verdict,
            "reason": self.reason,
            "stage": self.stage,
            "n_base": self.n_base,
            "n_new": self.n_new,
            "base_median_ms": self.base_median_ms,
            "new_median_ms": self.new_median_ms,
            "ci_log": list(self.ci_log) if self.ci_log else None,
            "ci_coverage": self.ci_coverage,
            "threshold": self.threshold,
            "noisy_base": self.noisy_base,
            "noisy_new": self.noisy_new,
            "too_noisy": self.too_noisy,
            "changes": [{"field": c.field, "base": c.base, "new": c.new} for c in self.changes],
        }


def summarize_run(samples_ms: Sequence[float], *, signals: Mapping[str, Any] | None = None) -> Run:
    """Collapse one run's samples to its median and IQR/median (bench-services.md (d), Level 1)."""
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("summarize_run needs at least one sample, got samples_ms=[]")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"samples_ms must be finite and positive, got min={a.min()!r}, max={a.max()!r}")
    med = float(np.median(a))
    q25, q75 = np.percentile(a, [25, 75])
    return Run(median_ms=med, rel_iqr=float((q75 - q25) / med), n=int(a.size), signals=dict(signals or {}))


def hodges_lehmann(base_log: Sequence[float] | np.ndarray, new_log: Sequence[float] | np.ndarray, *,
                   level: float = 0.90) -> tuple[float, tuple[float, float] | None, float | None]:
    """Hodges–Lehmann shift of `new` over `base` and its Moses confidence interval.

    Returns (Δ, (lo, hi) or None, achieved coverage or None). The interval is [D_(k), D_(mn+1-k)] over the sorted
    pairwise differences, with k the largest index whose exact two-sided coverage is still >= level; it is None
    when even the full range of differences cannot reach `level` (too few runs).
    """
    b = np.asarray(base_log, dtype=np.float64)
    a = np.asarray(new_log, dtype=np.float64)
    if b.size == 0 or a.size == 0:
        raise ValueError(f"hodges_lehmann needs runs on both sides, got len(base_log)={b.size}, len(new_log)={a.size}")
    d = np.sort((a[:, None] - b[None, :]).ravel())
    delta = float(np.median(d))
    k = _moses_k(a.size, b.size, level)
    if k is None:
        return delta, None, None
    lo, hi = float(d[k - 1]), float(d[d.size - k])
    coverage = 1.0 - 2.0 * _u_cdf(a.size, b.size, k - 1)
    return delta, (lo, hi), coverage


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (q-values); None entries are not tested and stay None."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    if not idx:
        return out
    p = np.asarray([pvalues[i] for i in idx], dtype=np.float64)
    if np.any((p < 0) | (p > 1) | ~np.isfinite(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()!r}")
    m = p.size
    order = np.argsort(p, kind="stable")
    ranked = p[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
    for j, o in enumerate(order):
        out[idx[o]] = float(q[j])
    return out


def compare_deterministic(base: Mapping[str, Any], new: Mapping[str, Any], *,
                          fields: Iterable[str] = DETERMINISTIC_FIELDS) -> list[Change]:
    """Exact comparison of two runs' deterministic signals.

    A field missing or None on either side was not recorded and is not compared. Dict fields are compared entry
    by entry ("collectives.all_gather"); in count dicts (collectives, collective_bytes) an absent entry is zero.
    """
    changes: list[Change] = []
    for name in fields:
        b, n = base.get(name), new.get(name)
        if b is None or n is None:
            continue
        if isinstance(b, Mapping) and isinstance(n, Mapping):
            absent = 0 if name in _COUNT_FIELDS else None
            if name in _COUNT_FIELDS:
                b = {k: v for k, v in b.items() if v}
                n = {k: v for k, v in n.items() if v}
            for sub in sorted(set(b) | set(n), key=str):
                if _canon(b.get(sub, absent)) != _canon(n.get(sub, absent)):
                    changes.append(Change(f"{name}.{sub}", b.get(sub, absent), n.get(sub, absent)))
        elif _canon(b) != _canon(n):
            changes.append(Change(name, b, n))
    return changes


def decide(base: Mapping[str, Sequence[Run]], new: Mapping[str, Sequence[Run]], *,
           policy: Policy | None = None, stage: Stage = "confirm") -> tuple[list[KeyVerdict], list[str]]:
    """Verdict for every key of `new` that the baseline has, and the keys worth rerunning (INCONCLUSIVE).

    `base` and `new` map a benchmark key to its runs. Keys only in `new` have no baseline and are left out (the
    caller reports them); keys only in `base` are CHANGED (status "missing"). Benjamini–Hochberg runs across the
    keys tested in this call. `stage="screen"` applies the stage-A rule (SAME or go on to confirm).
    """
    pol = policy or Policy()
    if stage not in ("screen", "confirm"):
        raise ValueError(f"stage must be 'screen' or 'confirm', got {stage!r}")
    partial = []
    for key in sorted(base):
        runs_b = list(base[key])
        runs_n = list(new.get(key, ()))
        partial.append(_analyse(key, runs_b, runs_n, pol, stage))
    qs = benjamini_hochberg([p.get("p_welch") for p in partial])
    verdicts = [_verdict(p, q, pol, stage) for p, q in zip(partial, qs, strict=True)]
    rerun = [v.key for v in verdicts if v.verdict == "INCONCLUSIVE" and v.rerun]
    return verdicts, rerun


def geomean_ratio(verdicts: Sequence[KeyVerdict], *, level: float = 0.95, n_boot: int = 2000,
                  seed: int = 0) -> tuple[float, tuple[float, float]] | None:
    """Headline of a regression run: geometric mean of `e^Δ` over keys, with a bootstrap CI over keys."""
    d = np.asarray([v.effect_log for v in verdicts if v.effect_log is not None], dtype=np.float64)
    if d.size == 0:
        return None
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return float(np.exp(d.mean())), (float(np.exp(lo)), float(np.exp(hi)))


def _analyse(key: str, runs_b: list[Run], runs_n: list[Run], pol: Policy, stage: Stage) -> dict[str, Any]:
    """Everything about one key except the cross-key correction."""
    changes = _key_changes(runs_b, runs_n)
    yb = _logs(runs_b, "base", key)
    yn = _logs(runs_n, "new", key)
    out: dict[str, Any] = {
        "key": key, "changes": tuple(changes), "n_base": yb.size, "n_new": yn.size,
        "noisy_base": _n_noisy(runs_b, pol), "noisy_new": _n_noisy(runs_n, pol),
    }
    if yb.size == 0 or yn.size == 0:
        side = "either side" if yb.size == 0 and yn.size == 0 else "the baseline" if yb.size == 0 else "the new side"
        out["reason"] = f"no timing on {side} (baseline: {_statuses(runs_b)}; new: {_statuses(runs_n)})"
        # a new side that failed outright is a deterministic change; more runs of it will not settle the timing
        out["rerun"] = yb.size > 0 and not changes
        return out
    out["base_median_ms"] = float(np.exp(np.median(yb)))
    out["new_median_ms"] = float(np.exp(np.median(yn)))
    sigma = _noise_sigma(yb, yn)
    raw = max(pol.min_effect, pol.noise_k * sigma)
    out["too_noisy"] = raw > pol.max_effect
    out["threshold"] = raw
    delta, ci, cov = hodges_lehmann(yb, yn, level=pol.ci_level)
    out.update(effect_log=delta, ci_log=ci, ci_coverage=cov)
    if yb.size >= pol.min_runs and yn.size >= pol.min_runs:
        out["p_welch"] = _welch(yb, yn)
        out["p_mannwhitney"], out["mw_sign"] = _mannwhitney(yb, yn)
    return out


def _verdict(a: dict[str, Any], q: float | None, pol: Policy, stage: Stage) -> KeyVerdict:
    common = {k: a[k] for k in ("key", "n_base", "n_new", "noisy_base", "noisy_new", "changes")}
    for k in ("base_median_ms", "new_median_ms", "effect_log", "ci_log", "ci_coverage", "threshold", "p_welch",
              "p_mannwhitney", "too_noisy"):
        if k in a:
            common[k] = a[k]
    common["q_value"] = q
    if "effect_log" not in a:
        return KeyVerdict(verdict="INCONCLUSIVE", reason=a["reason"], stage=stage, rerun=a.get("rerun", False), **common)
    delta, thr = a["effect_log"], math.log1p(a["threshold"])
    pct = f"{math.expm1(delta):+.1%}"
    if stage == "screen":
        clean = a["noisy_base"] == 0 and a["noisy_new"] == 0 and not a["too_noisy"]
        if abs(delta) < thr / 2 and clean:
            return KeyVerdict(verdict="SAME", reason=f"screen: {pct} within half the threshold", stage=stage, **common)
        why = "noisy runs" if not clean else f"{pct} not within half the threshold {a['threshold']:.1%}"
        return KeyVerdict(verdict="INCONCLUSIVE", reason=f"screen flagged it ({why}); confirm with fresh runs",
                          stage=stage, rerun=True, **common)
    if "p_welch" not in a:
        short_new = a["n_new"] < pol.min_runs
        return KeyVerdict(verdict="INCONCLUSIVE", stage=stage, rerun=short_new,
                          reason=f"too few runs to test (base {a['n_base']}, new {a['n_new']}; need {pol.min_runs} each)",
                          **common)
    p_mw, sign = a["p_mannwhitney"], a["mw_sign"]
    if q is not None and q < pol.alpha and abs(delta) > thr and p_mw < pol.mw_alpha and sign == np.sign(delta):
        verdict = "SLOW" if delta > 0 else "FAST"
        return KeyVerdict(verdict=verdict, reason=f"{pct} beyond the {a['threshold']:.1%} threshold, q={q:.2g}",
                          stage=stage, **common)
    ci = a["ci_log"]
    # ours: equivalence is never declared with a margin wider than max_effect, however noisy the key
    margin = min(a["threshold"], pol.max_effect)
    if ci is not None and -math.log1p(margin) < ci[0] and ci[1] < math.log1p(margin):
        return KeyVerdict(verdict="SAME", stage=stage, **common,
                          reason=f"CI [{math.expm1(ci[0]):+.1%}, {math.expm1(ci[1]):+.1%}] inside ±{margin:.1%}")
    if ci is None:
        why = "too few runs for a CI"
    elif a["too_noisy"]:
        why = f"too noisy: threshold {a['threshold']:.1%} from the run spread exceeds {pol.max_effect:.0%}"
    elif q is not None and q < pol.alpha and abs(delta) <= thr:
        why = f"significant but {pct} is below the {a['threshold']:.1%} threshold, CI not inside it"
    elif q is not None and q < pol.alpha:
        why = f"Mann–Whitney does not agree (p={p_mw:.2g})"
    else:
        why = f"{pct}, q={q:.2g}: neither significant nor equivalent"
    return KeyVerdict(verdict="INCONCLUSIVE", reason=why, stage=stage, rerun=True, **common)


def _key_changes(runs_b: list[Run], runs_n: list[Run]) -> list[Change]:
    """Deterministic changes of a key: every new run against the baseline's reference run, deduplicated."""
    if not runs_b:
        return []
    if not runs_n:
        return [Change("status", runs_b[0].signals.get("status", "done"), "missing")]
    ref = next((r.signals for r in runs_b if r.median_ms is not None), runs_b[0].signals)
    seen: dict[tuple[str, str, str], Change] = {}
    for r in runs_n:
        for c in compare_deterministic(ref, r.signals):
            seen.setdefault((c.field, repr(c.base), repr(c.new)), c)
    return list(seen.values())


def _statuses(runs: list[Run]) -> str:
    """"3 done, 1 failed" for the runs of one side; "no runs" when there are none."""
    if not runs:
        return "no runs"
    counts: dict[str, int] = {}
    for r in runs:
        st = str(r.signals.get("status", "done" if r.median_ms is not None else "no timing"))
        counts[st] = counts.get(st, 0) + 1
    return ", ".join(f"{n} {st}" for st, n in counts.items())


def _logs(runs: list[Run], side: str, key: str) -> np.ndarray:
    vals = [r.median_ms for r in runs if r.median_ms is not None]
    a = np.asarray(vals, dtype=np.float64)
    if np.any(~np.isfinite(a) | (a <= 0)):
        raise ValueError(f"run medians must be finite and positive, got {side} runs of {key!r}: {vals!r}")
    return np.log(a)


def _n_noisy(runs: list[Run], pol: Policy) -> int:
    return sum(1 for r in runs if r.median_ms is not None and r.rel_iqr is not None and r.rel_iqr > pol.noisy_rel_iqr)


def _noise_sigma(yb: np.ndarray, yn: np.ndarray) -> float:
    """σ̂ = 1.4826·MAD of the baseline's log run-medians; with < 3 baseline runs, of both sides' residuals."""
    if yb.size >= 3:
        r = yb - np.median(yb)
    else:
        r = np.concatenate([yb - np.median(yb), yn - np.median(yn)])
    return float(_MAD_SCALE * np.median(np.abs(r)))


def _welch(yb: np.ndarray, yn: np.ndarray) -> float:
    vb, vn = float(np.var(yb, ddof=1)), float(np.var(yn, ddof=1))
    if vb == 0.0 and vn == 0.0:
        # identical runs within each side: no noise to test against
        return 0.0 if not math.isclose(float(yb.mean()), float(yn.mean()), rel_tol=0.0, abs_tol=1e-12) else 1.0
    return float(stats.ttest_ind(yn, yb, equal_var=False).pvalue)


def _mannwhitney(yb: np.ndarray, yn: np.ndarray) -> tuple[float, float]:
    """Two-sided Mann–Whitney p of new vs base, and the sign of the shift it sees (+1 new larger)."""
    if np.all(yb == yb[0]) and np.all(yn == yb[0]):
        return 1.0, 0.0
    res = stats.mannwhitneyu(yn, yb, alternative="two-sided", method="auto")
    centre = yn.size * yb.size / 2.0
    return float(res.pvalue), float(np.sign(res.statistic - centre))


@functools.cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of orderings of m + n distinct values giving each U = 0..m*n (f(u; m, n) = f(u-n; m-1, n) + f(u; m, n-1))."""
    if m == 0 or n == 0:
        return (1,)
    out = [0] * (m * n + 1)
    for u, c in enumerate(_u_counts(m - 1, n)):
        out[u + n] += c
    for u, c in enumerate(_u_counts(m, n - 1)):
        out[u] += c
    return tuple(out)


def _u_cdf(m: int, n: int, u: int) -> float:
    """P(U <= u) under the null."""
    if u < 0:
        return 0.0
    if m + n <= _EXACT_U_MAX:
        counts = _u_counts(min(m, n), max(m, n))
        return sum(counts[: u + 1]) / math.comb(m + n, m)
    mu, sd = m * n / 2.0, math.sqrt(m * n * (m + n + 1) / 12.0)
    return float(stats.norm.cdf((u + 0.5 - mu) / sd))


def _moses_k(m: int, n: int, level: float) -> int | None:
    """Largest k >= 1 with 2·P(U <= k-1) <= 1 - level, or None when even k = 1 falls short."""
    tail = (1.0 - level) / 2.0 + 1e-12  # exact tails such as 1/20 must meet 0.05 despite float rounding
    if _u_cdf(m, n, 0) > tail:
        return None
    k = 1
    while k < (m * n + 1) // 2 and _u_cdf(m, n, k) <= tail:
        k += 1
    return k


def _canon(v: Any) -> Any:
    """Comparable form of a JSON-ish value (dict order and int/float spelling do not matter)."""
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _canon(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v
