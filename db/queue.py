"""THE QUEUE: points wait in the `points` table and workers take them under a lease.

A worker claims the oldest queued point it can run (`claim_point`), keeps the lease alive with `heartbeat`, and
ends it with `complete_point`, `fail_point` (retried while attempts remain, then `failed` with its error) or
`release_point` (SIGTERM: back to the queue without using up an attempt). A lease that is not renewed expires
(`expire_leases`, also run by every claim) and the point goes back to the queue, so a worker killed mid-point
loses nothing. `cancel_sweep` withdraws the queued points of a sweep; running ones finish and are kept.

Concurrency: a claim locks the row it takes, with `SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL and inside
a `BEGIN IMMEDIATE` transaction on SQLite (one writer at a time, others wait on the busy timeout), so each point
is handed to exactly one worker. Locks are taken points first, then the sweep row, everywhere, so two queue
calls never wait on each other in a cycle.

Transactions: every function here commits before it returns, since other processes act on the queue state.
`claim_point` first commits any transaction the session has open and runs in a fresh one. The others join the
session's open transaction, or open a write transaction (`db.session.begin_write`) when there is none, and
commit it. So `complete_point` commits the measurement and profile stored in the same session just before it
(`db.crud` functions never commit): results and the `done` status land together, or not at all when the lease
was lost (the session is rolled back and it returns False). On SQLite, do not read in a session before calling
them outside `begin_write`: a read transaction that another process overtakes cannot be turned into a write
one ("database is locked"). Times are aware UTC, from the store's clock (`db.clock.store_now`): a worker's own clock
never decides whether a lease is live. `now=` exists for tests that move time forward.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.clock import store_now
from db.models import Point, Sweep
from db.session import begin_write, execute_rowcount
from db.types import as_utc

logger = logging.getLogger(__name__)

ACTIVE_SWEEP_STATUSES = ("queued", "running")
OPEN_POINT_STATUSES = ("queued", "running")


def _now(session: Session, now: datetime | None = None) -> datetime:
    """`now` (tests), else the store's clock; call it inside the write transaction."""
    return as_utc(now) if now is not None else store_now(session)


def _check_lease(lease_s: float) -> None:
    if not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got lease_s={lease_s!r}")


def _owned(session: Session, point_id: int, worker: str) -> Point | None:
    """The point if `worker` holds its lease (locked for update on PostgreSQL), else None."""
    stmt = (
        select(Point)
        .where(Point.id == point_id, Point.status == "running", Point.lease_owner == worker)
        .with_for_update(of=Point)
    )
    return session.execute(stmt).scalar_one_or_none()


def _renew(session: Session, point_id: int, worker: str, lease_s: float) -> bool:
    """Extend `worker`'s lease on the point to `lease_s` from the store's now, in the session's transaction (the
    UPDATE locks the point's row until it ends); False, nothing changed, when `worker` no longer holds it."""
    _check_lease(lease_s)
    matched = execute_rowcount(
        session,
        update(Point)
        .where(Point.id == point_id, Point.status == "running", Point.lease_owner == worker)
        .values(lease_expires_at=_now(session) + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False),
    )
    return matched == 1


def retake_lease(session: Session, *, point_id: int, worker: str, lease_s: float) -> bool:
    """In the write transaction that stores `worker`'s result of a point (opened here if none is): renew its lease,
    which also locks the point's row, before anything is written. No other worker can then claim the point or expire
    the lease until this transaction ends, so a result that waited for the store (spooled) is stored once or, when
    the point was lost meanwhile (False), not at all: never a second measurement, never a unique-key error."""
    begin_write(session)
    return _renew(session, point_id, worker, lease_s)


def _requeue_status(session: Session, sweep_id: int) -> str:
    status = session.execute(select(Sweep.status).where(Sweep.id == sweep_id)).scalar_one()
    return "cancelled" if status == "cancelled" else "queued"


def _clear_lease(point: Point) -> None:
    point.lease_owner = None
    point.lease_expires_at = None


def _refresh(session: Session, sweep_id: int, now: datetime) -> str:
    """Mark the sweep finished when none of its points is queued or running; returns its status."""
    sweep = session.get(Sweep, sweep_id, with_for_update=True, populate_existing=True)
    if sweep is None:
        raise ValueError(f"no sweep with sweep_id={sweep_id}")
    open_points = session.execute(
        select(func.count()).select_from(Point).where(Point.sweep_id == sweep_id, Point.status.in_(OPEN_POINT_STATUSES))
    ).scalar_one()
    if open_points == 0 and sweep.finished_at is None:
        if sweep.status != "cancelled":
            sweep.status = "done"
        sweep.finished_at = now
    elif open_points and sweep.status == "done":
        # points were put back (e.g. an operator re-queued failures): the sweep is live again
        sweep.status, sweep.finished_at = "running", None
    session.flush()
    return sweep.status


