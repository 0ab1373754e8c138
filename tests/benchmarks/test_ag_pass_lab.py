"""`benchmarks/ag_pass_lab.py` on any machine: its --builds names parse to the TileLang kernel's knobs (an unknown one
is refused in one line), and its floors grow by the bytes each sum reads (v for the forward's, q for the backward's:
256 B a token-head each, as much as k)."""

from __future__ import annotations

import pytest

from tests.utils.scripts import load_script

lab = load_script("ag_pass_lab")


def test_build_names_parse_to_the_kernels_knobs() -> None:
    assert lab._build_knobs("free") == (0, False)
    assert lab._build_knobs("b4") == (4, False)
    assert lab._build_knobs("q") == (0, True)
    assert lab._build_knobs("b4+q") == (4, True)
    with pytest.raises(ValueError, match="unknown build 'fast'"):
        lab._build_knobs("fast")
    with pytest.raises(SystemExit):
        lab.main(["--builds", "free,fast"])


def test_each_sum_adds_its_inputs_bytes() -> None:
    B, T, H = 1, 65536, 16
    ag, bnd, rev = (lab._floor_ms(B, T, H, H, m) for m in ("ag", "ag+bnd", "ag+bnd+rev"))
    k_ms = B * T * H * 256 / (lab.COPY_TBS * 1e12) * 1e3  # one [B, T, H, 128] bf16 read
    assert ag > k_ms  # k, and Ag's write besides
    assert bnd - ag == pytest.approx(k_ms, rel=0.01)  # v (and 8 B a chunk)
    assert rev - bnd == pytest.approx(k_ms, rel=0.03)  # q (and p, 8 B a chunk)
    assert lab._floor_ms(B, T, H, 2 * H, "ag") > ag  # grouped heads: Ag per value head
