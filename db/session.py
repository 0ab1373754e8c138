"""Engines and sessions for the store: one engine per URL and process, SQLite tuned for several writer processes.

SQLite (the embedded default): the file's folder is created, the database runs in WAL mode (readers never block
the writer), waits up to 30 s for the write lock (`busy_timeout`) and enforces foreign keys. sqlite3's own
transaction handling is switched off and SQLAlchemy emits `BEGIN` itself, so a write transaction can be opened
with `BEGIN IMMEDIATE` (`begin_write`): it takes the write lock up front, and a read-then-write transaction can
then never fail on a stale snapshot. PostgreSQL: plain engine with `pool_pre_ping`. JSON columns are read with
pydantic-core's parser (`json_loads`).

Sessions come from `get_sessionmaker()` with `expire_on_commit=False`, so objects returned from a finished
`session_scope()` stay readable. `wait_s` (the API server's `CPBENCH_STORE_WAIT_S`) gives an engine of its own that
waits at most that long for SQLite's write lock, for a PostgreSQL connection and for a PostgreSQL lock: a request
then fails fast (the server answers 503) where a worker, which rides out outages, waits the full busy timeout.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from pydantic_core import from_json
from sqlalchemy import CursorResult, Engine, Executable, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from db.settings import get_db_settings, normalize_url

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 30.0
_IMMEDIATE = "cpbench_begin_immediate"  # connection execution option read by the SQLite `begin` hook

_lock = threading.Lock()
_engines: dict[tuple[int, str, float | None], Engine] = {}
_makers: dict[tuple[int, str, float | None], sessionmaker[Session]] = {}


def resolve_url(url: str | None = None) -> str:
    """`url`, or the configured `CPBENCH_DATABASE_URL`, with the PostgreSQL driver normalised."""
    return normalize_url(url) if url else get_db_settings().DATABASE_URL


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL, or None for an in-memory database."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def json_loads(text: str | bytes) -> Any:
    """A JSON column's value from its stored text: pydantic-core's parser (about 3x faster than `json.loads` on the
    results' params, configs and reports), or `json.loads` for what it refuses (a lone surrogate's escape)."""
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


def _create_engine(url: str, wait_s: float | None = None) -> Engine:
    if not is_sqlite(url):
        if wait_s is None:
            return create_engine(url, pool_pre_ping=True, json_deserializer=json_loads)
        options = f"-c lock_timeout={int(wait_s * 1000)}"
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_timeout=wait_s,
            connect_args={"connect_timeout": max(1, round(wait_s)), "options": options},
            json_deserializer=json_loads,
        )
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    busy_s = SQLITE_BUSY_TIMEOUT_S if wait_s is None else min(wait_s, SQLITE_BUSY_TIMEOUT_S)
    engine = create_engine(url, connect_args={"timeout": busy_s, "check_same_thread": False}, json_deserializer=json_loads)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # stop sqlite3 from emitting BEGIN itself (it would skip SELECTs); the `begin` hook below does it
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # the busy timeout comes first so that switching to WAL waits for other processes too
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_IMMEDIATE) else "BEGIN")

    return engine


def get_engine(url: str | None = None, *, wait_s: float | None = None) -> Engine:
    """The engine for `url` (default: `CPBENCH_DATABASE_URL`), created once per URL, `wait_s` and process."""
    url = resolve_url(url)
    key = (os.getpid(), url, wait_s)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _create_engine(url, wait_s)
            logger.debug("engine created for %s", engine.url.render_as_string(hide_password=True))
        return engine


def get_sessionmaker(url: str | None = None, *, wait_s: float | None = None) -> sessionmaker[Session]:
    """A sessionmaker bound to `get_engine(url, wait_s=wait_s)`; sessions keep loaded attributes after commit."""
    url = resolve_url(url)
    key = (os.getpid(), url, wait_s)
    engine = get_engine(url, wait_s=wait_s)
    with _lock:
        maker = _makers.get(key)
        if maker is None:
            maker = _makers[key] = sessionmaker(bind=engine, expire_on_commit=False)
        return maker


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session that commits when the block ends normally and rolls back when it raises."""
    session = get_sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def begin_write(session: Session) -> None:
    """Open the session's transaction as a write transaction unless one is already open.

    On SQLite this is `BEGIN IMMEDIATE`: the write lock is taken now (waiting up to the busy timeout), so
    the reads that follow see the latest data and the writes cannot fail half-way. Elsewhere a plain BEGIN.
    """
    if not session.in_transaction():
        session.connection(execution_options={_IMMEDIATE: True})


def execute_rowcount(session: Session, statement: Executable) -> int:
    """Execute an UPDATE or DELETE in `session`; the number of rows it matched."""
    result = cast(CursorResult[Any], session.execute(statement))  # a DML statement's result is a CursorResult
    return result.rowcount


def dispose_engine(url: str | None = None) -> None:
    """Close the pooled connections of `url`'s engines in this process and forget them (tests, database drops)."""
    url = resolve_url(url)
    with _lock:
        keys = [key for key in _engines if key[:2] == (os.getpid(), url)]
        engines = [_engines.pop(key) for key in keys]
        for key in keys:
            _makers.pop(key, None)
    for engine in engines:
        engine.dispose()