def _expire(session: Session, now: datetime) -> tuple[int, set[int]]:
    stmt = (
        select(Point)
        .where(Point.status == "running", Point.lease_expires_at < now)
        .order_by(Point.id)
        .with_for_update(skip_locked=True, of=Point)
    )
    expired = list(session.execute(stmt).scalars())
    sweeps: set[int] = set()
    for point in expired:
        owner = point.lease_owner
        if point.attempts >= point.max_attempts:
            point.status = "failed"
            point.error = f"lease expired after {point.attempts} attempts (last worker {owner})"
            point.finished_at = now
        else:
            point.status = _requeue_status(session, point.sweep_id)
            point.error = f"lease of worker {owner} expired (attempt {point.attempts} of {point.max_attempts})"
            if point.status == "cancelled":
                point.finished_at = now
        _clear_lease(point)
        sweeps.add(point.sweep_id)
        logger.warning("point %s: lease of %s expired, now %s", point.id, owner, point.status)
    session.flush()
    return len(expired), sweeps


def expire_leases(session: Session, *, now: datetime | None = None) -> int:
    """Return running points whose lease ran out to the queue (or fail them when out of attempts); commits.

    A point that ran out of attempts becomes `failed` with "lease expired after N attempts". Returns the number
    of points whose lease expired.
    """
    begin_write(session)
    try:
        now = _now(session, now)
        n, sweeps = _expire(session, now)
        for sweep_id in sorted(sweeps):
            _refresh(session, sweep_id, now)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return n


def claim_point(
    session: Session,
    *,
    worker: str,
    lease_s: float,
    max_W: int | None = None,
    device_kind: str | None = None,
    now: datetime | None = None,
    owner: str | None = None,
) -> Point | None:
    """Take the oldest queued point of a live sweep that this worker can run, under a lease; commits.

    Args:
        worker (str): the worker's unique name, recorded as the lease owner.
        lease_s (float): seconds until the lease expires unless `heartbeat` renews it.
        max_W (int, Optional): only points with `W <= max_W` (the devices this worker has). Default: `None`.
        device_kind (str, Optional): only points for this kind of device ("cuda" | "cpu") or for any.
            Default: `None` (every point).
        now (datetime, Optional): the current time (tests). Default: the store's clock.
        owner (str, Optional): claim only the sweeps owned by this token (`cpbench run` / `regress` working their
            own sweeps). Default: `None` (only sweeps without an owner).

    Returns:
        The claimed point (status `running`, `attempts` counted), or None when nothing is left for this worker.
        Expired leases are returned to the queue first, in the same transaction.
    """
    _check_lease(lease_s)
    if max_W is not None and max_W < 1:
        raise ValueError(f"max_W must be >= 1 or None, got max_W={max_W!r}")
    if session.in_transaction():
        # the claim must start its own write transaction (BEGIN IMMEDIATE on SQLite)
        session.commit()
    begin_write(session)
    try:
        now = _now(session, now)
        _, touched = _expire(session, now)
        stmt = (
            select(Point)
            .join(Sweep, Sweep.id == Point.sweep_id)
            .where(Point.status == "queued", Sweep.status.in_(ACTIVE_SWEEP_STATUSES))
            .order_by(Point.id)
            .limit(1)
            .with_for_update(skip_locked=True, of=Point)
        )
        if max_W is not None:
            stmt = stmt.where(Point.W <= max_W)  # noqa: SIM300  (W is a column, not a constant)
        if device_kind is not None:
            stmt = stmt.where((Point.device_kind.is_(None)) | (Point.device_kind == device_kind))
        stmt = stmt.where(Sweep.owner.is_(None) if owner is None else Sweep.owner == owner)
        point = session.execute(stmt).scalar_one_or_none()
        if point is not None:
            point.status = "running"
            point.lease_owner = worker
            point.lease_expires_at = now + timedelta(seconds=lease_s)
            point.attempts += 1
            point.claimed_at = now
            session.flush()
            session.execute(
                update(Sweep)
                .where(Sweep.id == point.sweep_id, Sweep.status == "queued")
                .values(status="running", started_at=now)
                .execution_options(synchronize_session=False)
            )
            touched.discard(point.sweep_id)
        for sweep_id in sorted(touched):
            _refresh(session, sweep_id, now)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    if point is not None:
        logger.debug("worker %s claimed point %s (attempt %s)", worker, point.id, point.attempts)
    return point


