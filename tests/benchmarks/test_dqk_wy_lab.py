"""`benchmarks/dqk_wy_lab.py --configs`: each item read into the fused kernel's launch config per op (names of
FUSED_CONFIGS, JSON launch fields, `gdn:` / `kda:` prefixes), KDA's BK = 128 left out, a misspelt item refused before
any work, and session 12's removed code variants (their names, a JSON VARIANT) refused with the reason. (The timing
runs on a GPU; the plumbing end to end: `--dry-run` under the interpreter.)"""

from __future__ import annotations

import pytest

from kernels.configs import LaunchConfig
from tests.utils.scripts import load_script

LAB = load_script("dqk_wy_lab")


def test_configs_per_op() -> None:
    spec = '{"BK": 32, "BV": 32, "num_warps": 4, "num_stages": 2}'
    got = LAB.parse_configs(["default", "gdn:bk32_w8", f"kda:{spec}", "bk128_w8"], ["gdn", "kda"])
    assert list(got["gdn"]) == ["default", "bk32_w8", "bk128_w8"]
    assert list(got["kda"]) == ["default", spec.replace(" ", "")]  # no BK = 128 for KDA
    assert LAB.launch_config(got["kda"][spec.replace(" ", "")]) == LaunchConfig(BK=32, BV=32, num_warps=4, num_stages=2)
    assert LAB.launch_config(got["gdn"]["bk32_w8"]) == LaunchConfig(BK=32, BV=32, num_warps=8, num_stages=2)
    assert LAB.launch_config(got["gdn"]["default"]) is None  # the KernelSpec's default
    assert set(LAB.parse_configs(["all"], ["gdn"])["gdn"]) == set(LAB.FUSED_CONFIGS)
    assert not set(LAB.REMOVED_CONFIGS) & set(LAB.FUSED_CONFIGS)


def test_misspelt_configs_refused() -> None:
    with pytest.raises(SystemExit, match="unknown fused config"):
        LAB.parse_configs(["bk32_w9"], ["gdn"])
    with pytest.raises(TypeError):
        LAB.parse_configs(['{"BKK": 32}'], ["gdn"])


@pytest.mark.parametrize("spec", ["phased", "gdn:bk32_w4_phased_r168", "r128", '{"BK": 32, "VARIANT": 1}'])
def test_removed_variants_refused(spec: str) -> None:
    with pytest.raises(SystemExit, match="no code variants since session 13"):
        LAB.parse_configs(["default", spec], ["gdn", "kda"])
