"""Column types shared by the models: `UTCDateTime`, a timezone-aware UTC datetime on every backend.

SQLite has no timezone-aware type and hands back naive datetimes; PostgreSQL hands back the session's zone.
`UTCDateTime` stores UTC (naive on SQLite, `timestamptz` on PostgreSQL) and always returns aware UTC values,
so comparisons such as `lease_expires_at < now` mean the same thing on both. Naive inputs are taken as UTC.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, overload

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """`value` as an aware UTC datetime (a naive one is taken to be UTC already)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that reads and writes aware UTC datetimes on SQLite and PostgreSQL alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise ValueError(f"UTCDateTime expects a datetime, got value={value!r}")
        utc = as_utc(value)
        # SQLite keeps the text form, which must be naive UTC so that string order is time order
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return as_utc(value)
