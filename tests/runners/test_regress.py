"""The regression verdict (runners.regress) and its reports (runners.report) on synthetic timing series.

Scenarios: a known 10% slowdown -> SLOW; a 10% speedup -> FAST; no change with 1% run-to-run noise -> SAME; a changed
collective count -> CHANGED (fails whatever the timing); a failed or missing point -> CHANGED; 300 null keys -> no SLOW
or FAST after Benjamini–Hochberg although raw p-values fall below 0.05; too few runs and too much noise ->
INCONCLUSIVE with a rerun; the screen stage; the Hodges–Lehmann interval against the exact Mann–Whitney distribution;
the Markdown and JUnit writers (the XML is parsed back).

Runs are drawn as median_ms = base * exp(N(0, sd)), the log-normal run-to-run spread of GPU timings, with fixed seeds.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from scipy import stats

from runners import regress
from runners.regress import Change, KeyVerdict, Policy, Run, benjamini_hochberg, compare_deterministic, decide
from runners.report import ReportMeta, junit_xml, markdown_report, write_reports

SIG = {"status": "done", "collectives": {"all_gather": 1}, "host_syncs": 0, "configs": {"chunk_state_fwd": {"BV": 32}}}


def make_runs(rng: np.random.Generator, median_ms: float, n: int, *, sd: float = 0.01, rel_iqr: float = 0.005,
              signals: dict | None = None) -> list[Run]:
    return [Run(median_ms=median_ms * math.exp(rng.normal(0.0, sd)), rel_iqr=rel_iqr, n=50, signals=signals or SIG)
            for _ in range(n)]


def one(verdicts: list[KeyVerdict], key: str) -> KeyVerdict:
    (v,) = [v for v in verdicts if v.key == key]
    return v


def test_decide_slow_on_known_slowdown() -> None:
    rng = np.random.default_rng(1)
    base = {"k": make_runs(rng, 2.0, 7)}
    new = {"k": make_runs(rng, 2.2, 7)}
    (v,), rerun = decide(base, new)
    assert v.verdict == "SLOW" and v.status == "SLOW" and v.failed
    assert v.effect is not None and abs(v.effect - 0.10) < 0.02  # HL recovers the 10% within 2 points at 1% noise
    assert v.ci_log is not None and v.ci_log[0] < math.log(1.1) < v.ci_log[1]
    assert v.q_value is not None and v.q_value < 0.05 and v.p_mannwhitney < 0.05
    assert rerun == []


def test_decide_fast_on_known_speedup() -> None:
    rng = np.random.default_rng(2)
    (v,), _ = decide({"k": make_runs(rng, 2.0, 7)}, {"k": make_runs(rng, 1.8, 7)})
    assert v.verdict == "FAST" and not v.failed


def test_decide_same_on_noise_only() -> None:
    rng = np.random.default_rng(3)
    (v,), rerun = decide({"k": make_runs(rng, 2.0, 7)}, {"k": make_runs(rng, 2.0, 7)})
    assert v.verdict == "SAME", v.reason
    assert v.ci_log is not None and v.threshold is not None
    assert -math.log1p(v.threshold) < v.ci_log[0] <= v.ci_log[1] < math.log1p(v.threshold)
    assert not v.failed and rerun == []


def test_decide_changed_collective_count_fails() -> None:
    rng = np.random.default_rng(4)
    sig_new = {**SIG, "collectives": {"all_gather": 2}}
    (v,), _ = decide({"k": make_runs(rng, 2.0, 7)}, {"k": make_runs(rng, 2.0, 7, signals=sig_new)})
    assert v.changes == (Change("collectives.all_gather", 1, 2),)
    assert v.status == "CHANGED" and v.failed
    assert v.verdict == "SAME"  # the timing verdict is kept beside the deterministic failure


def test_decide_failed_and_missing_points_are_changed() -> None:
    rng = np.random.default_rng(5)
    base = {"failed": make_runs(rng, 1.0, 5), "missing": make_runs(rng, 1.0, 5)}
    new = {"failed": [Run(median_ms=None, signals={"status": "failed"})] * 3}
    verdicts, rerun = decide(base, new)
    f, m = one(verdicts, "failed"), one(verdicts, "missing")
    assert f.changes == (Change("status", "done", "failed"),) and f.failed and f.verdict == "INCONCLUSIVE"
    assert m.changes == (Change("status", "done", "missing"),) and m.failed
    assert rerun == []  # a point that fails outright is not rerun for its timing


def test_decide_bh_keeps_null_keys_clean() -> None:
    rng = np.random.default_rng(6)
    keys = [f"key{i}" for i in range(300)]
    base = {k: make_runs(rng, 1.0 + i / 100, 7) for i, k in enumerate(keys)}
    new = {k: make_runs(rng, 1.0 + i / 100, 7) for i, k in enumerate(keys)}
    verdicts, _ = decide(base, new)
    raw_hits = sum(1 for v in verdicts if v.p_welch is not None and v.p_welch < 0.05)
    assert raw_hits >= 5  # about 15 expected at alpha = 0.05 without correction
    assert [v.key for v in verdicts if v.verdict in ("SLOW", "FAST")] == []
    assert all(v.q_value is not None and v.q_value >= v.p_welch for v in verdicts)
    # with one real 10% regression among the nulls, BH still finds it
    new["key7"] = make_runs(rng, 1.07 * 1.10, 7)
    verdicts, _ = decide(base, new)
    assert [v.key for v in verdicts if v.verdict == "SLOW"] == ["key7"]


def test_decide_inconclusive_on_too_few_runs() -> None:
    rng = np.random.default_rng(7)
    (v,), rerun = decide({"k": make_runs(rng, 1.0, 7)}, {"k": make_runs(rng, 1.3, 1)})
    assert v.verdict == "INCONCLUSIVE" and "too few runs" in v.reason and rerun == ["k"]
    # a baseline of one run cannot be settled by rerunning the new side
    (v,), rerun = decide({"k": make_runs(rng, 1.0, 1)}, {"k": make_runs(rng, 1.0, 7)})
    assert v.verdict == "INCONCLUSIVE" and rerun == []


def test_decide_inconclusive_on_too_noisy_runs() -> None:
    rng = np.random.default_rng(18)
    (v,), rerun = decide({"k": make_runs(rng, 1.0, 7, sd=0.15)}, {"k": make_runs(rng, 1.0, 7, sd=0.15)})
    assert v.verdict == "INCONCLUSIVE" and v.too_noisy and v.threshold > Policy().max_effect and "too noisy" in v.reason
    assert rerun == ["k"] and not v.failed


def test_decide_screen_stage() -> None:
    rng = np.random.default_rng(9)
    base = {"same": make_runs(rng, 1.0, 2, sd=0.002), "moved": make_runs(rng, 1.0, 2, sd=0.002),
            "noisy": make_runs(rng, 1.0, 2, sd=0.002, rel_iqr=0.05)}
    new = {"same": make_runs(rng, 1.0, 2, sd=0.002), "moved": make_runs(rng, 1.08, 2, sd=0.002),
           "noisy": make_runs(rng, 1.0, 2, sd=0.002, rel_iqr=0.05)}
    verdicts, rerun = decide(base, new, stage="screen")
    assert one(verdicts, "same").verdict == "SAME"
    assert one(verdicts, "moved").verdict == "INCONCLUSIVE" and one(verdicts, "noisy").verdict == "INCONCLUSIVE"
    assert sorted(rerun) == ["moved", "noisy"]


def test_compare_deterministic() -> None:
    base = {"collectives": {"send": 0, "all_gather": 1}, "host_syncs": 0, "configs": {"wy": {"BK": 32, "num_warps": 4}}}
    assert compare_deterministic(base, {"collectives": {"all_gather": 1}, "host_syncs": 0.0,
                                        "configs": {"wy": {"num_warps": 4, "BK": 32}}}) == []
    assert compare_deterministic(base, {"collectives": {"all_gather": 1}, "host_syncs": 3}) == [Change("host_syncs", 0, 3)]
    assert compare_deterministic(base, {"collectives": {"send": 1, "all_gather": 1}}) == [Change("collectives.send", 0, 1)]
    assert compare_deterministic(base, {"configs": {"wy": {"BK": 64, "num_warps": 4}}}) == [
        Change("configs.wy", {"BK": 32, "num_warps": 4}, {"BK": 64, "num_warps": 4})]
    # a field recorded on one side only is not compared
    assert compare_deterministic({"host_syncs": None}, {"host_syncs": 2}) == []


def test_benjamini_hochberg_matches_scipy() -> None:
    p = np.random.default_rng(10).uniform(size=40) ** 2
    q = benjamini_hochberg([*p.tolist(), None])
    assert q[-1] is None
    np.testing.assert_allclose(q[:-1], stats.false_discovery_control(p, method="bh"), rtol=1e-12)


@pytest.mark.parametrize("m,n", [(3, 3), (5, 7), (7, 7), (24, 24)], ids=lambda x: str(x))
def test_hodges_lehmann_interval(m: int, n: int) -> None:
    rng = np.random.default_rng(11)
    b, a = rng.normal(0, 1, m), rng.normal(0.5, 1, n)
    delta, ci, cov = regress.hodges_lehmann(b, a, level=0.90)
    assert delta == pytest.approx(np.median(np.subtract.outer(a, b)))
    assert ci is not None and ci[0] <= delta <= ci[1] and cov is not None and 0.90 - 1e-9 <= cov < 0.97
    # the tail the interval leaves out is the exact Mann–Whitney probability of complete separation at k = 1
    assert regress._u_cdf(m, n, 0) == pytest.approx(1 / math.comb(m + n, m), rel=1e-9)
    assert regress.hodges_lehmann(b[:2], a[:2])[1] is None  # 2 vs 2 runs cannot give a 90% interval


def test_u_cdf_matches_scipy_exact() -> None:
    x, y = np.array([1.0, 2.5, 4.0, 7.0, 8.5]), np.array([3.0, 5.0, 6.0, 9.0, 10.0, 11.0])
    res = stats.mannwhitneyu(x, y, alternative="less", method="exact")
    assert regress._u_cdf(5, 6, int(res.statistic)) == pytest.approx(res.pvalue, rel=1e-12)


def test_policy_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="alpha"):
        Policy(alpha=1.5)
    with pytest.raises(ValueError, match="min_effect"):
        Policy(min_effect=0.2, max_effect=0.1)
    with pytest.raises(ValueError, match="median"):
        decide({"k": [Run(median_ms=-1.0)]}, {"k": [Run(median_ms=1.0)]})


def test_summarize_run() -> None:
    r = regress.summarize_run([1.0, 2.0, 3.0, 4.0, 100.0], signals={"host_syncs": 0})
    assert r.median_ms == 3.0 and r.n == 5 and r.rel_iqr == pytest.approx((4.0 - 2.0) / 3.0)
    with pytest.raises(ValueError, match="samples_ms"):
        regress.summarize_run([])


def _mixed_verdicts() -> list[KeyVerdict]:
    rng = np.random.default_rng(12)
    base = {"op=gdn|mode=ring|T=4096": make_runs(rng, 1.0, 7), "op=kda|mode=none|T=<1024>": make_runs(rng, 1.0, 7),
            "op=gdn|mode=true_cp|T=4096": make_runs(rng, 1.0, 7), "op=kda|mode=headwise&x": make_runs(rng, 1.0, 7)}
    new = {"op=gdn|mode=ring|T=4096": make_runs(rng, 1.1, 7), "op=kda|mode=none|T=<1024>": make_runs(rng, 1.0, 7),
           "op=gdn|mode=true_cp|T=4096": make_runs(rng, 1.0, 7, signals={**SIG, "host_syncs": 4}),
           "op=kda|mode=headwise&x": make_runs(rng, 1.0, 1)}
    return decide(base, new)[0]


def test_report_junit_and_markdown(tmp_path) -> None:
    verdicts = _mixed_verdicts()
    meta = ReportMeta(suite="nightly", run_id="r1", baseline_ref="nightly-baseline", baseline_sweeps=(1, 2),
                      new_sweeps=(3, 4), device="cpu", no_baseline=("op=gdn|mode=new",))
    md_path, xml_path = write_reports(verdicts, meta, tmp_path / "out")
    root = ET.parse(xml_path).getroot()
    cases = root.findall("./testsuite/testcase")
    assert sorted(c.get("name") for c in cases) == sorted(v.key for v in verdicts)
    failed = {c.get("name"): c.find("failure").get("type") for c in cases if c.find("failure") is not None}
    assert failed == {"op=gdn|mode=ring|T=4096": "SLOW", "op=gdn|mode=true_cp|T=4096": "CHANGED"}
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert skipped == ["op=kda|mode=headwise&x"]
    ts = root.find("testsuite")
    assert (ts.get("tests"), ts.get("failures"), ts.get("skipped")) == ("4", "2", "1")
    md = md_path.read_text()
    assert md.startswith("# cpbench regression: nightly") and "**Result: FAIL**" in md
    for v in verdicts:  # table cells escape the pipe
        assert v.key.replace("|", "\\|") in md.split("## Timing")[1]
    assert "host_syncs" in md and "op=gdn\\|mode=new" in md.split("## Keys without a baseline")[1]
    assert md == markdown_report(verdicts, meta) and xml_path.read_text() == junit_xml(verdicts, meta)


def test_report_passes_without_failures() -> None:
    rng = np.random.default_rng(13)
    verdicts, _ = decide({"k": make_runs(rng, 1.0, 7)}, {"k": make_runs(rng, 1.0, 7)})
    meta = ReportMeta(suite="s", run_id="r", baseline_ref="b")
    assert "**Result: PASS**" in markdown_report(verdicts, meta)
    assert ET.fromstring(junit_xml(verdicts, meta).split("?>", 1)[1]).find("testsuite").get("failures") == "0"
