"""What a point's gang returns (`PointResult`, one per rank) and the rows the worker stores from it (`store_rows`).

`runners.execute.run_point_job` returns a `PointResult` on every rank (it crosses the gang as a pickle): whether the
point passed its gate (`ok`, `error`), and on rank 0 the gate's errors and tolerances, the timing, the launch
configs and the scheme's report; on every rank its profile and kernels.cp's count of its collectives, in all and
per direction (`runners.collective_check`). The worker spools `PointResult.to_json()` (the spool survives a crash
and reads back with `from_json`).

`store_rows(point, results)` is pure: it merges the ranks' profiles (`runners.profile.merge_ranks`), merges and
compares the expected collectives with the measured ones (the differences in the report's
`collective_mismatches`), summarises the samples, builds the report and records the topology the gang ran on
(`runners.topology`), all BEFORE any store session opens; the
worker's transaction then only writes the rows (`db.crud.store_artifact`, `store_measurement`, `store_profile`)
and completes the point.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from db.topology import Topology
from kernels.cp.modes import merge_rank_counts
from runners import collective_check
from runners.point import PointSpec
from runners.profile import ProfileSummary, merge_ranks
from runners.stats import summarize
from runners.timing import unreliable_reason

__all__ = ["PointResult", "StoreRows", "store_rows", "trace_path"]


@dataclass(frozen=True)
class PointResult:
    """One rank's outcome of a point. `gate`, `timing`, `configs`, `report`: rank 0's (`gate` also on a failed
    gate); `profile` (a `ProfileSummary` as a dict; None when not profiled), `expected_collectives` (kernels.cp's
    count of one step on this rank) and `expected_by_direction` (the same per direction the step runs; None: the
    backend states no count): every rank's."""

    ok: bool
    error: str | None = None
    gate: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    expected_collectives: dict[str, int] = field(default_factory=dict)
    expected_by_direction: dict[str, dict[str, int]] | None = None
    configs: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PointResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class StoreRows:
    """The rows of one finished point: `measurement` (the fields of `db.crud.store_measurement` past the point,
    environment and worker), `profile` (of `db.crud.store_profile` past the point and artifact; None: not
    profiled) and rank 0's Chrome trace file (`trace`; None: none written)."""

    measurement: dict[str, Any]
    profile: dict[str, Any] | None
    trace: str | None

    @property
    def mismatches(self) -> list[str]:
        """The collectives that differ from kernels.cp's count (empty when they agree or were not compared)."""
        return list(self.measurement["report"].get("collective_mismatches") or [])


def _merged_profile(results: list[PointResult]) -> ProfileSummary | None:
    profiles = [ProfileSummary(**r.profile) for r in results if r.profile]
    return merge_ranks(profiles) if profiles else None


def trace_path(results: list[PointResult]) -> str | None:
    """Rank 0's Chrome trace file of the gang's results (None: none written)."""
    prof = _merged_profile(results)
    return prof.trace_path if prof is not None and prof.trace_path else None


def _timing_report(timing: dict[str, Any]) -> dict[str, Any]:
    skews = [hi - lo for hi, lo in zip(timing["samples_ms"], timing["rank_min_ms"], strict=False)]
    return {
        "warmup_iters": timing["warmup_iters"],
        "warmup_s": round(timing["warmup_s"], 6),
        "l2_flush_bytes": timing["l2_flush_bytes"],
        "rank_skew_median_ms": summarize(skews).median if skews else 0.0,
        # CUDA: host time to enqueue one step; near the sample itself means the step is launch-bound
        "host_enqueue_median_ms": summarize(timing["host_ms"]).median if timing.get("host_ms") else None,
    }


def _report(results: list[PointResult], prof: ProfileSummary | None) -> dict[str, Any]:
    """Rank 0's report, the gate's tolerances, the timing's facts, the expected collectives (merged over the gang
    like the profile merges the ranks) and, where both are known, how the measured ones differ."""
    r0 = results[0]
    assert r0.gate is not None and r0.timing is not None
    report = {**r0.report, "gate": {k: r0.gate[k] for k in ("tol_none", "tol_reference")},
              "timing": _timing_report(r0.timing)}
    report["expected_collectives"] = merge_rank_counts(r.expected_collectives or {} for r in results)
    expected = collective_check.merge_gang([r.expected_by_direction for r in results])
    if expected is not None:
        report["expected_collectives_by_direction"] = expected
    if prof is not None:
        report["profile_ranks"] = prof.per_rank
        if expected is not None:
            report["collective_mismatches"] = collective_check.mismatches(prof.as_dict(), expected)
    return report


def store_rows(point: PointSpec, results: list[PointResult], topology: Topology | None = None) -> StoreRows:
    """The rows to store for `point` from its gang's `results` (indexed by rank; rank 0's passed its gate), run on
    `topology` (its columns and the report's `topology`; None: not known)."""
    r0 = results[0]
    if not r0.ok or r0.timing is None or r0.gate is None:
        raise ValueError(f"point {point.op}/{point.mode}/{point.backend}: rank 0 returned no measurement ({r0.error})")
    timing, gate = r0.timing, r0.gate
    prof = _merged_profile(results)
    summary = summarize(timing["samples_ms"])
    measurement = {
        "clock": timing["clock"], "samples": timing["samples_ms"],
        "summary": summary.stored(),
        "stop_reason": timing["stop_reason"],
        # why the stop rule did not converge (None: it did); a result spooled before the flag existed: its stop reason
        "unreliable": timing["unreliable"] if "unreliable" in timing
        else unreliable_reason(timing["samples_ms"], timing["stop_reason"]),
        "err_vs_none": gate["err_vs_none"],
        "err_vs_reference": gate["err_vs_reference"], "configs": r0.configs, "report": _report(results, prof),
    }
    if topology is not None:
        measurement.update(topology.columns())
        measurement["report"]["topology"] = topology.detail()
    profile = None
    if prof is not None:
        profile = {
            "collectives": prof.collectives, "collective_bytes": prof.collective_bytes, "host_syncs": prof.host_syncs,
            "sync_events": prof.sync_events, "kernel_launches": prof.kernel_launches,
            "peak_memory_bytes": prof.peak_memory_bytes, "by_direction": prof.by_direction or None,
        }
    return StoreRows(measurement=measurement, profile=profile, trace=(prof.trace_path or None) if prof is not None else None)
