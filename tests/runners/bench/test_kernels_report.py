"""The kernel benchmark's report (`runners.bench.kernels_report.to_markdown`): the FlashQLA columns and their ratios,
the one line saying why FlashQLA did not run (the real reason of this host: flash-qla absent), each library's first
call, the per-launcher floor table and the rows the deadline cut."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from runners.bench.floors import floor_ms, launcher_bytes, launcher_flops
from runners.bench.kernels_peers import flash_qla_reason
from runners.bench.kernels_report import to_markdown


def _result(rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    env = {
        "device": "NVIDIA H200",
        "sms": 132,
        "torch": "2.11",
        "triton": "3.6.0",
        "fla": "0.6.0",
        "flash_qla": "0.1.3",
        "tilelang": "0.1.15",
        "git_sha": "abc",
        "command": "python -m runners.bench.kernels",
    }
    return {
        "env": env,
        "H": 16,
        "K": 128,
        "V": 128,
        "peers": ["fla", "flash_qla"],
        "rows": rows,
        "ceilings": {"copy_GBps": 4100.0, "matmul_TFLOPs": 700.0},
        **kw,
    }


def _row(**kw: Any) -> dict[str, Any]:
    base = {
        "op": "gdn",
        "B": 1,
        "T": 131072,
        "H": 16,
        "HV": 16,
        "lb": -1.0,
        "K": 128,
        "V": 128,
        "floor_ms": 0.5,
        "floor_bytes_ms": 0.5,
        "floor_flops_ms": 0.3,
        "ms": 4.0,
        "fla_ms": 5.0,
        "ratio": 0.8,
    }
    return {**base, **kw}


def _table_row(md: str, prefix: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(prefix))
    return [c.strip() for c in line.strip("|").split("|")]


def test_flash_qla_columns_ratios_split_and_first_calls() -> None:
    row = _row(
        flash_qla_ms=2.0,
        flash_qla_cp_ms=1.0,
        ratio_flash_qla=2.0,
        ratio_flash_qla_cp=4.0,
        first_call_s=16.5,
        fla_first_call_s=112.0,
        flash_qla_first_call_s=169.0,
        flash_qla_cp_first_call_s=3.0,
        flash_qla_cp_split={"intra_cp": True, "pieces": 24, "max_piece_tokens": 6144},
    )
    md = to_markdown(_result([row]))
    head = _table_row(md, "| op |")
    cells = dict(zip(head, _table_row(md, "| gdn | 1 | 131072"), strict=True))
    assert cells["ours ms"] == "4.000" and cells["FLA ms"] == "5.000" and cells["FlashQLA ms"] == "2.000"
    assert cells["FlashQLA CP ms"] == "1.000" and cells["ours/FlashQLA"] == "2.00" and cells["ours/FlashQLA CP"] == "4.00"
    assert cells["HV"] == "16" and cells["lb"] == "-1"
    assert "flash-qla 0.1.3, tilelang 0.1.15" in md
    assert "- gdn 1x131072 HV=16 lb=-1: {'intra_cp': True, 'pieces': 24, 'max_piece_tokens': 6144}" in md
    assert "ours 16.5, FLA 112.0, FlashQLA 169.0, FlashQLA CP 3.0" in md


@pytest.mark.skipif(importlib.util.find_spec("flash_qla") is not None, reason="flash-qla is installed here")
def test_missing_flash_qla_says_why_in_one_line() -> None:
    why = flash_qla_reason("gdn", H=16, HV=16, K=128, V=128)
    assert why is not None
    md = to_markdown(_result([_row(flash_qla_reason=why), _row(T=32768, flash_qla_reason=why)]))
    cells = _table_row(md, "| gdn | 1 | 131072")
    assert cells[8:12] == ["—", "—", "—", "—"]  # FlashQLA ms, CP ms and both ratios: empty
    lines = [x for x in md.splitlines() if "FlashQLA not run" in x]
    assert lines == [f"- FlashQLA not run (gdn): {why}"]  # one line, not one per row, no traceback
    assert "Traceback" not in md


def test_per_launcher_floor_table_and_cut_rows() -> None:
    mm = 700.0
    launchers = []
    for name, ms in (("wy", 0.9), ("state_split", 1.6)):
        nbytes, flops = launcher_bytes("gdn", name, 1, 131072, 16, segments=32), launcher_flops("gdn", name, 1, 131072, 16)
        fl = floor_ms(nbytes, flops, mm)
        launchers.append({"launcher": name, "ms": ms, "bytes": nbytes, "flops": flops, **fl, "x_floor": ms / fl["floor_ms"]})
    cut = [
        {
            "op": "kda",
            "case": "8x8192 HV=32 lb=-5",
            "why": "cut by the deadline: 530 s elapsed + 80 s (the longest row) > 540 s",
        }
    ]
    md = to_markdown(_result([_row(launchers=launchers)], cut=cut))
    assert "Per launcher against its floor (bytes at 4.2 TB/s, flops at the measured 700 TFLOP/s" in md
    wy = _table_row(md, "| gdn | 1 | 131072 | 16 | wy |")
    assert wy[5] == "0.900" and float(wy[6]) == pytest.approx(launchers[0]["bytes"] / 1e6, abs=0.05)
    assert float(wy[8]) == pytest.approx(launchers[0]["bytes_ms"], abs=1e-3)
    assert float(wy[10]) == pytest.approx(0.9 / launchers[0]["floor_ms"], abs=0.05)
    assert "## Not run: 1 row(s) cut by --deadline" in md
    assert "- kda 8x8192 HV=32 lb=-5: cut by the deadline: 530 s elapsed" in md


def test_the_forward_by_kernel_lists_each_kernel_or_the_error() -> None:
    """(session 31) --profile's per-kernel times of our forward: one line a row, the kernels largest first as
    recorded, or the error that stopped the profiler."""
    md = to_markdown(_result([_row(ours_kernels_ms={"kda_ag_pass_kernel": 2.281, "kda_fwd_walk_kernel": 0.4}),
                              _row(op="kda", T=65536, ours_kernels_ms={"error": "RuntimeError: no CUPTI"})]))  # fmt: skip
    assert "## Per-kernel times of our forward (one call, ms, torch profiler)" in md
    assert "- gdn B=1 T=131072 HV=16 (forward 4.000): kda_ag_pass_kernel 2.281, kda_fwd_walk_kernel 0.400" in md
    assert "- kda B=1 T=65536 HV=16 (forward 4.000): RuntimeError: no CUPTI" in md
    assert "Per-kernel times of our forward" not in to_markdown(_result([_row()]))
