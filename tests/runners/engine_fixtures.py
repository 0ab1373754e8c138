"""Fixtures of the engine tests (imported by the test modules that use them; the folder is shared, so no conftest).

- `store_url`: a migrated SQLite store in the test's tmp dir (a copy of the session's migrated template,
  `migrated_sqlite` in tests/conftest.py), with `CPBENCH_ARTIFACT_DIR` beside it.
- `pg_store_url`: the same on a fresh database of the PostgreSQL server at CPBENCH_TEST_POSTGRES_URL (dropped after).
- `demo_spec_path`: runners/suites/demo.yaml.
- `write_spec(tmp_path, **overrides)`: a small sweep spec file (one op, `none` at W=1 by default).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEMO_SPEC = REPO / "runners" / "suites" / "demo.yaml"

# spawned ranks and CLI subprocesses must find the repo's packages
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def _settings_reset() -> None:
    from db.settings import get_db_settings
    from runners.settings import get_worker_settings

    get_db_settings.cache_clear()
    get_worker_settings.cache_clear()


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_sqlite: Callable[[Path], str]) -> Iterator[str]:
    from db.session import dispose_engine

    url = migrated_sqlite(tmp_path / "store")
    monkeypatch.setenv("CPBENCH_ARTIFACT_DIR", str(tmp_path / "artifacts"))
    _settings_reset()
    yield url
    dispose_engine(url)
    _settings_reset()


@pytest.fixture
def pg_store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from db.migrate import upgrade
    from tests.utils.postgres import ScratchDatabase

    database = ScratchDatabase("cpbench_runners")
    monkeypatch.setenv("CPBENCH_ARTIFACT_DIR", str(tmp_path / "artifacts"))
    _settings_reset()
    try:
        upgrade(database.url)
        yield database.url
    finally:
        database.drop()
        _settings_reset()


@pytest.fixture
def demo_spec_path() -> Path:
    return DEMO_SPEC


def write_spec(tmp_path: Path, name: str = "spec.yaml", **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "name": "tiny",
        "ops": ["gdn"],
        "modes": ["none"],
        "backends": ["torch"],
        "axes": {"B": 1, "T": 128, "H": 2, "K": 32, "V": 32, "lb": -1.0, "W": 1, "dtype": "float32"},
        "timing": {"min_samples": 2, "max_samples": 4, "min_time_s": 0.0, "max_rel_iqr": 0.5, "timeout_s": 1.0,
                   "warmup_s": 0.0, "flush_l2": False},
        "check": {"reference_tokens": 64},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k] = {**spec[k], **v}
        else:
            spec[k] = v
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path
