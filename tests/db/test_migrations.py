"""Migrations and settings of the store.

Scenarios: upgrade of an empty database reaches head and leaves no difference between the models and the schema;
`require_migrated` refuses an empty database with the command to run and accepts a migrated one; downgrade to
base and upgrade again; the Alembic config works from any cwd; `DbSettings` defaults and URL normalisation; no test
builds a store from the models' metadata instead of the migrations.
"""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

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


def test_0004_adds_by_direction_to_a_store_with_profiles(empty_db_url: str, make_points) -> None:
    """A store at 0003 holding a profile upgrades to head: the profile is kept, its `by_direction` NULL, and a
    training step's split can be stored and read back (via the results rows the API serves)."""
    from db import crud, queue
    from db.models import Profile

    upgrade(empty_db_url)
    with session_scope(empty_db_url) as s:
        sweep_id = crud.create_sweep(s, name="t", tags=[], spec={}, points=make_points(2)).id
    with get_sessionmaker(empty_db_url)() as s:
        old = queue.claim_point(s, worker="w", lease_s=30)
        crud.store_profile(s, point_id=old.id, collectives={"all_gather": 2}, collective_bytes={"all_gather": 64},
                           host_syncs=0, sync_events={}, kernel_launches=0, peak_memory_bytes=None)
        s.commit()
    dispose_engine(empty_db_url)
    assert downgrade(empty_db_url, "0003_dash") == "0003_dash"   # the store as 0003 left it, with its profile
    with get_engine(empty_db_url).connect() as conn:
        assert "by_direction" not in {c["name"] for c in inspect(conn).get_columns("profiles")}
        assert conn.exec_driver_sql("SELECT count(*) FROM profiles").scalar() == 1
    dispose_engine(empty_db_url)

    assert upgrade(empty_db_url) == head_revision()
    split = {"fwd": {"collectives": {"all_gather": 1}, "collective_bytes": {"all_gather": 32}, "host_syncs": 0},
             "bwd": {"collectives": {"all_gather": 1}, "collective_bytes": {"all_gather": 32}, "host_syncs": 0}}
    with get_sessionmaker(empty_db_url)() as s:
        kept = s.query(Profile).one()
        assert kept.point_id == old.id and kept.collectives == {"all_gather": 2} and kept.by_direction is None
        new = queue.claim_point(s, worker="w", lease_s=30)
        crud.store_profile(s, point_id=new.id, collectives={"all_gather": 2}, collective_bytes={"all_gather": 64},
                           host_syncs=0, sync_events={}, kernel_launches=0, peak_memory_bytes=None, by_direction=split)
        s.commit()
        rows, _ = crud.list_results(s, sweep_id=sweep_id)
    assert [r["by_direction"] for r in rows] == [None, split]


def test_tests_build_stores_by_migrations() -> None:
    """Every store of the tests is migrated (`migrated_sqlite` in tests/conftest.py), as users' stores are."""
    tests = Path(__file__).resolve().parents[1]
    call = "create_" + "all("  # in two halves, so that this file does not find itself
    assert [str(p.relative_to(tests)) for p in sorted(tests.rglob("*.py")) if call in p.read_text()] == []


