"""Persistent rank gangs (runners.gang) and the profiler summary over gloo (runners.profile).

One W=2 gloo gang per module. Scenarios, in order:
- profile: one step with one all_gather, all_to_all, all_reduce and a send 0->1 counts each collective once per
  rank (not once per naming layer), with the input bytes; the merged profile has send 1 / recv 1; rank 0's trace
  is a gzipped Chrome trace holding the step range;
- reuse: two jobs run in the same processes (same PIDs, per-rank cache kept) and a real all-reduce works;
- an exception on every rank fails the job and keeps the gang;
- a rank that dies (os._exit) fails that job with its exit code; the gang restarts and the next job works;
- a rank that raises while the other waits in a collective fails the job within the grace period (restart);
- a hung rank trips the watchdog (restart).
Plus, in-process: a `.item()` step counts one host sync; event names classify to one layer each.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from runners.errors import GangError
from runners.gang import Gang
from runners.profile import ProfileSummary, classify_collective, merge_ranks, profile_step
from tests.runners import jobs

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def gang() -> Iterator[Gang]:
    g = Gang(2, device_kind="cpu", error_grace_s=2.0, start_timeout_s=120)
    try:
        yield g
    finally:
        g.close()


def test_profile_step_gloo_collectives(gang: Gang, tmp_path: Path) -> None:
    trace = tmp_path / "t" / "trace.json.gz"
    per_rank = gang.run(jobs.profile_collectives, str(trace), timeout_s=120)
    for rank, d in enumerate(per_rank):
        p2p = {"send": 1} if rank == 0 else {"recv": 1}
        assert d["collectives"] == {"all_gather": 1, "all_to_all": 1, "all_reduce": 1, **p2p}, d
        assert d["collective_bytes"]["all_gather"] == 256 * 4
        assert d["collective_bytes"]["all_to_all"] == 256 * 4
        assert d["collective_bytes"][next(iter(p2p))] == 64 * 8
        assert d["host_syncs"] == 0 and d["kernel_launches"] == 0 and d["peak_memory_bytes"] is None
    merged = merge_ranks([ProfileSummary(**d) for d in per_rank])
    assert merged.collectives == {"all_gather": 1, "all_reduce": 1, "all_to_all": 1, "recv": 1, "send": 1}
    assert merged.trace_path == str(trace)
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "cpbench::step" in names and "gloo:all_gather" in names


def test_gang_reuses_processes(gang: Gang) -> None:
    first = gang.run(jobs.whoami, "a", timeout_s=120)
    second = gang.run(jobs.whoami, "b", timeout_s=60)
    assert [r["pid"] for r in first] == [r["pid"] for r in second] == gang.pids
    assert [r["sum"] for r in second] == [3.0, 3.0]
    assert [r["calls"] - f["calls"] for r, f in zip(second, first, strict=True)] == [1, 1]
    assert [r["payload"] for r in second] == ["b", "b"]


def test_gang_error_on_every_rank_keeps_gang(gang: Gang) -> None:
    pids = gang.run(jobs.whoami, None)[0]["pid"], gang.pids
    with pytest.raises(GangError, match="rank 0: ValueError: bad input on rank 0: zz") as info:
        gang.run(jobs.raise_everywhere, "zz", timeout_s=60)
    assert not info.value.restarted and not info.value.retryable
    assert gang.alive and gang.pids == pids[1]


def test_gang_rank_crash_restarts(gang: Gang) -> None:
    old = list(gang.pids)
    with pytest.raises(GangError, match="rank 1 exited with code 3 during the job") as info:
        gang.run(jobs.crash_rank, 1, timeout_s=120)
    assert info.value.restarted and info.value.retryable
    after = gang.run(jobs.whoami, "next", timeout_s=120)
    assert [r["sum"] for r in after] == [3.0, 3.0]
    assert not set(gang.pids) & set(old)


def test_gang_rank_raises_while_other_waits(gang: Gang) -> None:
    with pytest.raises(GangError, match=r"rank 1: RuntimeError: rank 1 gave up[\s\S]*ranks \[0\] did not answer") as info:
        gang.run(jobs.raise_on_rank, 1, timeout_s=120)
    assert info.value.restarted
    assert [r["sum"] for r in gang.run(jobs.whoami, None, timeout_s=120)] == [3.0, 3.0]


def test_gang_watchdog(gang: Gang) -> None:
    gang.start()
    with pytest.raises(GangError, match=r"ranks \[0, 1\] did not answer within 1 s \(watchdog"):
        gang.run(jobs.hang_rank, 30.0, timeout_s=1.0)
    assert not gang.alive


def test_profile_step_item_sync(tmp_path: Path) -> None:
    x = torch.randn(16)
    d = profile_step(lambda: x.sum().item(), device=torch.device("cpu"))
    assert d.host_syncs == 1
    assert d.sync_events == {"aten::item": 1, "aten::_local_scalar_dense": 1}
    assert d.collectives == {}
    clean = profile_step(lambda: x.sum() * 2, device=torch.device("cpu"))
    assert clean.host_syncs == 0 and clean.sync_events == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("c10d::_allgather_base_", ("dispatch", "all_gather")),
        ("c10d::allgather_", ("dispatch", "all_gather")),
        ("_c10d_functional::all_gather_into_tensor", ("dispatch", "all_gather")),
        ("c10d::alltoall_base_", ("dispatch", "all_to_all")),
        ("c10d::recv_", ("dispatch", "recv")),
        ("c10d::_reduce_scatter_base_", ("dispatch", "reduce_scatter")),
        ("gloo:all_gather", ("backend", "all_gather")),
        ("nccl:all_to_all", ("backend", "all_to_all")),
        ("nccl:send", ("backend", "send")),
        ("cp::all_gather", None),
        ("_c10d_functional::wait_tensor", None),
        ("aten::copy_", None),
    ],
)
def test_classify_collective(name: str, expected: tuple[str, str] | None) -> None:
    assert classify_collective(name) == expected
