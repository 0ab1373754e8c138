"""`benchmarks/kda_fused_lab.py --ag-configs`: each item read into a launch plan of the KDA Ag pass (its code variant,
BK, warps, stages; "default" the plan without an override), a misspelt item refused before any work, and the
markdown's Ag table holding each config's figures or its failure. (The timing runs on a GPU; the plumbing end to end:
`--dry-run` under the interpreter.)"""

from __future__ import annotations

import pytest

from kernels.configs import LaunchConfig
from kernels.ops.kda.wy_ag import KDA_AG_VARIANTS, WY_KDA_AG_FWD
from kernels.plan import default_plan
from tests.utils.scripts import load_script

LAB = load_script("kda_fused_lab")
# a launch plan whose Ag config the pass refuses (no variant has bit 16)
BAD_PLAN = default_plan().with_configs({WY_KDA_AG_FWD.name: LaunchConfig(BK=16, BV=64, num_warps=1, VARIANT=16)})


def test_ag_config_items_become_launch_plans() -> None:
    plans = LAB.ag_plans("default,gated:16:4,gated:32:4:1,default:32:2,gated")
    assert list(plans) == ["default", "gated:16:4", "gated:32:4:1", "default:32:2", "gated"]
    assert plans["default"] is None
    cfg = {label: plan.configs[WY_KDA_AG_FWD.name] for label, plan in plans.items() if plan is not None}
    assert cfg["gated:16:4"] == LaunchConfig(BK=16, BV=64, num_warps=4, num_stages=2, VARIANT=KDA_AG_VARIANTS["gated"])
    assert cfg["gated:32:4:1"] == LaunchConfig(BK=32, BV=64, num_warps=4, num_stages=1, VARIANT=KDA_AG_VARIANTS["gated"])
    assert cfg["default:32:2"].VARIANT is None and cfg["default:32:2"].num_warps == 2  # the default code at 2 warps
    gated = cfg["gated"]  # the spec's default launch fields, the variant's bit
    assert KDA_AG_VARIANTS["gated"] == gated.VARIANT and gated.BK == WY_KDA_AG_FWD.default.BK
    for bad in ("gates:16:4", "gated:16", "gated:16:4:2:1", "gated+tiles64"):
        with pytest.raises(SystemExit, match="--ag-configs: bad"):
            LAB.ag_plans(bad)


def test_markdown_lists_each_ag_config_or_its_failure() -> None:
    row = {"B": 1, "T": 131072, "lb": -1.0, "new_ms": 10.4, "old_ms": 10.5,
           "ag_configs": {"default": {"ag_ms": 5.15, "fwd_ms": 10.4, "err_ag": 0.0},
                          "gated:16:8": {"error": "OutOfResources: shared memory"}}}  # fmt: skip
    text = LAB._markdown({"command": "x", "env": {}, "rows": [row]})
    assert "| 1 | 131072 | -1.000 | `default` | 5.150 | 10.400 | 0.000e+00 |" in text
    assert "`gated:16:8` |" in text and "OutOfResources: shared memory |" in text
    assert LAB._markdown({"command": "x", "env": {}, "rows": [{"B": 1, "T": 8, "lb": -1.0}]}).count("Ag config") == 0


def test_measure_ag_reads_the_gated_variants_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `gated` Ag config returns GatedKeys, not gcum: its G_C is checked against the default code's gcum at each
    chunk's last row (a short last chunk in the second sequence), its forward against the reference; a config the
    Ag pass refuses is an error row, not a crash."""
    import torch

    from kernels.common.index import prepare_chunk_index

    monkeypatch.setitem(LAB.DEVICE, "name", "cpu")  # the lab's timer: one call on the CPU (as --dry-run)
    torch.manual_seed(0)
    T, H, K = 150, 1, 32
    q, k = (torch.nn.functional.normalize(torch.randn(1, T, H, K), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(1, T, H, K), -torch.sigmoid(torch.randn(1, T, H, K)), torch.sigmoid(torch.randn(1, T, H))
    bounds = [0, 128, T]  # chunk starts stay multiples of 64 (measure_ag's Aqk mask); the last chunk has 22 rows
    cu = torch.tensor(bounds, dtype=torch.int32)
    index = prepare_chunk_index(cu, batch=1, seq_len=T, chunk_size=64, cu_seqlens_cpu=bounds)
    o_ref, _ = LAB._reference(q, k, v, g, beta, cu, max_tokens=T)
    row: dict = {}
    LAB.measure_ag(row, q, k, v, g, beta, cu, index, o_ref, {**LAB.ag_plans("gated"), "bad": BAD_PLAN}, split=1)
    gated, bad = row["ag_configs"]["gated"], row["ag_configs"]["bad"]
    assert "error" not in gated and gated["err_gcum"] < 1e-6 and gated["err_ag"] < 1e-6 and gated["err_aqk"] < 1e-6
    assert gated["err_fwd"] < 1e-5 and gated["ag_ms"] > 0 and gated["fwd_ms"] > 0
    assert bad["error"].startswith("ValueError: wy_kda_ag: unknown VARIANT bits 16")
    # the comparison can fail: G_C is not gcum one row early
    last = LAB._chunk_last(torch.arange(T, dtype=torch.float32)[None, :, None, None], index).flatten()
    assert last.tolist() == [63, 127, 149]


def test_walk_form_runs_the_gated_ag_pass_then_the_tilelang_walk() -> None:
    """--forms walk: the Ag pass's gated variant and `fwd_pass="tilelang"` (the TileLang walk's gated build); the
    Triton forms pin `fwd_pass="triton"`, so KDA's "auto" (`KDA_WALK_AUTO`) cannot move them."""
    walk, gated = LAB.form_plan("walk"), LAB.form_plan("gated")
    assert walk.fwd_pass == "tilelang" and gated.fwd_pass == "triton" and LAB.form_plan("inline").fwd_pass == "triton"
    assert walk.configs[WY_KDA_AG_FWD.name].VARIANT == KDA_AG_VARIANTS["gated"] == gated.configs[WY_KDA_AG_FWD.name].VARIANT


def test_walk_tl_form_and_the_tilelang_ag_config_take_the_tilelang_ag_pass() -> None:
    """--forms walk_tl: the whole forward on TileLang (`ag_pass="tilelang"` beside the walk); the other forms keep
    the Triton Ag pass; --ag-configs tilelang: the default plan with the TileLang Ag pass."""
    assert LAB.form_plan("walk_tl").ag_pass == "tilelang" and LAB.form_plan("walk_tl").fwd_pass == "tilelang"
    assert LAB.form_plan("walk").ag_pass == "triton" and LAB.form_plan("gated").ag_pass == "triton"
    plan = LAB.ag_plans("tilelang,default")["tilelang"]
    assert plan is not None and plan.ag_pass == "tilelang" and not plan.configs
