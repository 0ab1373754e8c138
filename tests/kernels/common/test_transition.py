"""Segment transitions (M, S_ext) and their folding, fp32, GDN and KDA.

Scenarios: `M S0 + S_ext` equals the final state of a forward from a random S0 (torch backend; dense and
varlen, lengths not multiples of 64); the torch transition equals the reference one; cutting a sequence into
segments and chaining their maps gives the whole sequence's map and state (what true CP does); compose is
associative and agrees with chain; M of a zero-write segment (beta = 0) is the pure decay Diag(prod exp(g)).
Tolerance 1e-5 relative L2 (fp32 on both sides, measured ~1e-6).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.utils import assert_rel_close, make_inputs, make_state

TOL = 1e-5
OPS = ["gdn", "kda"]
CASES = [pytest.param(None, id="dense-B2-T100"), pytest.param((63,), id="lens-63"), pytest.param((37, 100, 4, 89), id="lens-37-100-4-89")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("lengths", CASES)
def test_transition_matches_forward(op: str, lengths: tuple[int, ...] | None) -> None:
    if lengths is None:
        q, k, v, g, beta, cu = make_inputs(op, B=2, T=100, H=2, K=32, V=16)
    else:
        q, k, v, g, beta, cu = make_inputs(op, lengths, H=2, K=32, V=16)
    N = 2 if lengths is None else len(lengths)
    M, S_ext = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend="torch")
    assert M.shape == (N, 2, 32, 32) and S_ext.shape == (N, 2, 32, 16)
    assert M.dtype == S_ext.dtype == torch.float32
    S0 = make_state(N, 2, 32, 16)
    _, ht = kernels.forward(op, q, k, v, g, beta, cu_seqlens=cu, initial_state=S0, output_final_state=True, backend="torch")
    _, ht_ref = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu, initial_state=S0, output_final_state=True)
    assert_rel_close("M S0 + S_ext vs forward", ht, M @ S0 + S_ext, TOL)
    assert_rel_close("M S0 + S_ext vs reference", ht_ref, M @ S0 + S_ext, TOL)
    M_ref, S_ref = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend="reference")
    assert_rel_close("M", M_ref, M, TOL)
    assert_rel_close("S_ext", S_ref, S_ext, TOL)


@pytest.mark.parametrize("op", OPS)
def test_chain_of_segments(op: str) -> None:
    T, cuts = 200, [0, 70, 71, 150, 200]           # segments of 70, 1, 79, 50 tokens
    q, k, v, g, beta, _ = make_inputs(op, B=1, T=T, H=2, K=16, V=32)
    Ms, Ss = [], []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        M, S = kernels.transition(op, k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], backend="torch")
        Ms.append(M[0])
        Ss.append(S[0])
    M_all, S_all = kernels.transition(op, k, v, g, beta, backend="torch")
    S0 = make_state(1, 2, 16, 32)
    _, ht = kernels.forward(op, q, k, v, g, beta, initial_state=S0, output_final_state=True, backend="torch")
    assert_rel_close("chain from 0", S_all[0], kernels.chain(torch.stack(Ms), torch.stack(Ss)), TOL)
    assert_rel_close("chain from S0", ht[0], kernels.chain(torch.stack(Ms), torch.stack(Ss), S0[0]), TOL)
    M_c, S_c = Ms[0], Ss[0]
    for M, S in zip(Ms[1:], Ss[1:], strict=True):
        M_c, S_c = kernels.compose(M_c, S_c, M, S)
    assert_rel_close("composed M", M_all[0], M_c, TOL)
    assert_rel_close("composed S_ext", S_all[0], S_c, TOL)


def test_compose_associative_and_order() -> None:
    gen = torch.Generator().manual_seed(3)
    maps = [(torch.randn(2, 8, 8, generator=gen) / 3, torch.randn(2, 8, 4, generator=gen)) for _ in range(3)]
    (M1, S1), (M2, S2), (M3, S3) = maps
    left = kernels.compose(*kernels.compose(M1, S1, M2, S2), M3, S3)
    right = kernels.compose(M1, S1, *kernels.compose(M2, S2, M3, S3))
    assert_rel_close("M", left[0], right[0], 1e-6)
    assert_rel_close("S", left[1], right[1], 1e-6)
    S0 = torch.randn(2, 8, 4, generator=gen)
    step = M3 @ (M2 @ (M1 @ S0 + S1) + S2) + S3       # apply map 1, then 2, then 3
    assert_rel_close("compose applies map 1 first", step, left[0] @ S0 + left[1], 1e-6)
    assert_rel_close("chain", step, kernels.chain(torch.stack([M1, M2, M3]), torch.stack([S1, S2, S3]), S0), 1e-6)


@pytest.mark.parametrize("op", OPS)
def test_transition_without_writes_is_decay(op: str) -> None:
    _, k, v, g, beta, cu = make_inputs(op, (40, 90), H=2, K=16, V=16)
    M, S_ext = kernels.transition(op, k, v, g, torch.zeros_like(beta), cu_seqlens=cu, backend="torch")
    g_k = g[..., None].expand(*g.shape, 16) if op == "gdn" else g
    for n, (a, b) in enumerate([(0, 40), (40, 130)]):
        decay = g_k[0, a:b].sum(0).exp()                                   # [H, K]
        assert_rel_close("M", torch.diag_embed(decay), M[n], 1e-5)
    assert float(S_ext.abs().max()) == 0.0


def test_transition_fla_is_rejected() -> None:
    _, k, v, g, beta, _ = make_inputs("gdn", B=1, T=10)
    with pytest.raises(ValueError, match="backend='fla' has no transition"):
        kernels.transition("gdn", k, v, g, beta, backend="fla")
