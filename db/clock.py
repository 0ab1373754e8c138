"""The store's clock: lease times are compared on the database server's clock, never on a worker's.

`store_now(session)` reads it inside the session's transaction: `now()` on PostgreSQL (the transaction's start,
the same instant for every statement of it), `strftime('%Y-%m-%d %H:%M:%f', 'now')` on SQLite (the clock of the
host that holds the file, which every process using the file shares). Call it after `db.session.begin_write` on
SQLite, so that the read does not open a plain read transaction first.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text
from sqlalchemy.orm import Session

from db.types import as_utc

__all__ = ["store_now"]


def store_now(session: Session) -> datetime:
    """The current time on the store's clock, as an aware UTC datetime."""
    if session.get_bind().dialect.name == "sqlite":
        raw = session.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return datetime.fromisoformat(raw).replace(tzinfo=timezone.utc)
    value = session.execute(text("SELECT now()")).scalar_one()
    return as_utc(value)
