"""Fixtures of the dashboard tests: one migrated SQLite store per module (a copy of the session's migrated template,
`migrated_sqlite` in tests/conftest.py), seeded through `db.crud`
(`tests.dashboards.seed`), and a session on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from db.session import dispose_engine, get_sessionmaker
from tests.dashboards.seed import Seeded, seed_store


@pytest.fixture(scope="module")
def seeded_url(tmp_path_factory: pytest.TempPathFactory, migrated_sqlite: Callable[[Path], str]) -> Iterator[str]:
    url = migrated_sqlite(tmp_path_factory.mktemp("dash"))
    yield url
    dispose_engine(url)


@pytest.fixture(scope="module")
def seeded(seeded_url: str) -> Seeded:
    return seed_store(seeded_url)


@pytest.fixture
def session(seeded_url: str, seeded: Seeded) -> Iterator[Session]:
    with get_sessionmaker(seeded_url)() as s:
        yield s
