"""A finished result waiting for the store keeps its lease, and a late one is refused in one line (issue 28, item 10).

Scenarios, on the real SQLite store:
- the write lock is held from while the point runs until 5 s after its result is spooled (the storing backs off
  meanwhile): once the lock goes, the point's lease is renewed while its result still waits (the heartbeat runs until
  the result is stored), and the point ends done on its first attempt with one measurement, nothing lost;
- a late write: worker A's lease expired, the point was claimed by B and B stored its result; A's write is refused
  before anything is written, with one log line (no UniqueViolation, no traceback), and B's measurement stays the
  only one.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.runners.engine_fixtures import _settings_reset, store_url, write_spec  # noqa: F401
from tests.runners.test_worker_store_outage import SLOW, _one_measurement_each, _submit, _Thread, _wait

pytestmark = pytest.mark.multiproc


def _point_row(path: Path) -> tuple[str, str | None]:
    """(status, lease_expires_at) of the only point, read beside any writer (WAL readers never wait)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute("SELECT status, lease_expires_at FROM points").fetchone()
    finally:
        conn.close()


@pytest.mark.heavy  # a timing race under a loaded suite: the poller can miss the renewed lease before `done`
def test_lease_is_renewed_while_the_result_waits_for_the_store(
    tmp_path: Path,
    store_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from db import session as db_session
    from db.session import dispose_engine, sqlite_path
    from runners.worker import Worker

    monkeypatch.setattr(db_session, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    monkeypatch.setenv("CPBENCH_STORE_RETRY_MAX_S", "10")
    _settings_reset()
    dispose_engine(store_url)
    path = sqlite_path(store_url)
    sweep_id = _submit(store_url, write_spec(tmp_path, timing={**SLOW, "timeout_s": 1.0}))
    w = _Thread(
        Worker(store_url, lease_s=60, heartbeat_s=0.2, devices=1, device_kind="cpu", artifact_dir=tmp_path / "art"),
        until_sweep=sweep_id,
    )
    w.start()
    _wait(lambda: _point_row(path)[0] == "running", 120, "the running point")
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")  # the store is away for writes: heartbeats and the result wait
    try:
        _wait(lambda: any((tmp_path / "art" / "spool").glob("*.json")), 120, "the spooled result")
        time.sleep(5.0)  # the storing backs off (0.2 s doubling); the lease is 60 s, so it is not lost meanwhile
        before = _point_row(path)
        assert before[0] == "running", before
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    seen: list[tuple[str, str | None]] = []
    _wait(lambda: seen.append(_point_row(path)) or seen[-1][0] != "running", 60, "the stored result")
    w.join(timeout=60)
    renewed = [lease for status, lease in seen if status == "running" and lease is not None and lease > before[1]]
    assert renewed, (before, seen[:5], len(seen))
    assert w.error is None and (w.stats.done, w.stats.lost, w.stats.failed) == (1, 0, 0)
    assert _one_measurement_each(store_url) == [("done", 1, None)]


def _rows() -> Any:
    from runners.results import StoreRows

    summary = {
        "median_ms": 1.0,
        "p10_ms": 1.0,
        "p90_ms": 1.0,
        "iqr_ms": 0.0,
        "mean_ms": 1.0,
        "min_ms": 1.0,
        "max_ms": 1.0,
        "n": 1,
    }
    return StoreRows(
        measurement={
            "clock": "wall",
            "samples": [1.0],
            "summary": summary,
            "stop_reason": "min_samples",
            "err_vs_none": 0.0,
            "err_vs_reference": 1e-6,
            "report": {},
        },
        profile=None,
        trace=None,
    )


def test_a_late_result_after_a_lost_lease_is_one_log_line(
    tmp_path: Path,
    store_url: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    from db.clock import store_now
    from db.queue import claim_point, expire_leases
    from db.session import session_scope
    from runners.worker import _write_results

    _submit(store_url, write_spec(tmp_path))
    with session_scope(store_url) as s:
        point_id = claim_point(s, worker="A", lease_s=1.0).id
    with session_scope(store_url) as s:
        assert expire_leases(s, now=store_now(s) + timedelta(seconds=5)) == 1  # A's lease ran out
    with session_scope(store_url) as s:
        assert claim_point(s, worker="B", lease_s=60.0).id == point_id
    with session_scope(store_url) as s:
        assert _write_results(s, point_id=point_id, worker="B", environment_id=None, rows=_rows(), artifact=None)
    caplog.set_level(logging.WARNING)
    caplog.clear()
    with session_scope(store_url) as s:
        assert not _write_results(s, point_id=point_id, worker="A", environment_id=None, rows=_rows(), artifact=None)
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "lease lost" in lines[0].getMessage() and lines[0].exc_info is None, caplog.text
    assert _one_measurement_each(store_url) == [("done", 1, None)]
