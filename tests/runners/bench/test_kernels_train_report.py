"""`cpbench bench train`'s report (`runners.bench.kernels_train.to_markdown`): FlashQLA's two step columns and ratios,
the HV and lb of each row, one line for why FlashQLA did not run (this host's real reason), each library's first
call, the rows the deadline cut, and FlashQLA's per-kernel times under ours."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from runners.bench.kernels_peers import flash_qla_reason
from runners.bench.kernels_train import main, to_markdown

ENV = {
    "device": "NVIDIA H200",
    "torch": "2.11",
    "triton": "3.6.0",
    "fla": "0.6.0",
    "flash_qla": "0.1.3",
    "tilelang": "0.1.15",
    "driver": "580",
    "git_sha": "abc",
    "date": "2026-12-02",
    "command": "cpbench bench train",
}


def _row(**kw: Any) -> dict[str, Any]:
    """A GDN row at 1x64K, HV=32, lb=-5 (ours, FLA, the floor, peaks, our kernels), with `kw` changed."""
    keys = ("op", "B", "T", "H", "HV", "lb", "ours_ms", "fla_ms", "ratio", "floor_ms", "ours_peak_MB", "fla_peak_MB")
    base = dict(zip(keys, ("gdn", 1, 65536, 16, 32, -5.0, 10.0, 9.8, 10.0 / 9.8, 1.4, 900.0, 1200.0), strict=True))
    base.update(policies={}, ours_kernels_ms={"chunk_bwd_dqk": 3.0}, ours_first_call_s=16.5)
    return {**base, **kw}


def test_flash_qla_step_columns_first_calls_and_cut_rows() -> None:
    step_ms = {"flash_qla_ms": 2.5, "flash_qla_cp_ms": 2.0, "ratio_flash_qla": 4.0, "ratio_flash_qla_cp": 5.0}
    first = {"flash_qla_first_call_s": 169.0, "fla_first_call_s": 112.0}
    row = _row(
        **step_ms,
        **first,
        flash_qla_cp_peak_MB=700.0,
        flash_qla_cp_split={"intra_cp": True, "pieces": 16},
        flash_qla_cp_kernels_ms={"fused_bwd": 1.25, "fwd_h": 0.5},
    )
    cut = [
        {
            "op": "kda",
            "case": "1x8192 HV=32 lb=-5",
            "why": "cut by the deadline: 500 s elapsed + 60 s (the longest row) > 540 s",
        }
    ]
    md = to_markdown(
        {
            "env": ENV,
            "rows": [row],
            "grads": {"gdn": {"shape": "B=1 T=1024 H=16 lb=-1", "flash_qla": {"o": 4e-3, "first_call_s": 170.0}}},
            "cut": cut,
        }
    )
    head = next(x for x in md.splitlines() if x.startswith("| op |")).strip("|").split("|")
    cells = next(x for x in md.splitlines() if x.startswith("| gdn | 1 | 65536")).strip("|").split("|")
    got = dict(zip((h.strip() for h in head), (c.strip() for c in cells), strict=True))
    assert got["HV"] == "32" and got["lb"] == "-5" and got["FlashQLA ms"] == "2.50" and got["FlashQLA CP ms"] == "2.00"
    assert got["ours/FlashQLA"] == "4.00" and got["ours/FlashQLA CP"] == "5.00" and got["FlashQLA peak MB"] == "700"
    assert "ours 16.5, fla 112.0, flash_qla 170.0" in md  # the longest of the rows and the gradient check
    assert "flash_qla_cp split (gdn 1x65536 HV=32 lb=-5.0): {'intra_cp': True, 'pieces': 16}" in md
    assert "- kda 1x8192 HV=32 lb=-5: cut by the deadline" in md
    # (session 21) the peer's kernels under ours, with their sum
    assert "  - flash_qla_cp (step 2.00; kernels' sum 1.75): fused_bwd 1.25, fwd_h 0.50" in md


@pytest.mark.skipif(importlib.util.find_spec("flash_qla") is not None, reason="flash-qla is installed here")
def test_missing_flash_qla_is_one_line() -> None:
    why = flash_qla_reason("gdn", H=16, HV=32, K=128, V=128)
    md = to_markdown({"env": ENV, "rows": [_row(flash_qla_reason=why), _row(T=8192, flash_qla_reason=why)], "grads": {}})
    assert [x for x in md.splitlines() if "FlashQLA not run" in x] == [f"- FlashQLA not run (gdn): {why}"]
    cells = next(x for x in md.splitlines() if x.startswith("| gdn | 1 | 65536")).strip("|").split("|")
    assert [c.strip() for c in cells[8:12]] == ["nan"] * 4


def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--peers", "flashqla"])
    assert "--peers: unknown peer(s) flashqla; choose from fla, flash_qla (or none)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--preset", "issue26", "--hv", "24"])
    assert "--hv: value heads must be a multiple of the 16 query/key heads, got 24" in capsys.readouterr().err


def test_other_backward_grads_are_one_line_each() -> None:
    """(session 33) `--also-bwd-grads`: ours' step again under other gradient kernels, in this process, one note line
    per row and choice: its ms, its ratio to FLA's from the same row and ours' default beside it; or why it refused."""
    row = _row(op="kda", also_grads={"pair": {"ms": 12.25, "peak_MB": 6100.0, "first_call_s": 1.0},
                                     "reverse": {"error": "bwd_grads='reverse' is GDN's"}})  # fmt: skip
    md = to_markdown({"env": ENV, "rows": [row], "grads": {}})
    got = [x for x in md.splitlines() if x.startswith("- ours with bwd_grads=")]
    assert got == ["- ours with bwd_grads=pair (kda 1x65536 HV=32 lb=-5.0): 12.25 ms (1.25x FLA; ours 10.00), peak 6100 MB",
                   "- ours with bwd_grads=reverse (kda 1x65536 HV=32 lb=-5.0): bwd_grads='reverse' is GDN's"]  # fmt: skip


def test_unknown_backward_grads_are_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--also-bwd-grads", "pair,triton"])
    assert "--also-bwd-grads: triton not in auto, pair, fused, reverse, tilelang" in capsys.readouterr().err
