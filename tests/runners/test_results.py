"""The rows a finished point stores (runners.results), built before any store session opens.

Scenarios: a two-rank gang's results become one measurement row (samples, summary, the gate's errors, rank 0's
configs and report with the gate's tolerances and the timing's facts) and one profile row with the ranks'
profiles merged (group collectives the max over ranks, send/recv summed, launches the max, peak memory the max);
collectives that agree with kernels.cp's count leave `collective_mismatches` empty, one that differs is reported
per step and per direction; a peer without a count stores no comparison; a result crosses the spool as JSON.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from runners.point import PointSpec
from runners.results import PointResult, store_rows, trace_path

POINT = PointSpec("gdn", "ring", "torch", B=1, T=256, H=2, K=32, V=32, W=2, direction="fwd+bwd")
TIMING = {"samples_ms": [1.0, 2.0, 3.0], "stop_reason": "max_samples", "clock": "wall", "rank_min_ms": [0.5, 1.5, 2.5],
          "host_ms": [], "warmup_iters": 4, "warmup_s": 0.0123456789, "l2_flush_bytes": 0}
GATE = {"err_vs_none": 1e-7, "err_vs_reference": 2e-4, "tol_none": 2e-3, "tol_reference": 2e-3, "passed": True,
        "message": None}
EXPECTED = {"fwd": {"send": 1, "recv": 1}, "bwd": {"send": 1, "recv": 1}}


def _profile(launches: int, peak: int, *, bwd_send: int = 1, trace: str | None = None) -> dict[str, Any]:
    return {"collectives": {"send": 1 + bwd_send, "recv": 2}, "collective_bytes": {"send": 64, "recv": 64},
            "host_syncs": 0, "sync_events": {}, "kernel_launches": launches, "peak_memory_bytes": peak,
            "trace_path": trace, "per_rank": [], "unclassified": [],
            "by_direction": {"fwd": {"collectives": {"send": 1, "recv": 1}, "collective_bytes": {}, "host_syncs": 0},
                             "bwd": {"collectives": {"send": bwd_send, "recv": 1}, "collective_bytes": {}, "host_syncs": 0}}}


def _gang(rank1_bwd_send: int = 1) -> list[PointResult]:
    r0 = PointResult(ok=True, gate=GATE, timing=TIMING, profile=_profile(10, 100, trace="/tmp/t.json.gz"),
                     expected_collectives={"send": 2, "recv": 2}, expected_by_direction=EXPECTED,
                     configs={"k": {"config": {"BT": 64}}}, report={"note": 1})
    r1 = PointResult(ok=True, profile=_profile(12, 50, bwd_send=rank1_bwd_send),
                     expected_collectives={"send": 2, "recv": 2}, expected_by_direction=EXPECTED)
    return [r0, r1]


def test_rows_keep_the_timing_flag() -> None:
    """The stop rule's verdict crosses from the timing to the measurement row as the timer gave it."""
    gang = _gang()
    for flag in ("stopped on timeout with n=3 < min_samples=10 (IQR/median 0.5)", None):
        gang[0] = replace(gang[0], timing={**TIMING, "unreliable": flag})
        assert store_rows(POINT, gang).measurement["unreliable"] == flag


def test_rows_merge_the_ranks_profiles() -> None:
    rows = store_rows(POINT, _gang())
    m = rows.measurement
    assert m["samples"] == [1.0, 2.0, 3.0] and m["clock"] == "wall" and m["stop_reason"] == "max_samples"
    assert m["summary"]["n"] == 3 and m["summary"]["median_ms"] == 2.0
    assert m["unreliable"] == "stopped on max_samples before the noise target (n=3, IQR/median 0.5)"  # spooled earlier
    assert (m["err_vs_none"], m["err_vs_reference"]) == (1e-7, 2e-4) and m["configs"] == {"k": {"config": {"BT": 64}}}
    report = m["report"]
    assert report["note"] == 1 and report["gate"] == {"tol_none": 2e-3, "tol_reference": 2e-3}
    assert report["timing"]["warmup_s"] == 0.012346 and report["timing"]["rank_skew_median_ms"] == 0.5
    assert report["expected_collectives"] == {"recv": 4, "send": 4}  # send/recv summed over the ranks
    assert report["expected_collectives_by_direction"] == {"fwd": {"recv": 2, "send": 2}, "bwd": {"recv": 2, "send": 2}}
    assert report["collective_mismatches"] == [] and rows.mismatches == []
    assert [r["kernel_launches"] for r in report["profile_ranks"]] == [10, 12]
    p = rows.profile
    assert p is not None and p["collectives"] == {"recv": 4, "send": 4} and p["kernel_launches"] == 12
    assert p["peak_memory_bytes"] == 100 and set(p["by_direction"]) == {"fwd", "bwd"}
    assert rows.trace == "/tmp/t.json.gz" == trace_path(_gang())


def test_a_collective_mismatch_is_reported() -> None:
    rows = store_rows(POINT, _gang(rank1_bwd_send=2))  # rank 1 sends once more in its backward than kernels.cp says
    assert rows.mismatches == ["step send: measured 5, expected 4", "bwd send: measured 3, expected 2"]
    assert rows.measurement["report"]["collective_mismatches"] == rows.mismatches


def test_no_count_no_comparison_and_no_profile() -> None:
    gang = [replace(r, expected_by_direction=None) for r in _gang()]  # a peer without `expected_collectives`
    report = store_rows(POINT, gang).measurement["report"]
    assert "expected_collectives_by_direction" not in report and "collective_mismatches" not in report
    unprofiled = store_rows(POINT, [replace(r, profile=None) for r in _gang()])
    assert unprofiled.profile is None and unprofiled.trace is None and "profile_ranks" not in unprofiled.measurement["report"]
    with pytest.raises(ValueError, match="rank 0 returned no measurement"):
        store_rows(POINT, [PointResult(ok=False, gate=GATE, error="gate failed")])


def test_a_result_round_trips_through_the_spool_json() -> None:
    for r in _gang():
        assert PointResult.from_json(json.loads(json.dumps(r.to_json()))) == r
