"""Owned sweeps in the queue: a sweep created with an `owner` token is claimed only by a worker claiming with that
token, and such a worker claims nothing else (SQLite and PostgreSQL).

Scenarios: an owned sweep queued before an open one: a worker without a token skips the owned points and takes the
open ones; the owner takes its own points (in order) and never the open ones; another token gets nothing.
"""

from __future__ import annotations

from db import crud, queue
from db.session import get_sessionmaker, session_scope


def _sweep(url: str, points: list[dict], owner: str | None = None) -> list[int]:
    with session_scope(url) as s:
        sweep = crud.create_sweep(s, name="q", tags=[], spec={}, points=points, owner=owner)
        assert sweep.owner == owner
        return [p.id for p in sweep.points]


def test_owned_sweep_claimed_only_by_its_owner(db_url: str, make_points) -> None:
    owned = _sweep(db_url, make_points(3), owner="run:host:1:abcd")
    open_ids = _sweep(db_url, make_points(2))
    with get_sessionmaker(db_url)() as s:
        assert queue.claim_point(s, worker="other", lease_s=60, owner="run:host:2:ffff") is None
        # a plain worker comes to the owned sweep first in queue order, and passes it by
        got = [queue.claim_point(s, worker="plain", lease_s=60) for _ in range(3)]
        assert [g.id if g else None for g in got] == [*open_ids, None]
        mine = [queue.claim_point(s, worker="runner", lease_s=60, owner="run:host:1:abcd") for _ in range(4)]
        assert [m.id if m else None for m in mine] == [*owned, None]
        assert {m.lease_owner for m in mine if m} == {"runner"}
