"""`benchmarks/fused_fwd_lab.py --variants`: each item read into the launch config of the kernel it varies (the fused
pass's or the Ag pass's VARIANT bits and launch fields), a misspelt item refused before any work, every item of the
default list readable, and the markdown's variant table holding each variant's figures or its failure next to the
default's. (The lab's timing runs on a GPU; its plumbing end to end: `--dry-run` under the interpreter.)"""

from __future__ import annotations

import pytest

from kernels.configs import LaunchConfig
from kernels.ops.gdn.fused import FUSED_VARIANTS
from kernels.ops.gdn.wy_ag import AG_VARIANTS
from tests.utils.scripts import load_script

LAB = load_script("fused_fwd_lab")


def test_variant_items_become_launch_configs() -> None:
    kernel, cfg = LAB.variant_config("tma+ws@64:4:3")
    assert kernel == "gdn_fused_state_output_fwd"
    assert cfg == LaunchConfig(BV=64, num_warps=4, num_stages=3, VARIANT=FUSED_VARIANTS["tma"] | FUSED_VARIANTS["ws"])
    assert LAB.variant_config("exp2")[1] == LaunchConfig(BV=64, num_warps=4, num_stages=2, VARIANT=FUSED_VARIANTS["exp2"])
    kernel, cfg = LAB.variant_config("ag:two_chunks+exp2@32:4:2")
    assert kernel == "wy_gdn_ag_fwd"
    assert cfg == LaunchConfig(BK=32, BV=64, num_warps=4, num_stages=2, BR=16, VARIANT=3)
    assert AG_VARIANTS["two_chunks"] | AG_VARIANTS["exp2"] == 3
    assert LAB.variant_config("ag:base@32:2:2")[1].VARIANT is None  # the default code at 2 warps
    for name in LAB.VARIANTS_DEFAULT:
        LAB.variant_config(name)
    with pytest.raises(ValueError, match=r"unknown \['tmaa'\]; known: \['exp2', 'pipe', 'tma', 'ws'\]"):
        LAB.variant_config("exp2+tmaa")
    with pytest.raises(ValueError, match="unknown"):
        LAB.variant_config("ag:tma")  # a fused-pass bit is not an Ag-pass one


def test_markdown_lists_each_variant_or_its_failure() -> None:
    row = {"B": 1, "T": 4096, "floor_ms": 0.02, "new_pass_ms": 1.5, "new_transition_ms": 0.6,
           "new_state_output_ms": 0.8, "err_new": 2.9e-3, "ag_ms": 0.3,
           "var_tma_err": 2.9e-3, "var_tma_ms": 1.25, "var_tma_transition_ms": 0.5, "var_tma_state_output_ms": 0.7,
           "var_ws_error": "ValueError: gdn fused pass: the ws variant needs tma",
           "var_ag:exp2_err": 1e-8, "var_ag:exp2_ms": 0.29}  # fmt: skip
    text = LAB._markdown({"command": "lab", "env": {}, "rows": [row]})
    table = text[text.index("Code variants") :].splitlines()
    assert "| 1 | 4096 | base (default config) | 1.500 | 0.600 | 0.800 | 2.900e-03 |  |" in table
    assert "| 1 | 4096 | tma | 1.250 | 0.500 | 0.700 | 2.900e-03 |  |" in table
    assert "| 1 | 4096 | ws |  |  |  |  | ValueError: gdn fused pass: the ws variant needs tma |" in table
    assert "| 1 | 4096 | ag:exp2 | 0.290 |  |  | 1.000e-08 |  |" in table
