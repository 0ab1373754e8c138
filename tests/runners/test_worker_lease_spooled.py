"""A finished result waiting for the store keeps its lease, and a late one is refused in one line (issue 28, item 10).

Scenarios, on the real SQLite store (a trigger of the test's store logs every change of a point's lease, so what
happens between two commits is read afterwards, not raced by a poller):
- the write lock is held from while the point runs until 5 s after its result is spooled (the storing backs off
  meanwhile): once the lock goes, the point's lease is renewed before its result is stored (by the heartbeat, which
  runs until the result is stored, or by the result's own write, which re-takes the lease first), and the point
  ends done on its first attempt with one measurement, nothing lost;
- the transaction that stores a result re-takes the lease (renewed for the worker's lease time) before it writes;
- a late write: worker A's lease expired, the point was claimed by B and B stored its result; A's write is refused
  before anything is written, with one log line (no UniqueViolation, no traceback), and B's measurement stays the
  only one;
- PostgreSQL: while A's write transaction is open, its re-taken lease locks the point's row: B's claim, at a time when
  A's lease has run out, neither expires it nor gets the point, and A's result is stored once.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.runners.engine_fixtures import _settings_reset, pg_store_url, store_url, write_spec  # noqa: F401
from tests.runners.test_worker_store_outage import SLOW, _one_measurement_each, _submit, _Thread, _wait

pytestmark = pytest.mark.multiproc


def _point_row(path: Path) -> tuple[str, str | None]:
    """(status, lease_expires_at) of the only point, read beside any writer (WAL readers never wait)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute("SELECT status, lease_expires_at FROM points").fetchone()
    finally:
        conn.close()


def _log_leases(path: Path) -> None:
    """Record every change of a point's lease in `lease_log` (a trigger of the test's store): what a poller would
    have to catch between two commits is then read afterwards, whatever the machine's load."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.executescript(
            "CREATE TABLE lease_log (seq INTEGER PRIMARY KEY, status TEXT, owner TEXT, lease TEXT);"
            "CREATE TRIGGER lease_logged AFTER UPDATE OF lease_expires_at ON points BEGIN "
            "INSERT INTO lease_log (status, owner, lease) VALUES (new.status, new.lease_owner, new.lease_expires_at); END;"
        )
    finally:
        conn.close()


def _lease_log(path: Path) -> list[tuple[str, str | None, str | None]]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute("SELECT status, owner, lease FROM lease_log ORDER BY seq").fetchall()
    finally:
        conn.close()


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
    assert path is not None
    _log_leases(path)
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
        seen = len(_lease_log(path))
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    w.join(timeout=120)
    assert not w.is_alive()
    after = _lease_log(path)[seen:]  # the lease's changes once the store came back, in commit order
    # renewed (by a heartbeat, or by the result's own write re-taking it) before the point was done
    assert after[0][:2] == ("running", w.worker.name) and after[0][2] > before[1], (before, after)
    assert after[-1] == ("done", None, None) and all(status == "running" for status, _, _ in after[:-1]), after
    assert w.error is None and (w.stats.done, w.stats.lost, w.stats.failed) == (1, 0, 0)
    assert _one_measurement_each(store_url) == [("done", 1, None)]


def test_the_result_write_retakes_the_lease_first(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    """The transaction that stores a result renews the lease before it writes, whatever the lease had left."""
    from db.queue import claim_point
    from db.session import session_scope, sqlite_path
    from runners.worker import _write_results

    path = sqlite_path(store_url)
    assert path is not None
    _log_leases(path)
    _submit(store_url, write_spec(tmp_path))
    with session_scope(store_url) as s:
        point_id = claim_point(s, worker="A", lease_s=1.0).id
    claimed = _point_row(path)[1]
    with session_scope(store_url) as s:
        assert _write_results(
            s, point_id=point_id, worker="A", environment_id=None, rows=_rows(), artifact=None, lease_s=600.0
        )
    log = _lease_log(path)
    assert [(status, owner) for status, owner, _ in log] == [("running", "A"), ("running", "A"), ("done", None)], log
    assert log[1][2] > claimed and log[1][2] > log[0][2], log  # 600 s from the write, past the 1 s claim
    assert _one_measurement_each(store_url) == [("done", 1, None)]


@pytest.mark.postgres
def test_a_retaken_lease_keeps_other_workers_off_until_the_write_commits(tmp_path: Path, pg_store_url: str) -> None:  # noqa: F811
    """PostgreSQL: while A's result is being written (its lease re-taken, the transaction open), B's claim, at a
    time when A's lease has long run out, neither expires A's lease nor gets the point; A's result is stored once."""
    from db import crud
    from db.clock import store_now
    from db.queue import claim_point, complete_point, retake_lease
    from db.session import get_sessionmaker, session_scope

    _submit(pg_store_url, write_spec(tmp_path))
    with session_scope(pg_store_url) as s:
        point_id = claim_point(s, worker="A", lease_s=1.0).id
    maker = get_sessionmaker(pg_store_url)
    with maker() as a, maker() as b:
        assert retake_lease(a, point_id=point_id, worker="A", lease_s=60.0)
        late = store_now(b) + timedelta(minutes=10)  # A's lease, even renewed, ran out by then
        assert claim_point(b, worker="B", lease_s=60.0, now=late) is None  # the point's row is A's until it commits
        crud.store_measurement(a, point_id=point_id, environment_id=None, worker="A", **_rows().measurement)
        assert complete_point(a, point_id=point_id, worker="A")
        assert claim_point(b, worker="B", lease_s=60.0, now=late) is None  # done: nothing left to claim
    assert _one_measurement_each(pg_store_url) == [("done", 1, None)]


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
        assert _write_results(s, point_id=point_id, worker="B", environment_id=None, rows=_rows(), artifact=None, lease_s=60.0)
    caplog.set_level(logging.WARNING)
    caplog.clear()
    with session_scope(store_url) as s:
        assert not _write_results(
            s, point_id=point_id, worker="A", environment_id=None, rows=_rows(), artifact=None, lease_s=60.0
        )
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "lease lost" in lines[0].getMessage() and lines[0].exc_info is None, caplog.text
    assert _one_measurement_each(store_url) == [("done", 1, None)]
