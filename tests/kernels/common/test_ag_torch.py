"""The torch mirror of the two-kernel forward (`kernels.common.ag_torch`) against the per-token reference in fp64:
Ag from the triangular solve, then the chunk recurrence from Ag and the gate cumsum, dense and varlen (a sequence
not a multiple of the chunk), chunk sizes 16/32/64, grouped value heads (HV = 2H), strong and weak gates, initial
states. fp64 throughout: the two agree to 1e-10 relative L2."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.ag_torch import ag_block_solve, ag_chunk_forward, ag_reference
from kernels.common.index import prepare_chunk_index
from tests.utils import assert_rel_close, make_grouped_inputs, make_state

H, HV, DIM = 2, 4, 16  # key heads, value heads, head dims
LENGTHS = (37, 130, 64)


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_the_mirror_matches_the_per_token_recurrence(chunk: int, layout: str) -> None:
    shape = {"B": 2, "T": 100} if layout == "dense" else {"lengths": LENGTHS}
    q, k, v, g, beta, cu = make_grouped_inputs(H, HV, DIM, dtype=torch.float64, **shape)
    B, T = v.shape[:2]
    N = B if cu is None else len(LENGTHS)
    h0 = make_state(N, HV, DIM, DIM).double()
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=chunk)
    ag, gcum = ag_reference(k, g, beta, index=index)
    assert ag.shape == (B, T, HV, chunk) and gcum.shape == (B, T, HV)
    o, ht = ag_chunk_forward(q, k, v, ag, gcum, scale=DIM**-0.5, index=index, initial_state=h0)
    o_ref, ht_ref = kernels.reference(
        "gdn", q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    assert ht_ref is not None
    assert_rel_close("o", o_ref, o, 1e-10)
    assert_rel_close("final state", ht_ref, ht, 1e-10)


@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("lb", [-1.0, -5.0])
def test_the_block_solve_mirror_matches_the_triangular_solve(layout: str, lb: float) -> None:
    """The TileLang Ag pass's decomposition (`ag_block_solve`: 16x16 diagonal inverses by substitution, then
    (I - N + N^2 - N^3) D^-1) equals the triangular solve in fp64 (1e-10), partial last chunks and grouped heads
    included; fp32 stays within 1e-5 of it."""
    shape = {"B": 2, "T": 150} if layout == "dense" else {"lengths": LENGTHS}
    _, k, _, g, beta, cu = make_grouped_inputs(H, HV, DIM, dtype=torch.float64, lb=lb, **shape)
    B, T = g.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=64)
    ag_ref, gcum_ref = ag_reference(k, g, beta, index=index)
    ag, gcum = ag_block_solve(k, g, beta, index=index)
    assert ag.abs().amax() > 0.1  # not an empty solve
    assert_rel_close("Ag", ag_ref, ag, 1e-10)
    assert_rel_close("gcum", gcum_ref, gcum, 1e-12)
    ag32, _ = ag_block_solve(k.float(), g.float(), beta.float(), index=index, dtype=torch.float32)
    assert_rel_close("Ag fp32", ag_ref, ag32.double(), 1e-5)
    with pytest.raises(ValueError, match="takes chunk 64, got 32"):
        ag_block_solve(k, g, beta, index=prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=32))