def test_0005_marks_measurements_that_did_not_converge(empty_db_url: str, make_points) -> None:
    """A store at 0004 holding measurements that stopped on "timeout", "noise" and "max_samples" upgrades to head:
    the first and the last are marked unreliable with their stop reason and n, the second is not; the results rows
    carry the flag. Back to 0004 the column goes, and a second upgrade marks the same rows again (on SQLite and, with
    the `postgres` marker, on PostgreSQL)."""
    from db import crud

    assert upgrade(empty_db_url, "0004_prof") == "0004_prof"
    with session_scope(empty_db_url) as s:
        sweep_id = crud.create_sweep(s, name="t", tags=[], spec={}, points=make_points(3)).id
    with get_engine(empty_db_url).begin() as conn:  # rows as a 0004 worker wrote them (no `unreliable` column yet)
        for pid, reason in zip(
            [r[0] for r in conn.exec_driver_sql(f"SELECT id FROM points WHERE sweep_id = {sweep_id} ORDER BY idx")],
            ("timeout", "noise", "max_samples"), strict=True):
            conn.execute(  # the samples as a bound parameter: `x''` is a bit string on PostgreSQL, bytea on SQLite
                text("INSERT INTO measurements (point_id, clock, samples, n, median_ms, p10_ms, p90_ms, iqr_ms, mean_ms, "
                     "min_ms, max_ms, stop_reason, configs, report, created_at) VALUES (:pid, 'wall', :samples, 3, 1, "
                     "0.8, 140, 50, 20, 0.7, 150, :reason, '{}', '{}', '2026-12-01 00:00:00')"),
                {"pid": pid, "samples": b"", "reason": reason})
    dispose_engine(empty_db_url)
    marked = ["stopped on timeout before the noise target (n=3)", None,
              "stopped on max_samples before the noise target (n=3)"]
    assert upgrade(empty_db_url) == head_revision()
    with get_sessionmaker(empty_db_url)() as s:
        rows, _ = crud.list_results(s, sweep_id=sweep_id)
        assert [r["unreliable"] for r in rows] == marked
    dispose_engine(empty_db_url)
    assert downgrade(empty_db_url, "0004_prof") == "0004_prof"
    with get_engine(empty_db_url).connect() as conn:
        assert "unreliable" not in {c["name"] for c in inspect(conn).get_columns("measurements")}
    dispose_engine(empty_db_url)
    assert upgrade(empty_db_url) == head_revision()
    with get_sessionmaker(empty_db_url)() as s:
        assert [r["unreliable"] for r in crud.list_results(s, sweep_id=sweep_id)[0]] == marked


def test_0006_records_the_single_host_topology_of_older_measurements(empty_db_url: str, make_points) -> None:
    """A store at 0005 holding measurements of W=1 and W=2 points (a CPU and a GPU environment) upgrades to head:
    each is one host with W ranks; the interconnect is "none" at W=1, "loopback" for the CPU gang and unknown
    (NULL) for the GPU gang; the results rows carry the columns."""
    from db import crud

    assert upgrade(empty_db_url, "0005_unrel") == "0005_unrel"
    with session_scope(empty_db_url) as s:
        points = [*make_points(1), *make_points(2, start=1, W=2)]
        sweep_id = crud.create_sweep(s, name="t", tags=[], spec={}, points=points).id
        base = {"torch": "2", "python": "3", "cpbench": "0", "host": "h"}
        envs = [crud.get_or_create_environment(s, facts={**base, "device_name": d}).id for d in ("cpu", "cpu", "NVIDIA H200")]
    with get_engine(empty_db_url).begin() as conn:  # rows as a 0005 worker wrote them (no topology columns yet)
        ids = [r[0] for r in conn.exec_driver_sql(f"SELECT id FROM points WHERE sweep_id = {sweep_id} ORDER BY idx")]
        for pid, env in zip(ids, envs, strict=True):
            conn.execute(
                text("INSERT INTO measurements (point_id, environment_id, clock, samples, n, median_ms, p10_ms, p90_ms, "
                     "iqr_ms, mean_ms, min_ms, max_ms, stop_reason, configs, report, created_at) VALUES (:pid, :env, "
                     "'wall', :samples, 1, 1, 1, 1, 0, 1, 1, 1, 'noise', '{}', '{}', '2026-12-01 00:00:00')"),
                {"pid": pid, "env": env, "samples": b""})
    dispose_engine(empty_db_url)
    assert upgrade(empty_db_url) == head_revision()
    with get_sessionmaker(empty_db_url)() as s:
        rows, _ = crud.list_results(s, sweep_id=sweep_id)
        got = [(r["W"], r["hosts"], r["ranks_per_host"], r["interconnect"]) for r in sorted(rows, key=lambda r: r["idx"])]
    assert got == [(1, 1, 1, "none"), (2, 1, 2, "loopback"), (2, 1, 2, None)]
