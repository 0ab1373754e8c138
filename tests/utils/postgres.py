"""Scratch PostgreSQL databases for the tests, on the server at CPBENCH_TEST_POSTGRES_URL (`./dev test` starts one).

`server_url()` skips the test when no server is configured, except under CI (`CI` set), where a missing server
is a failure: CI must never pass by skipping the PostgreSQL half of the suite.
"""

from __future__ import annotations

import os
import uuid
from typing import NoReturn

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from db.session import dispose_engine
from db.settings import normalize_url

__all__ = ["ScratchDatabase", "missing_postgres", "server_url"]


def missing_postgres(what: str, under_ci: str) -> NoReturn:
    """A PostgreSQL part is missing: skip the test, except under CI (`CI` set), where it fails with `under_ci`."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} under CI: {under_ci}")
    pytest.skip(what)


def server_url() -> str:
    server = os.environ.get("CPBENCH_TEST_POSTGRES_URL")
    if not server:
        missing_postgres("CPBENCH_TEST_POSTGRES_URL not set", "`./dev test` must start PostgreSQL")
    return normalize_url(server)


class ScratchDatabase:
    """A fresh database on the test server (`prefix` + a random suffix); `drop()` removes it with its connections."""

    def __init__(self, prefix: str = "cpbench_test") -> None:
        server = server_url()
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.url = make_url(server).set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        dispose_engine(self.url)
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.admin.dispose()
