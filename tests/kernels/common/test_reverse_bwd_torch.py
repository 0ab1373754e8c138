"""GDN's backward as one reverse walk in the Ag form (`kernels.common.reverse_bwd_torch`, the mirror of the fused
reverse backward kernel planned for issue 26) against autograd through the per-token reference: random inputs with an
initial state and a final-state gradient, T not a multiple of the chunk (padded), fp64 at 1e-9 and fp32 at 2e-5
relative L2 per gradient; three sequences of one row (varlen, each with its state); one chunk's step against
autograd through its own forward; a -1000 mask gets dg = 0."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.reverse_bwd_torch import chunk_backward_ag, chunk_forward_ag, reverse_backward
from tests.utils import assert_rel_close

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _inputs(dtype: torch.dtype, B: int = 2, T: int = 150, H: int = 2, K: int = 16, V: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    q, k = r(B, T, H, K), torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    v, do = r(B, T, H, V), r(B, T, H, V)
    g = -torch.rand(B, T, H, generator=gen, dtype=torch.float64).to(dtype) * 0.3
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, g, beta, do, r(B, H, K, V), r(B, H, K, V)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-9), (torch.float32, 2e-5)], ids=["fp64", "fp32"])
def test_reverse_walk_matches_the_reference(dtype: torch.dtype, tol: float) -> None:
    q, k, v, g, beta, do, h0, dht = _inputs(dtype)
    scale = q.shape[-1] ** -0.5
    ours = reverse_backward(q, k, v, g, beta, do, scale=scale, initial_state=h0, dht=dht, chunk_size=32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = kernels.reference("gdn", *leaves[:5], scale=scale, initial_state=leaves[5], output_final_state=True)
    ((o * do).sum() + (ht * dht).sum()).backward()
    for name, a, x in zip(NAMES, ours, leaves, strict=True):
        assert_rel_close(name, x.grad, a, tol)


def test_reverse_walk_varlen() -> None:
    """Three sequences of 37, 100 and 5 tokens in one row (chunks of 32: ragged last chunks, a one-chunk sequence),
    each with its own initial state and final-state gradient, fp64."""
    q, k, v, g, beta, do, h0, dht = _inputs(torch.float64, B=1, T=142, seed=2)
    h0, dht = torch.cat([h0] * 3)[:3], torch.cat([dht.flip(-1)] * 3)[:3]
    h0[1] *= 0.5
    cu = torch.tensor([0, 37, 137, 142])
    ours = reverse_backward(q, k, v, g, beta, do, scale=0.25, initial_state=h0, dht=dht, cu_seqlens=cu, chunk_size=32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = kernels.reference("gdn", *leaves[:5], scale=0.25, initial_state=leaves[5], output_final_state=True,
                              cu_seqlens=cu)  # fmt: skip
    ((o * do).sum() + (ht * dht).sum()).backward()
    for name, a, x in zip(NAMES, ours, leaves, strict=True):
        assert_rel_close(name, x.grad, a, 1e-9)


def test_one_chunk_against_its_own_forward() -> None:
    """`chunk_backward_ag`'s explicit gradients of one chunk (H = 2 batched, C = 24 rows) against autograd through
    `chunk_forward_ag`, with a state entering and a gradient leaving."""
    gen = torch.Generator().manual_seed(1)
    H, C, K, V = 2, 24, 16, 8

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v, do = r(H, C, K), torch.nn.functional.normalize(r(H, C, K), dim=-1), r(H, C, V), r(H, C, V)
    g, beta = -torch.rand(H, C, generator=gen, dtype=torch.float64), torch.rand(H, C, generator=gen, dtype=torch.float64)
    S, dS_next = r(H, K, V), r(H, K, V)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, S)]
    out, S_next = chunk_forward_ag(*leaves, scale=0.25)
    ((out * do).sum() + (S_next * dS_next).sum()).backward()
    got = chunk_backward_ag(q, k, v, g, beta, S, do, dS_next, scale=0.25)
    for name, a, x in zip(NAMES, got, leaves, strict=True):
        assert_rel_close(name, x.grad, a, 1e-10)


def test_masked_gate_has_no_gradient() -> None:
    q, k, v, g, beta, do, h0, dht = _inputs(torch.float64, B=1, T=40)
    g[0, 10, 0] = -1000.0  # below the floor: the cumsum sees the floor, the gate's gradient is the clamp's (0)
    dg = reverse_backward(q, k, v, g, beta, do, scale=0.25, initial_state=h0, dht=dht, chunk_size=16)[3]
    assert dg[0, 10, 0] == 0.0 and dg.abs().sum() > 0
