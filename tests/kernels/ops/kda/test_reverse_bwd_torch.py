"""KDA's backward as one reverse walk in the gated form (`kernels.ops.kda.reverse_bwd_torch`, the mirror of a fused
KDA reverse backward kernel) against autograd through the per-token reference, on random inputs (per-key gates, one
head strong: down to -4 per token and key, a -1000 mask): fp64 at 1e-9 relative L2 per gradient (dense, T not a
multiple of the chunk; varlen with three sequences, each with its state and final-state gradient); one chunk's
explicit gradients against autograd through its own forward; the kernel form (`chunk_backward_products`: the kept
gated tensors, four decayed products, B never formed) equal to the plain form at 1e-11; a gate equal across keys
gives GDN's chunk gradients (`kernels.common.reverse_bwd_torch.chunk_backward_ag`, dg summed over the keys); the
decayed products by 16-row blocks with a reference each (the kernel's way) equal to the elementwise ones at 1e-11, on
both paths (a span of 1600 in one block: the midpoint's factors would overflow fp64 there)."""

from __future__ import annotations

import torch

import kernels
from kernels.common.reverse_bwd_torch import chunk_backward_ag
from kernels.ops.kda.reverse_bwd_torch import (
    chunk_backward_gated,
    chunk_backward_products,
    chunk_forward_gated,
    gated_factors,
    reverse_backward,
)
from tests.utils import assert_rel_close

NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _gen(seed: int) -> tuple[torch.Generator, object]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return gen, r


def _inputs(B: int = 2, T: int = 75, H: int = 2, K: int = 8, V: int = 6, seed: int = 0):  # noqa: ANN202
    gen, r = _gen(seed)
    q, k = r(B, T, H, K), torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    v, do = r(B, T, H, V), r(B, T, H, V)
    g = -0.3 * torch.rand(B, T, H, K, generator=gen, dtype=torch.float64)
    g[:, :, 0] *= 13  # head 0 strong: down to -4 per token and key
    g[0, 5, 1, 2] = -1000.0  # a mask (floored: its gradient 0)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta, do, r(B, H, K, V), r(B, H, K, V)


def _reference(q, k, v, g, beta, do, h0, dht, scale, cu=None):  # noqa: ANN001, ANN202
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = kernels.reference("kda", *leaves[:5], scale=scale, initial_state=leaves[5], output_final_state=True,
                              cu_seqlens=cu)  # fmt: skip
    ((o * do).sum() + (ht * dht).sum()).backward()
    return [x.grad for x in leaves]


def test_reverse_walk_matches_the_reference() -> None:
    q, k, v, g, beta, do, h0, dht = _inputs()
    scale = q.shape[-1] ** -0.5
    ours = reverse_backward(q, k, v, g, beta, do, scale=scale, initial_state=h0, dht=dht, chunk_size=16)
    ref = _reference(q, k, v, g, beta, do, h0, dht, scale)
    assert float(ours[3][0, 5, 1, 2]) == 0.0 and float(ref[3].abs().amax()) > 0  # the mask's gate: no gradient
    for name, a, x in zip(NAMES, ours, ref, strict=True):
        assert_rel_close(name, x, a, 1e-9)


def test_reverse_walk_varlen() -> None:
    """Three sequences of 20, 41 and 5 tokens in one row (chunks of 16: ragged last chunks, a sequence shorter than a
    chunk), each with its own initial state and final-state gradient."""
    q, k, v, g, beta, do, h0, dht = _inputs(B=1, T=66, seed=2)
    h0, dht = torch.cat([h0] * 3)[:3], torch.cat([dht.flip(-1)] * 3)[:3]
    h0[1] *= 0.5
    cu = torch.tensor([0, 20, 61, 66])
    ours = reverse_backward(q, k, v, g, beta, do, scale=0.3, initial_state=h0, dht=dht, cu_seqlens=cu, chunk_size=16)
    for name, a, x in zip(NAMES, ours, _reference(q, k, v, g, beta, do, h0, dht, 0.3, cu), strict=True):
        assert_rel_close(name, x, a, 1e-9)


