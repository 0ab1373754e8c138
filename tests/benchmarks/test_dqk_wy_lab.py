"""`benchmarks/dqk_wy_lab.py --configs`: each item read into the fused kernel's launch config per op (names of
FUSED_CONFIGS, JSON with VARIANT as bits or names of DQK_WY_VARIANTS, `gdn:` / `kda:` prefixes), KDA's BK = 128 left
out, a misspelt item refused before any work. (The timing runs on a GPU; the plumbing end to end: `--dry-run` under
the interpreter.)"""

from __future__ import annotations

import pytest

from kernels.common.dqk_wy_bwd import DQK_WY_VARIANTS, variant_flags
from kernels.configs import LaunchConfig
from tests.utils.scripts import load_script

LAB = load_script("dqk_wy_lab")


def test_configs_per_op() -> None:
    spec = '{"BK": 32, "BV": 32, "num_warps": 4, "num_stages": 2, "VARIANT": "phased+regs168"}'
    got = LAB.parse_configs(["default", "gdn:phased_r128", f"kda:{spec}", "bk128_w8"], ["gdn", "kda"])
    assert list(got["gdn"]) == ["default", "phased_r128", "bk128_w8"]
    assert list(got["kda"]) == ["default", spec.replace(" ", "")]  # no BK = 128 for KDA
    cfg = LAB.launch_config(got["kda"][spec.replace(" ", "")])
    assert cfg == LaunchConfig(BK=32, BV=32, num_warps=4, num_stages=2, VARIANT=5)
    assert variant_flags(cfg.VARIANT) == ({"PHASED": True}, {"maxnreg": 168})
    bits = LAB.launch_config(got["gdn"]["phased_r128"]).VARIANT
    assert bits == DQK_WY_VARIANTS["phased"] | DQK_WY_VARIANTS["regs128"]
    assert LAB.launch_config(got["gdn"]["default"]) is None  # the KernelSpec's default
    assert set(LAB.parse_configs(["all"], ["gdn"])["gdn"]) == set(LAB.FUSED_CONFIGS)


def test_misspelt_configs_refused() -> None:
    with pytest.raises(SystemExit, match="unknown fused config"):
        LAB.parse_configs(["phasd"], ["gdn"])
    with pytest.raises(KeyError):
        LAB.parse_configs(['{"BK": 32, "VARIANT": "phased+regs96"}'], ["gdn"])
    with pytest.raises(TypeError):
        LAB.parse_configs(['{"BKK": 32}'], ["gdn"])


def test_fused_dh_rows_on_the_cpu() -> None:
    """GDN's fused_dh rows end to end under the interpreter (fp32, grouped heads, dry-run timer): what it replaces, then
    the kernel at two configs, its gradients within 1e-5 of the pair's and its bytes floor beside it."""
    import math

    rows = LAB.run_shape("gdn", 1, 100, 1, 2, 32, device="cpu", dry_run=True, fused_configs={}, pair_configs=[],
                         split=False, step=False, deadline=math.inf, dh_configs=["default", "w4"])  # fmt: skip
    assert [(r["kernel"], r["config"]) for r in rows] == [("dh_walk+fused", "default"), ("fused_dh", "default"),
                                                          ("fused_dh", "w4")]  # fmt: skip
    for r in rows[1:]:
        assert r["ok"] and r["max_rel"] < 1e-5 and r["floor_ms"] > 0, r
