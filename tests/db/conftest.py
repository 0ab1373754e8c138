"""Fixtures for the store's tests: migrated databases on SQLite and on PostgreSQL, and point factories.

- `db_url`: a migrated store, parametrised over a fresh SQLite file per test (a copy of the session's migrated
  template, `migrated_sqlite` in tests/conftest.py) and PostgreSQL (marked `postgres`:
  one fresh database per test module on the server at CPBENCH_TEST_POSTGRES_URL, emptied after each test and
  dropped after the module).
- `empty_db_url`: the same two backends, never migrated (a fresh PostgreSQL database per test).
- `session`: a session on `db_url`, closed after the test.
- `make_points(n, start=0, **overrides)`: point dicts for `crud.create_sweep` (idx from `start`), with distinct keys
  and ascending T.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from db.base import Base
from db.migrate import upgrade
from db.session import dispose_engine, get_sessionmaker
from tests.utils.postgres import ScratchDatabase

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    database = ScratchDatabase()
    try:
        upgrade(database.url)
        yield database.url
    finally:
        database.drop()


def _empty_pg(url: str) -> None:
    dispose_engine(url)
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    engine = create_engine(url)
    with engine.begin() as conn:
        # a session a failed test left open would block TRUNCATE
        conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        conn.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
        conn.exec_driver_sql(f"TRUNCATE TABLE {tables} RESTART IDENTITY CASCADE")
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Any, migrated_sqlite: Callable[[Path], str]) -> Iterator[str]:
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "store")
        yield url
        dispose_engine(url)
    else:
        url = request.getfixturevalue("pg_module_url")
        try:
            yield url
        finally:
            _empty_pg(url)


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'empty' / 'cpbench.db'}"
        yield url
        dispose_engine(url)
    else:
        database = ScratchDatabase()
        try:
            yield database.url
        finally:
            database.drop()


@pytest.fixture
def session(db_url: str) -> Iterator[Session]:
    with get_sessionmaker(db_url)() as s:
        yield s


def point_dicts(n: int, *, start: int = 0, **overrides: Any) -> list[dict[str, Any]]:
    points = []
    for i in range(start, start + n):
        p: dict[str, Any] = {
            "idx": i, "op": "gdn", "mode": "none", "backend": "torch", "B": 1, "T": 64 * (i + 1), "H": 4, "K": 32,
            "V": 32, "lb": -2.0, "W": 1, "layout": "contiguous", "direction": "fwd", "dtype": "float32", "seed": i,
        }  # fmt: skip
        p.update(overrides)
        p["key"] = "/".join(f"{k}={p[k]}" for k in ("op", "mode", "backend", "B", "T", "H", "K", "V", "lb", "W", "dtype"))
        p["params"] = {k: p[k] for k in ("B", "T", "H", "K", "V", "lb", "W", "layout", "direction", "dtype")}
        points.append(p)
    return points


@pytest.fixture
def make_points() -> Callable[..., list[dict[str, Any]]]:
    return point_dicts
