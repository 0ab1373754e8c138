"""Test-wide setup: the Triton interpreter on CPU, gloo on loopback, seeds, and the markers' skip rules.

`TRITON_INTERPRET=1` must be in the environment before any `@triton.jit` runs, so it is set here, before
any kernel module is imported (../shared/anchors/cpu-feasibility.md §1). Spawned ranks inherit it.
"""

from __future__ import annotations

import os

if not os.environ.get("CPBENCH_TEST_GPU"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import pytest  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    from kernels.interpreter import patch_bf16_dot

    patch_bf16_dot()


@pytest.fixture
def session():
    """A session on a fresh in-memory SQLite store with every table (tests/db and tests/dashboards override this
    with their file or PostgreSQL stores)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from db.base import Base

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        yield s
    engine.dispose()


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
    fail the run (`./dev test` provides both), never pass it by skipping; only the GPU tests are skipped."""
    import shutil

    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
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
        if local and "postgres" in item.keywords and not os.environ.get("CPBENCH_TEST_POSTGRES_URL"):
            item.add_marker(skip_pg)
        if local and "browser" in item.keywords and not (have_pw and shutil.which("chromium")):
            item.add_marker(skip_browser)
