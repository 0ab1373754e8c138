"""Fault injection against the real stores: workers ride out a store outage and a hung rank is retried.

- PostgreSQL stopped for 10 s (`pg_ctl stop -m fast`, a cluster of the test's own) under 3 busy workers: every
  worker survives, every point ends done with exactly one measurement, and the measurements finished during the
  outage are spooled and stored when the store returns.
- SQLite's write lock held past the busy timeout (0.5 s here) while a worker is idle and while it stores a result:
  the worker survives and the points end done.
- SIGSTOP of rank 1 of a W=2 gang: the point's own time limit (not gloo's 300 s) notices the hang, the gang is
  restarted and the point retried (attempt 2) and done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runners.engine_fixtures import _settings_reset, store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc

SLOW = {"min_samples": 100000, "max_samples": 1000000, "max_rel_iqr": 1e-12, "min_time_s": 0.0}


def _wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _statuses(url: str) -> list[str]:
    from db.models import Point
    from db.session import session_scope

    with session_scope(url) as s:
        return [p.status for p in s.query(Point).order_by(Point.id)]


def _submit(url: str, spec: Path) -> int:
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec

    with session_scope(url) as s:
        return submit_spec(s, load_spec(spec)).id


class _Thread(threading.Thread):
    """A worker in a thread, remembering its stats or the exception that ended it."""

    def __init__(self, worker: Any, **run_kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.worker, self.run_kwargs = worker, run_kwargs
        self.stats: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.stats = self.worker.run(**self.run_kwargs)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


def _one_measurement_each(url: str) -> list[tuple[str, int, str | None]]:
    from db.models import Measurement, Point
    from db.session import session_scope

    with session_scope(url) as s:
        rows = []
        for p in s.query(Point).order_by(Point.id):
            n = s.query(Measurement).filter(Measurement.point_id == p.id).count()
            rows.append((p.status, n, p.lease_owner))
        return rows


def test_workers_survive_postgres_outage_and_store_spooled_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from db.migrate import upgrade
    from db.session import dispose_engine
    from runners.worker import Worker
    from tests.utils.pg_cluster import ScratchCluster

    cluster = ScratchCluster()
    monkeypatch.setenv("CPBENCH_STORE_RETRY_MAX_S", "1")
    monkeypatch.setenv("CPBENCH_POLL_S", "0.2")
    _settings_reset()
    try:
        url = cluster.url
        upgrade(url)
        sweep_id = _submit(url, write_spec(tmp_path, seeds=[0, 1, 2], timing={**SLOW, "timeout_s": 3.0}))
        workers = [_Thread(Worker(url, lease_s=60, heartbeat_s=0.5, devices=1, device_kind="cpu", name="pgw",
                                  artifact_dir=tmp_path / "art"), until_sweep=sweep_id) for _ in range(3)]
        for w in workers:
            w.start()
        _wait(lambda: _statuses(url).count("running") == 3, 180, "three running points")
        time.sleep(1.0)
        cluster.stop("fast")
        down_at = time.monotonic()
        time.sleep(10.0)  # the points (3 s of timing) finish while the store is away
        cluster.start()
        up_after_s = time.monotonic() - down_at
        for w in workers:
            w.join(timeout=120)
        assert all(not w.is_alive() and w.error is None for w in workers), [w.error for w in workers]
        assert _one_measurement_each(url) == [("done", 1, None)] * 3
        stats = [w.stats for w in workers]
        assert sum(st.done for st in stats) == 3 and all(st.failed == 0 and st.lost == 0 for st in stats)
        assert all(st.store_outages >= 1 and st.longest_outage_s >= 5.0 for st in stats), stats
        assert all(st.spooled == st.done for st in stats)
        assert not list((tmp_path / "art" / "spool").glob("*.json"))  # stored, so removed
        assert up_after_s >= 10.0
        print(f"postgres outage: {up_after_s:.1f} s down, {sum(not w.is_alive() and w.error is None for w in workers)}/3 workers "
              f"survived, {3 - sum(st.done for st in stats)} points lost, {sum(st.spooled for st in stats)} spooled results stored")
        names = {w.worker.name for w in workers}
        assert len(names) == 3 and all(n.startswith("pgw:") for n in names)  # one --name, three identities
    finally:
        dispose_engine(cluster.url)
        cluster.destroy()
        _settings_reset()


def _hold_sqlite_lock(path: Path, seconds: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def test_worker_survives_sqlite_lock_past_busy_timeout(tmp_path: Path, store_url: str,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from db import session as db_session
    from db.session import dispose_engine, sqlite_path
    from runners.worker import Worker

    monkeypatch.setattr(db_session, "SQLITE_BUSY_TIMEOUT_S", 0.5)
    monkeypatch.setenv("CPBENCH_STORE_RETRY_MAX_S", "0.5")
    monkeypatch.setenv("CPBENCH_POLL_S", "0.2")
    _settings_reset()
    dispose_engine(store_url)
    stop = threading.Event()
    w = _Thread(Worker(store_url, lease_s=60, heartbeat_s=0.5, devices=1, device_kind="cpu", stop_event=stop,
                       artifact_dir=tmp_path / "art"))
    w.start()
    try:
        time.sleep(2.0)  # idle, polling
        _hold_sqlite_lock(sqlite_path(store_url), 3.0)
        assert w.is_alive(), w.error
        _submit(store_url, write_spec(tmp_path, seeds=[0, 1], timing={**SLOW, "timeout_s": 2.0}))
        _wait(lambda: "running" in _statuses(store_url), 120, "a running point")
        _hold_sqlite_lock(sqlite_path(store_url), 4.0)  # the point finishes while the lock is held
        _wait(lambda: _statuses(store_url) == ["done", "done"], 120, "both points done")
    finally:
        stop.set()
        w.join(timeout=60)
    assert w.error is None and w.stats is not None
    assert (w.stats.done, w.stats.failed, w.stats.lost) == (2, 0, 0)
    assert w.stats.store_outages >= 2
    assert _one_measurement_each(store_url) == [("done", 1, None)] * 2


def test_hung_rank_is_retried_within_the_points_time_limit(tmp_path: Path, store_url: str,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from db.models import Point
    from db.session import session_scope
    from runners.worker import Worker

    monkeypatch.setenv("CPBENCH_POINT_OVERHEAD_S", "20")
    _settings_reset()
    spec = write_spec(tmp_path, modes=["all_gather"], axes={"W": 2}, timing={**SLOW, "timeout_s": 1.0})
    sweep_id = _submit(store_url, spec)
    worker = Worker(store_url, lease_s=60, heartbeat_s=0.5, devices=2, device_kind="cpu", artifact_dir=tmp_path / "art")
    w = _Thread(worker, until_sweep=sweep_id)
    w.start()

    def gang_running() -> bool:
        gang = worker.pool._gangs.get(2) if worker.pool is not None else None
        return gang is not None and len(gang.pids) == 2 and _statuses(store_url) == ["running"]

    _wait(gang_running, 180, "the W=2 gang running the point")
    time.sleep(0.5)
    stopped_pid = worker.pool._gangs[2].pids[1]
    os.kill(stopped_pid, signal.SIGSTOP)
    hung_at = time.monotonic()
    try:
        _wait(lambda: _statuses(store_url) == ["done"], 120, "the retried point")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped_pid, signal.SIGKILL)
    recovered_s = time.monotonic() - hung_at
    w.join(timeout=60)
    assert w.error is None and w.stats.done == 1 and w.stats.failed == 1
    with session_scope(store_url) as s:
        point = s.query(Point).one()
        assert (point.status, point.attempts) == ("done", 2)
    assert recovered_s < 60  # the point's limit is 20 + 2 * (0.025 + 1) s, not gloo's 300 s
    print(f"hang recovery: {recovered_s:.1f} s, attempts {point.attempts}")
