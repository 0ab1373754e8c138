"""Migrations and settings of the store.

Scenarios: upgrade of an empty database reaches head and leaves no difference between the models and the schema;
`require_migrated` refuses an empty database with the command to run and accepts a migrated one; downgrade to
base and upgrade again; the Alembic config works from any cwd; `DbSettings` defaults and URL normalisation.
"""

from __future__ import annotations

from datetime import timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

import db.models  # noqa: F401
from db.base import Base
from db.errors import StoreNotMigratedError
from db.migrate import current_revision, downgrade, head_revision, require_migrated, safe_url, upgrade
from db.session import dispose_engine, get_engine, get_sessionmaker, session_scope
from db.settings import DbSettings, get_db_settings, normalize_url


def test_upgrade_from_empty(empty_db_url: str) -> None:
    head = head_revision()
    assert current_revision(empty_db_url) is None
    with pytest.raises(StoreNotMigratedError) as info:
        require_migrated(empty_db_url)
    assert str(info.value) == (
        f"database at {safe_url(empty_db_url)} is not migrated (at empty, head is {head}): run `cpbench db upgrade`"
    )
    assert isinstance(info.value, RuntimeError)

    assert upgrade(empty_db_url) == head
    assert current_revision(empty_db_url) == head
    require_migrated(empty_db_url)
    with get_engine(empty_db_url).connect() as conn:
        assert set(Base.metadata.tables) <= set(inspect(conn).get_table_names())
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"

    assert downgrade(empty_db_url, "base") is None
    with pytest.raises(StoreNotMigratedError, match="at empty"):
        require_migrated(empty_db_url)
    assert upgrade(empty_db_url) == head


def test_require_migrated_names_behind_revision(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    with get_engine(url).begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0000'")
    with pytest.raises(StoreNotMigratedError, match=r"\(at 0000, head is .*\): run `cpbench db upgrade`"):
        require_migrated(url)


def test_require_migrated_does_not_create_sqlite_file(tmp_path) -> None:
    path = tmp_path / "missing" / "cpbench.db"
    with pytest.raises(StoreNotMigratedError):
        require_migrated(f"sqlite:///{path}")
    assert not path.exists()


def test_upgrade_from_another_cwd_and_default_url(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CPBENCH_DATABASE_URL", raising=False)
    get_db_settings.cache_clear()
    try:
        expected = f"sqlite:///{tmp_path / '.cpbench' / 'cpbench.db'}"
        default_url = get_db_settings().DATABASE_URL
        assert default_url == expected
        assert upgrade() == head_revision()  # the default store, created under the cwd
        assert (tmp_path / ".cpbench" / "cpbench.db").exists()
        require_migrated()
        with session_scope() as s:
            assert s.get_bind().url.database == str(tmp_path / ".cpbench" / "cpbench.db")
    finally:
        dispose_engine()
        get_db_settings.cache_clear()


def test_settings_from_environment(monkeypatch) -> None:
    monkeypatch.setenv("CPBENCH_DATABASE_URL", "postgresql://u:secret@db:5432/cpbench")
    monkeypatch.setenv("CPBENCH_ARTIFACT_DIR", "/data/artifacts")
    settings = DbSettings()
    assert settings.DATABASE_URL == "postgresql+psycopg://u:secret@db:5432/cpbench"
    assert str(settings.ARTIFACT_DIR) == "/data/artifacts"
    assert normalize_url("postgres://h/d") == "postgresql+psycopg://h/d"
    assert normalize_url("postgresql+psycopg://h/d") == "postgresql+psycopg://h/d"
    assert normalize_url("sqlite:///x.db") == "sqlite:///x.db"
    assert safe_url(settings.DATABASE_URL) == "postgresql+psycopg://u:***@db:5432/cpbench"


def test_sqlite_engine_pragmas(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'deep' / 'dir' / 'c.db'}"
    engine = get_engine(url)
    assert get_engine(url) is engine
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_timestamps_are_aware_utc(db_url: str, make_points) -> None:
    from db import crud

    with session_scope(db_url) as s:
        sweep_id = crud.create_sweep(s, name="t", tags=[], spec={}, points=make_points(1)).id
    with get_sessionmaker(db_url)() as s:
        sweep = crud.get_sweep(s, sweep_id=sweep_id)
        assert sweep is not None and sweep.created_at.tzinfo is not None
        assert sweep.created_at.utcoffset() == timezone.utc.utcoffset(None)
