"""The masked transition `kernels.transition(..., need=mask)`: flagged sequences as without the mask, others zero.

Scenarios: for GDN and KDA, on the torch and reference backends and on the triton backend (interpreted on
CPU; plain pass and split pass with segment fold, tiny shapes: H = 1, K = V = 16, 3 sequences of <= 3
chunks), the maps of flagged sequences are BITWISE those of the unmasked call (the same arithmetic: the
mask only skips or zeroes other programs) and match the fp32 reference map (1e-5 relative L2); unflagged
sequences come back as exact zeros (M = 0, S_ext = 0). A mask of the wrong shape, dtype or device is a
ValueError naming `need`.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
LENGTHS = (130, 70, 40)          # 3 + 2 + 1 chunks: the split pass (1 chunk per segment) folds 3 and 2 segments
NEED = (True, False, True)


def _check(op: str, M: torch.Tensor, S: torch.Tensor, M0: torch.Tensor, S0: torch.Tensor, k, v, g, beta, cu) -> None:
    need = torch.tensor(NEED, device=M.device)
    assert torch.equal(M[need], M0[need]) and torch.equal(S[need], S0[need])
    assert float(M[~need].abs().max()) == 0.0 and float(S[~need].abs().max()) == 0.0
    M_ref, S_ref = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend="reference")
    assert_rel_close("M (flagged)", M_ref[need.cpu()], M[need].cpu(), TOL)
    assert_rel_close("S_ext (flagged)", S_ref[need.cpu()], S[need].cpu(), TOL)


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_masked_transition_torch(op: str, backend: str) -> None:
    _, k, v, g, beta, cu = make_inputs(op, LENGTHS, H=2, K=16, V=32, lb=-0.05)
    need = torch.tensor(NEED)
    M0, S0 = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend=backend)
    M, S = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend=backend, need=need)
    _check(op, M, S, M0, S0, k, v, g, beta, cu)


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("split", [0, 1], ids=["plain", "split1"])
def test_masked_transition_triton(op: str, split: int) -> None:
    from kernels.common.transition_triton import chunk_transition_fwd

    _, k, v, g, beta, cu = make_inputs(op, LENGTHS, H=1, K=16, V=16, lb=-0.05, device=DEVICE)
    need = torch.tensor(NEED, device=DEVICE)
    M0, S0 = chunk_transition_fwd(op, k, v, g, beta, cu_seqlens=cu, split_chunks=split)
    M, S = chunk_transition_fwd(op, k, v, g, beta, cu_seqlens=cu, split_chunks=split, need=need)
    _check(op, M, S, M0, S0, k.cpu(), v.cpu(), g.cpu(), beta.cpu(), cu.cpu())
    if split == 0:   # the public entry routes the mask to the same kernel
        M2, S2 = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend="triton", need=need)
        assert torch.equal(M2, M) and torch.equal(S2, S)


@pytest.mark.parametrize(("need", "match"), [
    (torch.ones(2, dtype=torch.bool), r"need must be a bool tensor of shape \[3\]"),
    (torch.ones(3, dtype=torch.int32), r"need must be a bool tensor of shape \[3\].*int32"),
    ([True, False, True], r"need must be a bool tensor of shape \[3\].*list"),
])
def test_bad_mask_is_refused(need: object, match: str) -> None:
    _, k, v, g, beta, cu = make_inputs("gdn", LENGTHS, H=1, K=16, V=16)
    with pytest.raises(ValueError, match=match):
        kernels.transition("gdn", k, v, g, beta, cu_seqlens=cu, backend="torch", need=need)


def test_masked_transition_stores_the_skipped_states() -> None:
    """(session 32) `chunk_state_transition_fwd(need=, skipped=)`: a skipped program (per head here) stores M = 0 and
    S_ext = its skipped state, in the launch (the warm split's certified windows; no torch `where` after it); the
    others are bitwise the unmasked call's."""
    from kernels.common.chunk_state import SeqLayout, chunk_state_transition_fwd
    from kernels.common.index import prepare_chunk_index
    from kernels.common.wy import BT_WY, wy_gdn_fwd

    _, k, v, g, beta, cu = make_inputs("gdn", LENGTHS, H=2, K=16, V=16, lb=-0.05, device=DEVICE)
    index = prepare_chunk_index(cu, batch=1, seq_len=k.shape[1], chunk_size=BT_WY, device=k.device)
    w, u, gg, _ = wy_gdn_fwd(None, k, v, g, beta, scale=1.0, index=index)
    layout = SeqLayout(index.num_seqs, index.cu_seqlens, index.chunk_offsets)
    run = {"layout": layout, "BT": BT_WY, "gate_vector": False}
    M0, S0 = chunk_state_transition_fwd(k, w, u, gg, **run)
    need = torch.tensor([[True, False], [False, True], [True, True]], device=DEVICE)
    skipped = torch.randn(S0.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    M, S = chunk_state_transition_fwd(k, w, u, gg, **run, need=need, skipped=skipped)
    assert torch.equal(M[need], M0[need]) and torch.equal(S[need], S0[need])
    assert float(M[~need].abs().max()) == 0.0 and torch.equal(S[~need], skipped[~need])
