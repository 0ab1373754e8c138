"""`benchmarks/flash_qla_coefs.py` without a GPU: TileLang's compile cache packed into one .tar.xz and reused from it
(packed again only when it changed), an earlier run's timings taken back by direction, and the report written from a
run cut after its first split (what a device call that ran out of time leaves)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "flash_qla_coefs.py"


@pytest.fixture(scope="module")
def coefs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_flash_qla_coefs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_cache_packs_once_and_unpacks_where_tilelang_reads_it(
    coefs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / "built"
    (built / "ns" / "kernel_a").mkdir(parents=True)
    (built / "ns" / "kernel_a" / "kernel.so").write_bytes(bytes(range(256)) * 64)
    (built / "ns" / "kernel_a" / "params.json").write_text('{"block_DV": 128}')
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(built))
    packed, state = tmp_path / "out" / "tilelang_cache.tar.xz", {}
    packed.parent.mkdir()
    coefs.pack_cache(packed, state)
    assert state["cache"]["files"] == 2 and state["cache"]["MiB"] == pytest.approx(packed.stat().st_size / 2**20, abs=0.01)
    stamp = packed.stat().st_mtime_ns
    coefs.pack_cache(packed, state)  # nothing compiled since: not packed again
    assert packed.stat().st_mtime_ns == stamp

    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(fresh))
    said = coefs.reuse_cache(packed)
    assert "unpacked into" in said and "(2 files)" in said
    assert (fresh / "ns" / "kernel_a" / "kernel.so").read_bytes() == bytes(range(256)) * 64
    assert coefs._cache_files(fresh) == coefs._cache_files(built)

    monkeypatch.delenv("TILELANG_CACHE_DIR")
    assert coefs.reuse_cache(built).startswith(f"TileLang cache: {built} (2 files)")  # a directory is used in place
    assert coefs.cache_dir() == built


def test_a_cut_run_keeps_its_timings_and_reports_them(coefs: ModuleType, tmp_path: Path) -> None:
    timing = {"row": "fused_fwd_dv128", "depth": 63.0, "u": 144.0, "ms": 0.21}
    state = {
        "command": "python benchmarks/flash_qla_coefs.py --out x",
        "versions": {"gpu": "NVIDIA H200", "torch": "2.11", "flash-qla": "0.1.3", "tilelang": "0.1.15", "sha": "abc"},
        "refit_shapes": [],
        "compare": [],
        "splits": "decide",
        "cache_from": None,
        "refit_direction": "fwd",
        "timings": [
            {"shape": "T=32768 H=16 lb=-5", "direction": "fwd", "S": 63, **timing},
            {"shape": "T=32768 H=16 lb=-5", "direction": "fwd", "S": 63, **timing, "row": "prepare_h"},
        ],
    }
    coefs.write(tmp_path, state)
    md = (tmp_path / "flash_qla_coefs.md").read_text()
    assert "Refit: fwd, split sizes `decide`, 2 kernel timings over 1 (shape, split) pairs; TileLang cache: cold" in md
    saved = tmp_path / "flash_qla_coefs.json"
    assert json.loads(saved.read_text())["timings"] == state["timings"]
    assert coefs._reused_timings(saved, "fwd") == state["timings"]
    assert coefs._reused_timings(saved, "fwd+bwd") == [] and coefs._reused_timings(None, "fwd") == []
