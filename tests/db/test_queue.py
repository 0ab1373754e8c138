"""The queue (`db.queue`) on SQLite and PostgreSQL.

Scenarios: claims come oldest first, skip cancelled sweeps and points whose W or device kind does not fit, and
move the sweep to running; a heartbeat extends a held lease and reports a lost one; an expired lease returns the
point, and the former owner can neither complete nor heartbeat it; retries are bounded, then the point is failed
with its error (also when the lease keeps expiring); release gives the point back without using an attempt;
cancel withdraws queued points while a running one finishes and keeps its result; several real processes
(spawned) claiming from one store until it is empty get every point exactly once; a process that releases on
SIGTERM gives its point back; a process SIGKILLed mid-store loses its lease and another worker finishes the point
with a single measurement row.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from db import crud, queue
from db.models import Measurement, Point
from db.session import get_sessionmaker, session_scope

SPAWN = mp.get_context("spawn")
CHILD_TIMEOUT_S = 120


def _sweep(url: str, points: list[dict]) -> tuple[int, list[int]]:
    with session_scope(url) as s:
        sweep = crud.create_sweep(s, name="q", tags=[], spec={}, points=points)
        return sweep.id, [p.id for p in sweep.points]


def _point(url: str, point_id: int) -> Point:
    with get_sessionmaker(url)() as s:
        point = s.get(Point, point_id)
        assert point is not None
        return point


def _store(s, point_id: int, worker: str) -> None:
    crud.store_measurement(
        s, point_id=point_id, environment_id=None, worker=worker, clock="wall", samples=[1.0, 2.0, 3.0],
        summary={"median_ms": 2.0, "p10_ms": 1.0, "p90_ms": 3.0, "iqr_ms": 1.0, "mean_ms": 2.0, "min_ms": 1.0,
                 "max_ms": 3.0, "n": 3},
        stop_reason="max_samples", err_vs_none=0.0, err_vs_reference=0.0,
    )  # fmt: skip


def _n_measurements(url: str) -> int:
    with get_sessionmaker(url)() as s:
        return s.execute(select(func.count()).select_from(Measurement)).scalar_one()


def test_claim_order_and_filters(db_url: str, make_points) -> None:
    first, first_ids = _sweep(db_url, make_points(2) + make_points(2, start=2, W=4))
    _, second_ids = _sweep(db_url, make_points(1) + make_points(1, start=1, device_kind="cuda"))
    with get_sessionmaker(db_url)() as s:
        p = queue.claim_point(s, worker="a", lease_s=60)
        assert p.id == first_ids[0] and p.status == "running" and p.lease_owner == "a" and p.attempts == 1
        assert p.claimed_at.tzinfo == timezone.utc and p.lease_expires_at - p.claimed_at == timedelta(seconds=60)
        sweep = crud.get_sweep(s, sweep_id=first)
        s.refresh(sweep)
        assert sweep.status == "running" and sweep.started_at == p.claimed_at
        # W=4 points wait for a worker with 4 devices; cuda points for a cuda worker
        got = [queue.claim_point(s, worker="b", lease_s=60, max_W=2, device_kind="cpu") for _ in range(3)]
        assert [g.id if g else None for g in got] == [first_ids[1], second_ids[0], None]
        assert queue.claim_point(s, worker="c", lease_s=60, max_W=4).id == first_ids[2]
        assert queue.claim_point(s, worker="c", lease_s=60, device_kind="cuda").id == first_ids[3]
        assert queue.claim_point(s, worker="c", lease_s=60, device_kind="cuda").id == second_ids[1]
        assert queue.claim_point(s, worker="c", lease_s=60) is None
        with pytest.raises(ValueError, match="lease_s must be a positive number of seconds, got lease_s=0"):
            queue.claim_point(s, worker="c", lease_s=0)
        progress = crud.sweep_progress(s, sweep_id=first)
    assert progress["running"] == 4 and progress["queued"] == 0


def test_heartbeat_and_lease_expiry(db_url: str, make_points) -> None:
    _, (pid,) = _sweep(db_url, make_points(1))
    t0 = datetime.now(timezone.utc)
    with get_sessionmaker(db_url)() as s:
        assert queue.claim_point(s, worker="a", lease_s=30, now=t0).id == pid
        assert queue.heartbeat(s, point_id=pid, worker="a", lease_s=600)
        assert _point(db_url, pid).lease_expires_at > t0 + timedelta(seconds=500)
        assert not queue.heartbeat(s, point_id=pid, worker="b", lease_s=600)
        assert queue.expire_leases(s, now=t0 + timedelta(seconds=60)) == 0  # renewed: still held
        assert queue.expire_leases(s, now=t0 + timedelta(seconds=700)) == 1
        point = _point(db_url, pid)
        assert point.status == "queued" and point.lease_owner is None and point.attempts == 1
        assert "lease of worker a expired" in point.error
        again = queue.claim_point(s, worker="b", lease_s=30)
        assert again.id == pid and again.attempts == 2
        # the first owner lost it: nothing it does lands
        assert not queue.heartbeat(s, point_id=pid, worker="a", lease_s=30)
        _store(s, pid, "a")
        assert not queue.complete_point(s, point_id=pid, worker="a")
        assert not queue.fail_point(s, point_id=pid, worker="a", error="late")
        assert not queue.release_point(s, point_id=pid, worker="a")
        assert _n_measurements(db_url) == 0
        _store(s, pid, "b")
        assert queue.complete_point(s, point_id=pid, worker="b")
    point = _point(db_url, pid)
    assert point.status == "done" and point.error is None and point.finished_at is not None
    assert _n_measurements(db_url) == 1
    with get_sessionmaker(db_url)() as s:
        sweep = crud.get_sweep(s, sweep_id=point.sweep_id)
        assert sweep.status == "done" and sweep.finished_at is not None


def test_bounded_retries_then_failed(db_url: str, make_points) -> None:
    sweep_id, (p_fail, p_expire) = _sweep(db_url, make_points(2, max_attempts=2))
    t0 = datetime.now(timezone.utc)
    with get_sessionmaker(db_url)() as s:
        for attempt in (1, 2):
            p = queue.claim_point(s, worker="w", lease_s=30)
            assert (p.id, p.attempts) == (p_fail, attempt)
            assert queue.fail_point(s, point_id=p.id, worker="w", error=f"OOM on attempt {attempt}")
        point = _point(db_url, p_fail)
        assert point.status == "failed" and point.error == "OOM on attempt 2" and point.attempts == 2

        for attempt in (1, 2):
            p = queue.claim_point(s, worker="w", lease_s=30, now=t0 + timedelta(seconds=100 * attempt))
            assert (p.id, p.attempts) == (p_expire, attempt)
        assert queue.expire_leases(s, now=t0 + timedelta(seconds=1000)) == 1
        point = _point(db_url, p_expire)
        assert point.status == "failed" and point.error.startswith("lease expired after 2 attempts")
        assert crud.get_sweep(s, sweep_id=sweep_id).status == "done"


def test_non_retryable_failure_and_release(db_url: str, make_points) -> None:
    _, (p1, p2) = _sweep(db_url, make_points(2))
    with get_sessionmaker(db_url)() as s:
        assert queue.claim_point(s, worker="w", lease_s=30).id == p1
        assert queue.release_point(s, point_id=p1, worker="w")
        point = _point(db_url, p1)
        assert (point.status, point.attempts, point.lease_owner, point.lease_expires_at) == ("queued", 0, None, None)
        assert queue.claim_point(s, worker="w", lease_s=30).id == p1  # released points keep their place
        assert queue.fail_point(s, point_id=p1, worker="w", error="ValueError: H=3", retryable=False)
        point = _point(db_url, p1)
        assert (point.status, point.attempts, point.error) == ("failed", 1, "ValueError: H=3")
        assert queue.claim_point(s, worker="w", lease_s=30).id == p2


def test_cancel_sweep(db_url: str, make_points) -> None:
    sweep_id, ids = _sweep(db_url, make_points(4))
    other_id, other_ids = _sweep(db_url, make_points(1))
    with get_sessionmaker(db_url)() as s:
        running = queue.claim_point(s, worker="w", lease_s=30)
        released = queue.claim_point(s, worker="v", lease_s=30)
        assert queue.cancel_sweep(s, sweep_id=sweep_id) == 2
        assert crud.get_sweep(s, sweep_id=sweep_id).status == "cancelled"
        assert queue.claim_point(s, worker="x", lease_s=30).id == other_ids[0]  # only the other sweep is left
        assert queue.claim_point(s, worker="x", lease_s=30) is None
        # a point given back after the cancel is cancelled too; a running one finishes and keeps its result
        assert queue.release_point(s, point_id=released.id, worker="v")
        assert _point(db_url, released.id).status == "cancelled"
        assert queue.refresh_sweep_status(s, sweep_id=sweep_id) == "cancelled"
        assert crud.get_sweep(s, sweep_id=sweep_id).finished_at is None  # a point is still running
        _store(s, running.id, "w")
        assert queue.complete_point(s, point_id=running.id, worker="w")
        sweep = crud.get_sweep(s, sweep_id=sweep_id)
        s.refresh(sweep)
        assert sweep.status == "cancelled" and sweep.finished_at is not None
        assert crud.sweep_progress(s, sweep_id=sweep_id) | {"total": 0} == {
            "queued": 0, "running": 0, "done": 1, "failed": 0, "skipped": 0, "cancelled": 3, "total": 0,
        }  # fmt: skip
        assert crud.list_results(s, sweep_id=sweep_id, status="done")[0][0]["median_ms"] == 2.0
        with pytest.raises(ValueError, match="no sweep with sweep_id=999"):
            queue.cancel_sweep(s, sweep_id=999)
        assert crud.get_sweep(s, sweep_id=other_id).status == "running"


# --- several processes ----------------------------------------------------------------------------------------


def _claim_until_empty(url: str, worker: str, barrier, results) -> None:  # type: ignore[no-untyped-def]
    """Child process: claim, store and complete points until none is left; report the ids."""
    maker = get_sessionmaker(url)
    barrier.wait(timeout=CHILD_TIMEOUT_S)
    claimed = []
    try:
        while True:
            with maker() as s:
                point = queue.claim_point(s, worker=worker, lease_s=300)
                if point is None:
                    break
                claimed.append(point.id)
                time.sleep(0.005)  # "run" the point outside any transaction, as a worker does, so claims interleave
                _store(s, point.id, worker)
                if not queue.complete_point(s, point_id=point.id, worker=worker):
                    raise AssertionError(f"{worker} lost the lease of point {point.id}")
        results.put((worker, claimed, None))
    except BaseException as exc:
        results.put((worker, claimed, repr(exc)))


def test_no_double_claim_across_processes(db_url: str, make_points) -> None:
    n_procs, n_points = 4, 48
    sweep_id, ids = _sweep(db_url, make_points(n_points))
    barrier, results = SPAWN.Barrier(n_procs), SPAWN.Queue()
    procs = [SPAWN.Process(target=_claim_until_empty, args=(db_url, f"w{i}", barrier, results)) for i in range(n_procs)]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=CHILD_TIMEOUT_S) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [r[2] for r in reports] == [None] * n_procs, reports
    claimed = [pid for _, ids_, _ in reports for pid in ids_]
    assert sorted(claimed) == ids, "every point claimed exactly once"
    with get_sessionmaker(db_url)() as s:
        progress = crud.sweep_progress(s, sweep_id=sweep_id)
        assert progress["done"] == n_points and progress["total"] == n_points
        assert set(s.execute(select(Point.attempts).where(Point.sweep_id == sweep_id)).scalars()) == {1}
        assert crud.get_sweep(s, sweep_id=sweep_id).status == "done"
    assert _n_measurements(db_url) == n_points


def _claim_and_wait(url: str, on_sigterm: str, ready) -> None:  # type: ignore[no-untyped-def]
    """Child process: claim one point and wait to be signalled, with a stored (uncommitted) measurement if asked."""
    maker = get_sessionmaker(url)
    session = maker()
    point = queue.claim_point(session, worker="child", lease_s=30)
    point_id = point.id

    def release(signum, frame):  # type: ignore[no-untyped-def]
        with maker() as s:
            queue.release_point(s, point_id=point_id, worker="child")
        os._exit(0)

    if on_sigterm == "release":
        session.close()  # no transaction open while it waits: the handler's release must not wait on this connection
        signal.signal(signal.SIGTERM, release)
    else:
        _store(session, point_id, "child")  # mid-store: the transaction is open when the process dies
    ready.put(point_id)
    time.sleep(CHILD_TIMEOUT_S)


def _start_child(url: str, on_sigterm: str) -> tuple[mp.Process, int]:
    ready = SPAWN.Queue()
    proc = SPAWN.Process(target=_claim_and_wait, args=(url, on_sigterm, ready))
    proc.start()
    return proc, ready.get(timeout=CHILD_TIMEOUT_S)


def test_sigterm_releases_point(db_url: str, make_points) -> None:
    _, (pid, _) = _sweep(db_url, make_points(2))
    proc, claimed = _start_child(db_url, "release")
    assert claimed == pid and _point(db_url, pid).lease_owner == "child"
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(timeout=CHILD_TIMEOUT_S)
    assert proc.exitcode == 0
    point = _point(db_url, pid)
    assert (point.status, point.attempts, point.lease_owner) == ("queued", 0, None)


def test_sigkill_mid_point_lease_expires(db_url: str, make_points) -> None:
    _, (pid,) = _sweep(db_url, make_points(1))
    proc, claimed = _start_child(db_url, "hold")
    assert claimed == pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=CHILD_TIMEOUT_S)
    assert proc.exitcode == -signal.SIGKILL
    with get_sessionmaker(db_url)() as s:
        assert queue.claim_point(s, worker="w", lease_s=30) is None  # its lease still runs
        later = datetime.now(timezone.utc) + timedelta(seconds=60)
        for _ in range(100):  # PostgreSQL ends the dead client's transaction (and its row locks) a moment later
            point = queue.claim_point(s, worker="w", lease_s=30, now=later)
            if point is not None:
                break
            time.sleep(0.1)
        assert point.id == pid and point.attempts == 2
        _store(s, pid, "w")
        assert queue.complete_point(s, point_id=pid, worker="w")
    assert _point(db_url, pid).status == "done"
    assert _n_measurements(db_url) == 1
