"""Test-wide setup: the Triton interpreter on CPU, gloo on loopback, seeds, migrated stores, and the markers' skip
rules.

Stores are built the way a user builds one, by the Alembic migrations (`db.migrate.upgrade`, what `cpbench db
upgrade` runs), never from the models' metadata: `migrated_sqlite` migrates one SQLite file per test session (per xdist
worker) and copies it wherever a test or fixture needs a fresh store.

`TRITON_INTERPRET=1` must be in the environment before any `@triton.jit` runs, so it is set here, before
any kernel module is imported (../shared/anchors/cpu-feasibility.md §1). Spawned ranks inherit it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

if not os.environ.get("CPBENCH_TEST_GPU"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import pytest  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    from kernels.interpreter import patch_bf16_dot

    patch_bf16_dot()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], str]:
    """`copy(folder)`: a fresh SQLite store at the head revision in `folder` (created), as its URL. The migrations
    run once per session into a template file; each call copies it."""
    from db.migrate import upgrade
    from db.session import dispose_engine

    template = tmp_path_factory.mktemp("migrated") / "cpbench.db"
    upgrade(f"sqlite:///{template}")
    dispose_engine(f"sqlite:///{template}")  # the last connection closed: the WAL is checkpointed into the file
    assert not template.with_name("cpbench.db-wal").exists()

    def copy(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{shutil.copyfile(template, folder / 'cpbench.db')}"

    return copy


@pytest.fixture
def session(migrated_sqlite: Callable[[Path], str], tmp_path: Path) -> Iterator[Session]:
    """A session on a fresh migrated SQLite store (tests/db and tests/dashboards override this with their file or
    PostgreSQL stores)."""
    from db.session import dispose_engine, get_sessionmaker

    url = migrated_sqlite(tmp_path / "store")
    with get_sessionmaker(url)() as s:
        yield s
    dispose_engine(url)


@pytest.fixture
def plugin_modules(monkeypatch: pytest.MonkeyPatch):
    """`allow("pkg.,other.mod")` sets CPBENCH_PLUGIN_MODULES for this test (and the ranks it spawns): the modules a
    spec's `module:object` backend may import (`runners.plugins.refusal`)."""
    from runners.settings import get_worker_settings

    def allow(value: str) -> None:
        monkeypatch.setenv("CPBENCH_PLUGIN_MODULES", value)
        get_worker_settings.cache_clear()

    yield allow
    monkeypatch.delenv("CPBENCH_PLUGIN_MODULES", raising=False)
    get_worker_settings.cache_clear()


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(42)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what this machine cannot run, except under CI (`CI` set): there a missing PostgreSQL or browser must
    fail the run (`./dev test` provides both), never pass it by skipping; only the GPU tests are skipped, and the
    heavy ones (minutes under the Triton interpreter) unless CPBENCH_TEST_HEAVY or CPBENCH_TEST_GPU is set."""
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    heavy_ok = os.environ.get("CPBENCH_TEST_HEAVY") or os.environ.get("CPBENCH_TEST_GPU")
    skip_heavy = pytest.mark.skip(reason="minutes under the Triton interpreter: set CPBENCH_TEST_HEAVY=1")
    skip_pg = pytest.mark.skip(reason="CPBENCH_TEST_POSTGRES_URL not set")
    skip_browser = pytest.mark.skip(reason="no /usr/bin/chromium or playwright")
    try:
        import playwright  # noqa: F401

        have_pw = True
    except ImportError:
        have_pw = False
    local = not os.environ.get("CI")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "heavy" in item.keywords and not heavy_ok:
            item.add_marker(skip_heavy)
        if local and "postgres" in item.keywords and not os.environ.get("CPBENCH_TEST_POSTGRES_URL"):
            item.add_marker(skip_pg)
        if local and "browser" in item.keywords and not (have_pw and shutil.which("chromium")):
            item.add_marker(skip_browser)
    if hasattr(config, "workerinput"):  # an xdist worker (`./dev test`: -n 2 --dist worksteal)
        _spawning_modules_first(items)


def _spawning_modules_first(items: list[pytest.Item]) -> None:
    """The modules that spawn processes (a test marked multiproc or slow: gloo gangs, workers, torchrun hosts, the
    longest tests) run first, each module whole and in its order: the run then ends on short tests, which an idle
    xdist worker can take from the other one's queue, so neither core waits on a long test alone at the end. Every
    worker sorts its identical collection the same way (xdist needs identical orders)."""
    first = {
        item.nodeid.split("::")[0] for item in items if any(item.iter_markers("multiproc")) or any(item.iter_markers("slow"))
    }
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in first)
