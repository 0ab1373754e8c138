"""GDN (scalar gate) and KDA (per-key gate) on the Triton backend against the fp32 per-token reference
(interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1). Every test runs for both ops.

Scenarios: dense batch with an initial state; varlen with lengths not multiple of 64 and shorter than a chunk,
K=V=64 (two column blocks in the intra-chunk kernel), with and without an initial state; the intra-device
sequence split (transition pass + segment chain) and the unfused output pass, with a slow-decay gate so
that states carry across segments; the transition (M S0 + S_ext == final state from S0), plain and split;
an explicit LaunchConfig is the one launched.
Tolerance: 1e-5 relative L2 on CPU (the interpreter computes fp32 dots in IEEE fp32: measured ~3e-7);
1e-2 on a GPU, where fp32 dots run in tf32.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import kernels
from kernels.configs import LaunchConfig
from kernels.plan import LaunchRecorder, default_plan
from kernels.vocabulary import AUTO_FWD_PATH
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
SLOW = -0.05  # gate lower bound: ~exp(-1.6) decay per chunk, so initial states and segment maps matter


pytestmark = pytest.mark.parametrize("OP", ["gdn", "kda"])


def _fwd(op: str):
    return getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")


@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_triton_chunk_dense(OP: str, with_h0: bool) -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=2, T=130, H=2, K=32, V=32, lb=SLOW, device=DEVICE)
    h0 = make_state(2, 2, 32, 32, device=DEVICE) if with_h0 else None
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, initial_state=h0, output_final_state=True, backend="triton")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_triton_chunk_varlen(OP: str) -> None:
    lengths = (37, 150, 5, 64)
    q, k, v, g, beta, cu = make_inputs(OP, lengths, H=2, K=64, V=64, lb=-1.0, device=DEVICE)
    h0 = make_state(len(lengths), 2, 64, 64, device=DEVICE)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True,
                            backend="triton")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


@pytest.mark.parametrize("split,fuse", [(1, True), (2, False)], ids=["split1-fused", "split2-unfused"])
def test_triton_chunk_split(OP: str, split: int, fuse: bool) -> None:
    lengths = (10, 190, 50)
    q, k, v, g, beta, cu = make_inputs(OP, lengths, H=2, K=32, V=32, lb=SLOW, device=DEVICE)
    h0 = make_state(len(lengths), 2, 32, 32, device=DEVICE)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    rec = LaunchRecorder()
    o, ht = _fwd(OP)(q, k, v, g, beta, scale=32**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                   split_chunks=split, fuse_output=fuse, plan=default_plan().with_recorder(rec))
    fused_path = fuse and AUTO_FWD_PATH[OP] == "fused"  # the default, output fused: GDN's two-kernel path, KDA's WY one
    assert "seg_chain_fwd" in rec and ("chunk_state_transition_fwd" in rec) != fused_path, sorted(rec)
    assert (f"{OP}_fused_state_output_fwd" in rec) == fused_path, sorted(rec)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


@pytest.mark.parametrize("split", [0, 1], ids=["plain", "split1"])
def test_triton_transition(OP: str, split: int) -> None:
    from kernels.common.transition_triton import chunk_transition_fwd

    lengths = (200, 20)
    q, k, v, g, beta, cu = make_inputs(OP, lengths, H=2, K=32, V=32, lb=SLOW, device=DEVICE)
    S0 = make_state(len(lengths), 2, 32, 32, device=DEVICE)
    _, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=S0, output_final_state=True)
    M, S_ext = chunk_transition_fwd(OP, k, v, g, beta, cu_seqlens=cu, split_chunks=split)
    assert M.dtype == S_ext.dtype == torch.float32 and M.shape == (2, 2, 32, 32)
    assert_rel_close("M S0 + S_ext", ht_ref, M @ S0 + S_ext, TOL)


def test_triton_launch_config_is_launched(OP: str) -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=1, T=100, H=2, K=32, V=32, device=DEVICE)
    # the kernels each op's default forward launches: GDN's two-kernel path (the Ag pass, the fused pass), KDA's WY path
    # (its default where the TileLang walk does not run, as here)
    two = AUTO_FWD_PATH[OP] == "fused"
    prep, state = (f"wy_{OP}_ag_fwd", f"{OP}_fused_state_output_fwd") if two else ("wy_kda_fwd", "chunk_state_output_fwd")
    cfg = {state: LaunchConfig(BV=16, num_warps=2, num_stages=1), prep: LaunchConfig(BK=16, BV=16, num_warps=2, num_stages=1)}
    o_ref, _ = kernels.reference(OP, q, k, v, g, beta)
    rec = LaunchRecorder()
    o, _ = kernels.forward(OP, q, k, v, g, beta, backend="triton", config=cfg, plan=default_plan().with_recorder(rec))
    for name, c in cfg.items():
        assert rec[name][1] == c, f"{name} launched {rec[name][1]}, asked {c}"
    assert rec[prep][0]["K"] == 32
    assert_rel_close("o", o_ref, o, TOL)


def test_triton_strong_decay_at_the_documented_bound(OP: str) -> None:
    """Gates near the WY kernel's old limit (g >= -5.5 per token; any gate works now, `kernels/common/wy.py` and
    common/test_decay_gate_range.py): every token decays by e^-5 to e^-5.4, spans of 80-86 per 16-row block (the midpoint split,
    factors near e^+-43): the products must stay finite and exact. Lengths cross chunk and 16-row block edges."""
    lengths = (77, 130)
    q, k, v, _, beta, cu = make_inputs(OP, lengths, H=2, K=64, V=32, device=DEVICE)
    gen = torch.Generator().manual_seed(7)
    g_shape = (1, sum(lengths), 2) if OP == "gdn" else (1, sum(lengths), 2, 64)
    g = (-5.0 - 0.4 * torch.rand(*g_shape, generator=gen)).to(DEVICE)
    h0 = make_state(len(lengths), 2, 64, 32, device=DEVICE)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True,
                            backend="triton")
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
