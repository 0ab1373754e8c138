"""Fixtures of the API tests: a migrated SQLite store per module (a copy of the session's migrated template), the app built on it with a known token, served
by a real uvicorn on 127.0.0.1 (`bench_server.live.LiveServer`), and an httpx client with and without the token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from db.session import dispose_engine

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory, migrated_sqlite: Callable[[Path], str]) -> Iterator[str]:
    url = migrated_sqlite(tmp_path_factory.mktemp("api"))
    yield url
    dispose_engine(url)


@pytest.fixture(scope="module")
def server(store_url: str) -> Iterator[LiveServer]:
    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN))
    with LiveServer(app) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture
def auth() -> dict[str, str]:
    return dict(AUTH)
