"""`benchmarks/reverse_bwd_lab.py`: a variant's switches are read from its "+"-joined name, a misspelt switch is
refused in one line before any compile (on any machine: the check needs neither tilelang nor a GPU), the kernel's own
builder refuses one too, the exact (swap-only) switches are lab switches, and the inputs walk each sequence in the
ranges asked for. (The timing and the compiles run on a GPU host.)"""

from __future__ import annotations

import pytest

from kernels.ops.gdn import reverse_bwd
from tests.utils.scripts import load_script

LAB = load_script("reverse_bwd_lab")


def test_variant_names_and_their_switches() -> None:
    assert LAB._switches("") == frozenset()
    assert LAB._switches("sync_loads+unbatched") == {"sync_loads", "unbatched"}
    for v in LAB.DEFAULT_VARIANTS:
        assert LAB._switches(v) <= set(reverse_bwd.LAB_SWITCHES), v
    assert set(reverse_bwd.LAB_SWITCHES) >= reverse_bwd.EXACT_SWITCHES
    # the variants that leave a part out are not exact: the lab compares only swaps with the shipped kernel
    assert not {"load_once", "no_dg", "no_reduce", "no_store"} & reverse_bwd.EXACT_SWITCHES


def test_misspelt_switch_refused_before_any_compile(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        LAB.main(["--compile-only", "--variants", ",sync_load"])
    assert "unknown switches ['sync_load'] in variant 'sync_load'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        LAB.main(["--compile-only", "--shapes", "8x8192,1x65536", "--ranges", "1"])
    assert "--ranges takes one count per shape: 2 shapes, 1 counts" in capsys.readouterr().err


def test_inputs_walk_each_sequence_in_its_ranges() -> None:
    x = LAB._inputs(2, 640, 3, dev="cpu")  # 10 chunks per sequence in ranges of 4, 4, 2
    r = x["ranges"]
    assert r["cu"].tolist() == [0, 256, 512, 640, 896, 1152, 1280]
    assert r["chunk_offsets"].tolist() == [0, 4, 8, 10, 14, 18]  # each range's first chunk in h
    assert r["final_idx"].tolist() == [0, -1, -1, 1, -1, -1]  # a sequence's first range gives its dh0
    assert (x["programs"], x["steps"]) == (6 * LAB.H, 4)
    q, k, v, g, gs, beta, ag, h, do = x["args"]
    assert h.shape == (20, LAB.H, 128, 128) and ag.shape == (2, 640, LAB.H, 64)
    assert bool((g < 0).all()) and bool((ag.view(2, 10, 64, LAB.H, 64).float().triu(1) == 0).all())  # decays, Ag lower


def test_kernel_builder_refuses_an_unknown_switch() -> None:
    with pytest.raises(ValueError, match=r"unknown lab switches \['bogus'\]; known: \["):
        reverse_bwd._build(16, 16, 128, 128, 64, 0.1, "bfloat16", "float32", "bfloat16", frozenset({"bogus"}))