def heartbeat(session: Session, *, point_id: int, worker: str, lease_s: float) -> bool:
    """Extend `worker`'s lease on the point to `lease_s` from now; commits. False if the lease was lost."""
    _check_lease(lease_s)
    begin_write(session)
    try:
        renewed = _renew(session, point_id, worker, lease_s)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return renewed


def _finish(session: Session, point_id: int, worker: str, action: str) -> Point | None:
    point = _owned(session, point_id, worker)
    if point is None:
        logger.warning("worker %s cannot %s point %s: lease lost", worker, action, point_id)
        session.rollback()
    return point


@contextmanager
def _ending_attempt(session: Session, point_id: int, worker: str, action: str) -> Iterator[tuple[Point | None, datetime]]:
    """The write transaction that ends `worker`'s attempt at a point.

    Yields the point for the caller to set its outcome (with the store's time), or None (the session already rolled back) when `worker` no
    longer holds the lease. On a normal exit with a point: clears the lease, refreshes the sweep, commits; on an
    error: rolls back and re-raises.
    """
    begin_write(session)
    try:
        now = _now(session)
        point = _finish(session, point_id, worker, action)
        yield point, now
        if point is not None:
            _clear_lease(point)
            session.flush()
            _refresh(session, point.sweep_id, now)
            session.commit()
    except BaseException:
        session.rollback()
        raise


def complete_point(session: Session, *, point_id: int, worker: str) -> bool:
    """Mark the point `done`, together with whatever the session holds (its measurement); commits.

    Returns False, and rolls the session back (so no result of a lost lease is stored), when `worker` no longer
    holds the lease.
    """
    with _ending_attempt(session, point_id, worker, "complete") as (point, now):
        if point is None:
            return False
        point.status = "done"
        point.error = None
        point.finished_at = now
    return True


def fail_point(session: Session, *, point_id: int, worker: str, error: str, retryable: bool = True) -> bool:
    """End an attempt that failed with `error`; commits. False when `worker` no longer holds the lease.

    The point goes back to the queue while `retryable` and attempts remain, else it becomes `failed` with the
    error.
    """
    with _ending_attempt(session, point_id, worker, "fail") as (point, now):
        if point is None:
            return False
        point.error = error
        if retryable and point.attempts < point.max_attempts:
            point.status = _requeue_status(session, point.sweep_id)
        else:
            point.status = "failed"
        if point.status != "queued":
            point.finished_at = now
    logger.info("point %s attempt %s failed (%s): %s", point_id, point.attempts, point.status, error)
    return True


def release_point(session: Session, *, point_id: int, worker: str) -> bool:
    """Give the point back without using up an attempt (the worker is stopping); commits.

    False when `worker` no longer holds the lease. A point of a cancelled sweep becomes `cancelled` instead.
    """
    with _ending_attempt(session, point_id, worker, "release") as (point, now):
        if point is None:
            return False
        point.status = _requeue_status(session, point.sweep_id)
        point.attempts = max(point.attempts - 1, 0)
        if point.status == "cancelled":
            point.finished_at = now
    return True


def cancel_sweep(session: Session, *, sweep_id: int) -> int:
    """Cancel the sweep's queued points and the sweep; running points finish and keep their results; commits.

    Returns the number of points cancelled. Raises ValueError for an unknown sweep.
    """
    begin_write(session)
    try:
        now = _now(session)
        if session.execute(select(Sweep.id).where(Sweep.id == sweep_id)).scalar_one_or_none() is None:
            raise ValueError(f"no sweep with sweep_id={sweep_id}")
        matched = execute_rowcount(
            session,
            update(Point)
            .where(Point.sweep_id == sweep_id, Point.status == "queued")
            .values(status="cancelled", finished_at=now)
            .execution_options(synchronize_session=False),
        )
        session.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.status.in_(ACTIVE_SWEEP_STATUSES))
            .values(status="cancelled")
            .execution_options(synchronize_session=False)
        )
        _refresh(session, sweep_id, now)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return matched


def refresh_sweep_status(session: Session, *, sweep_id: int) -> str:
    """Mark the sweep `done` (or keep `cancelled`) with `finished_at` once no point is queued or running; commits.

    Returns the sweep's status.
    """
    begin_write(session)
    try:
        now = _now(session)
        status = _refresh(session, sweep_id, now)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return status
