"""The fused GDN pass's code variants (`kernels.ops.gdn.fused.FUSED_VARIANTS`, chosen by the launch config's VARIANT
bits) against the fp32 per-token reference, interpreted on CPU (on a GPU with CPBENCH_TEST_GPU=1): exp2 with
prescaled gates, TMA descriptors, the pipelined chunk loop, warp specialisation (the interpreter runs the loop
attributes as a plain loop, so there they check the code path, not the schedule).

Scenarios: varlen with partial and sub-chunk sequences, initial and final states, split into 1-chunk segments (so the
TRANSITION mode runs too) at K, V not powers of two (TMA's zero fill past K, V; v by pointers in TRANSITION: a
64-column block straddles the identity block) and at K = V = 32 with BV 16 (v by TMA in TRANSITION, the identity
blocks clamped and zeroed); dense B=2 with grouped heads. Refusals: unknown bits, ws without tma, tma at a row
of bytes not a multiple of 16. Tolerance: the pass's own test's (1e-5 on CPU, 1e-2 on a GPU).
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.seqsplit import whole_sequences
from kernels.configs import LaunchConfig
from kernels.ops.gdn.fused import FUSED_VARIANTS, gdn_fused_fwd, gdn_fused_state_output
from kernels.plan import LaunchPlan
from tests.kernels.ops.gdn.test_fused import BT, DEVICE, TOL, _ag_reference, _inputs, _reference
from tests.utils import assert_rel_close, make_state

VARIANTS = ("exp2", "tma", "pipe", "tma+ws", "exp2+tma+pipe+ws")


def _plan(variant: str, BV: int = 64) -> LaunchPlan:
    bits = sum(FUSED_VARIANTS[name] for name in variant.split("+"))
    cfg = LaunchConfig(BV=BV, num_warps=4, num_stages=2, VARIANT=bits)
    return LaunchPlan().with_configs({"gdn_fused_state_output_fwd": cfg})


@pytest.mark.parametrize("dims", [(48, 40, 64), (32, 32, 16)], ids=["K48V40BV64", "K32V32BV16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_split_varlen(variant: str, dims: tuple[int, int, int]) -> None:
    K, V, BV = dims
    lengths = (37, 150, 5, 64)
    q, k, v, g, beta, cu, index = _inputs(lengths, K=K, V=V)
    h0 = make_state(len(lengths), 2, K, V, device=DEVICE)
    o, ht = gdn_fused_fwd(q, k, v, g, beta, scale=K**-0.5, index=index, launch=_plan(variant, BV), initial_state=h0,
                          output_final_state=True, split_chunks=1,
                          ag_prep=lambda k, g, beta, **_: _ag_reference(k, g, beta, index))  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert_rel_close(f"o ({variant})", o_ref, o, TOL)
    assert_rel_close(f"ht ({variant})", ht_ref, ht, TOL)


def test_dense_grouped_heads_tma_exp2() -> None:
    q, k, v, g, beta, cu, index = _inputs(B=2, T=130)
    ag, gcum = _ag_reference(k, g, beta, index)
    o, ht = gdn_fused_state_output(q, k, v, ag, gcum, layout=whole_sequences(index), BT=BT, scale=32**-0.5,
                                   output_final_state=True, launch=_plan("exp2+tma"))  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, None)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_refusals() -> None:
    q, k, v, g, beta, cu, index = _inputs((70,), K=34, V=32)
    ag, gcum = _ag_reference(k, g, beta, index)
    layout = whole_sequences(index)

    def run(plan: LaunchPlan) -> None:
        gdn_fused_state_output(q, k, v, ag, gcum, layout=layout, BT=BT, launch=plan)

    unknown = LaunchPlan().with_configs({"gdn_fused_state_output_fwd": LaunchConfig(BV=32, VARIANT=16)})
    with pytest.raises(ValueError, match="unknown VARIANT bits 16"):
        run(unknown)
    with pytest.raises(ValueError, match="ws variant needs tma"):
        run(_plan("ws"))
    assert k.dtype == torch.float32  # 34 columns: 136 bytes a row
    with pytest.raises(ValueError, match=r"multiple of 16 bytes, got \{'k': 136, 'q': 136\}"):
        run(_plan("tma"))
    run(_plan("exp2"))  # the same call without tma runs
