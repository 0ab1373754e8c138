"""runners/suites/cp-w48-cpu.yaml (issue 7 on the CPU): the grid a CPU worker queues at W=4/8, without spawning ranks.

A CPU worker's rank count is `--devices N` or `CPBENCH_CPU_RANKS` (default 4): with 8 every W=8 point is
queued, with the default they are stored as skipped with the reason. `none` runs only at W=1; headwise divides
H=8 at W=8; every T splits into 2W zigzag parts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from runners.grid import expand
from runners.settings import get_worker_settings
from runners.spec import load_spec
from runners.worker import detect_devices

SUITE = Path(__file__).resolve().parents[2] / "runners" / "suites" / "cp-w48-cpu.yaml"
CP_MODES = ("headwise", "all_gather", "ring", "true_cp")


@pytest.fixture
def cpu_ranks(monkeypatch: pytest.MonkeyPatch):
    def set_ranks(n: int | None) -> None:
        if n is None:
            monkeypatch.delenv("CPBENCH_CPU_RANKS", raising=False)
        else:
            monkeypatch.setenv("CPBENCH_CPU_RANKS", str(n))
        get_worker_settings.cache_clear()

    yield set_ranks
    get_worker_settings.cache_clear()


def test_cpu_ranks_setting_sets_the_cpu_worker_size(cpu_ranks) -> None:
    cpu_ranks(8)
    assert detect_devices(kind="cpu").count == 8
    assert detect_devices(2, kind="cpu").count == 2  # --devices wins over the setting
    cpu_ranks(None)
    assert detect_devices(kind="cpu").count == 4


def test_w48_suite_queues_every_cp_point_with_eight_ranks() -> None:
    spec = load_spec(SUITE)
    rows = expand(spec, max_W=8, modes=("none", *CP_MODES), backends=("torch",))
    assert len(rows) == 2 * 2 * 2 * 3 * 5
    queued = Counter((r["mode"], r["W"]) for r in rows if r["status"] == "queued")
    for W in (1, 4, 8):
        for mode in CP_MODES:
            assert queued[(mode, W)] == 8, (mode, W)  # 2 ops x 2 layouts x 2 T
    assert queued[("none", 1)] == 8
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 16
    assert all(r["mode"] == "none" and r["W"] in (4, 8) and "one device" in r["reason"] for r in skipped)


def test_w48_suite_skips_w8_on_a_four_rank_worker() -> None:
    rows = expand(load_spec(SUITE), max_W=4, modes=("none", *CP_MODES), backends=("torch",))
    w8 = [r for r in rows if r["W"] == 8]
    assert w8 and all(r["status"] == "skipped" for r in w8)
    assert all("more than the 4 device(s)" in r["reason"] for r in w8 if r["mode"] != "none")
    assert all(r["status"] == "queued" for r in rows if r["W"] == 4 and r["mode"] != "none")