def _chunk_case(seed: int = 1, H: int = 2, C: int = 16, K: int = 8, V: int = 6):  # noqa: ANN202
    gen, r = _gen(seed)
    q, k, v, do = r(H, C, K), torch.nn.functional.normalize(r(H, C, K), dim=-1), r(H, C, V), r(H, C, V)
    g = -0.5 * torch.rand(H, C, K, generator=gen, dtype=torch.float64)
    beta = torch.rand(H, C, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta, do, r(H, K, V), r(H, K, V)


def test_one_chunk_against_its_own_forward() -> None:
    """`chunk_backward_gated`'s explicit gradients of one chunk (H = 2 batched) against autograd through
    `chunk_forward_gated`, with a state entering and a gradient leaving."""
    q, k, v, g, beta, do, S, dSn = _chunk_case()
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, S)]
    o, Sn = chunk_forward_gated(*leaves[:5], leaves[5], scale=0.4)
    ((o * do).sum() + (Sn * dSn).sum()).backward()
    ours = chunk_backward_gated(q, k, v, g, beta, S, do, dSn, scale=0.4)
    for name, a, x in zip(("dq", "dk", "dv", "dg", "dbeta", "dS"), ours, leaves, strict=True):
        assert_rel_close(name, x.grad, a, 1e-11)


def test_the_kernel_form_equals_the_plain_form() -> None:
    """From the kept gated tensors (what keep "ag" holds, T included) and four decayed products, without B."""
    q, k, v, g, beta, do, S, dSn = _chunk_case(seed=4)
    f = gated_factors(q, k, g, beta, 0.4)
    kept = {name: f[name] for name in ("Ag", "Aqk", "T", "qg", "ke", "kd", "GC")}
    plain = chunk_backward_gated(q, k, v, g, beta, S, do, dSn, scale=0.4)
    ours = chunk_backward_products(q, k, v, g, beta, S, do, dSn, kept=kept, scale=0.4)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dS"), ours, plain, strict=True):
        assert_rel_close(name, b, a, 1e-11)


def test_a_gate_equal_across_keys_is_gdn() -> None:
    """KDA with every key's gate the token's GDN gate: the same O, S' and gradients as GDN's chunk (KDA's dg summed
    over the keys is GDN's)."""
    q, k, v, g, beta, do, S, dSn = _chunk_case(seed=5)
    gs = g[..., 0]  # [H, C]
    gk = gs[..., None].expand_as(g).contiguous()
    kda = chunk_backward_gated(q, k, v, gk, beta, S, do, dSn, scale=0.4)
    gdn = chunk_backward_ag(q, k, v, gs, beta, S, do, dSn, scale=0.4)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dS"), kda, gdn, strict=True):
        assert_rel_close(name, b, a.sum(-1) if name == "dg" else a, 1e-11)


def test_blocked_decayed_products_equal_the_elementwise_ones() -> None:
    """`decayed_products_blocks` (16-row blocks, one reference per block and key, as a kernel) equals the elementwise
    `decayed_products` at 1e-11, on the fast path (weak gates: midpoint references) and the other one (a key whose
    span across a block passes FAST_SPAN: the references at the blocks' edges and the diagonal blocks elementwise,
    with factors that would overflow e^(G_i - G_j) written as e^G_i e^-G_j)."""
    from kernels.common.decay import floor_gate
    from kernels.ops.kda.ag_torch import FAST_SPAN
    from kernels.ops.kda.reverse_bwd_torch import decayed_products, decayed_products_blocks

    _, r = _gen(7)
    H, C, K = 2, 64, 8
    X = r(H, C, C).tril()
    a = r(H, C, K)
    for strong in (False, True):
        g = -0.2 * torch.rand(H, C, K, dtype=torch.float64)
        if strong:
            g[1, 16:32, 3] = -100.0  # a span of 1600 in block 1: past FAST_SPAN, and e^800 overflows fp64
        G = floor_gate(g).cumsum(-2)
        spans = G[:, 15::16] - torch.cat([torch.zeros_like(G[:, :1]), G[:, 15:-1:16]], 1)
        assert bool((-spans).amax() >= FAST_SPAN) == strong
        for name, got, want in zip(("R", "Cc"), decayed_products_blocks(X, a, G), decayed_products(X, a, G), strict=True):
            assert_rel_close(f"{name} (strong={strong})", want, got, 1e-11)
