"""Leases on the store's clock (issue 17 §7), on SQLite and PostgreSQL: a worker whose own clock runs 90 s (or a
day) ahead cannot take a live lease from its holder, and a lease's expiry is the store's now plus the lease."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from db import crud, queue
from db.clock import store_now
from db.session import session_scope


class _FastClock(datetime):
    """A host clock one day ahead (what a worker with a wrong clock would read)."""

    @classmethod
    def now(cls, tz=None):  # type: ignore[override]
        return datetime.now(tz) + timedelta(days=1)


def test_lease_expiry_uses_the_store_clock_not_the_host_clock(db_url: str, make_points,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with session_scope(db_url) as s:
        sweep = crud.create_sweep(s, name="clock", tags=[], spec={}, points=make_points(1))
        (pid,) = [p.id for p in sweep.points]
    with session_scope(db_url) as s:
        held = queue.claim_point(s, worker="holder", lease_s=30)
        assert held is not None and held.id == pid
        now = store_now(s)
        assert timedelta(seconds=25) < held.lease_expires_at - now <= timedelta(seconds=31)
    for module in (queue, crud):  # whatever a module might read as "now", it is a day late here
        monkeypatch.setattr(module, "datetime", _FastClock, raising=False)
    with session_scope(db_url) as s:
        assert queue.claim_point(s, worker="skewed", lease_s=30) is None
        assert queue.expire_leases(s) == 0
    with session_scope(db_url) as s:
        assert queue.heartbeat(s, point_id=pid, worker="holder", lease_s=30)
        assert queue.complete_point(s, point_id=pid, worker="holder")


def test_store_now_is_aware_utc(db_url: str) -> None:
    with session_scope(db_url) as s:
        now = store_now(s)
    assert now.tzinfo is not None and abs(now - datetime.now(timezone.utc)) < timedelta(minutes=5)
