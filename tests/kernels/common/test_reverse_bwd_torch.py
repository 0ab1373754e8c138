"""GDN's backward as one reverse walk in the Ag form (`kernels.common.reverse_bwd_torch`, the mirror of the fused
reverse backward kernel planned for issue 26) against autograd through the per-token reference: random inputs with an
initial state and a final-state gradient, T not a multiple of the chunk (padded), fp64 at 1e-9 and fp32 at 2e-5
relative L2 per gradient; three sequences of one row (varlen, each with its state); one chunk's step against
autograd through its own forward; a -1000 mask gets dg = 0. The TileLang kernel's decomposition
(`chunk_backward_kernel_form`, `reverse_walk`): one chunk equal to `chunk_backward_ag` at 1e-10 in fp64, and the walk
over split ranges (two-chunk segments of three varlen sequences, grouped heads, each range from its end gradient and
the kept chunk states) equal to `reverse_backward` at 1e-9."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.reverse_bwd_torch import (
    _factors,
    chunk_backward_ag,
    chunk_backward_kernel_form,
    chunk_forward_ag,
    reverse_backward,
    reverse_walk,
)
from tests.utils import assert_rel_close
from tests.utils.reverse_walk import kept_for_walk

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


def test_kernel_form_equals_the_ag_form_on_one_chunk() -> None:
    """The kernel's products (T = I - Ag M from the kept Ag, the gates folded into Og and Wn, dG per row) give the
    Ag form's dq, dk, dv, dbeta and entering gradient, and dG's reverse cumsum is its dg (fp64, 1e-10)."""
    q, k, v, g, beta, do, S, dSn = _inputs(torch.float64, B=1, T=32, H=3, seed=4)
    q, k, v, g, beta, do = (x[0].transpose(0, 1) for x in (q, k, v, g, beta, do))  # [H, C, ..]
    S, dSn = S[0, :3], dSn[0, :3]
    f = _factors(q, k, g, beta, 0.3)
    want = chunk_backward_ag(q, k, v, g, beta, S, do, dSn, scale=0.3)
    dq, dk, dv, dG, dbeta, dS = chunk_backward_kernel_form(q, k, v, do, f["Ag"], f["G"], beta, S, dSn, scale=0.3)
    got = (dq, dk, dv, dG.flip(-1).cumsum(-1).flip(-1), dbeta, dS)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dS"), got, want, strict=True):
        assert_rel_close(name, b, a, 1e-10)


def test_kernel_walk_over_split_ranges_matches_the_reverse_backward() -> None:
    """`reverse_walk` (the kernel's launcher in torch) over ranges of two chunks (chunks of 16: three sequences of
    37, 100 and 5 tokens, grouped heads Hk = 1, H = 2), each range from its end gradient (dht for a sequence's last,
    else the gradient entering the rest of the sequence) and the kept chunk states: `reverse_backward`'s gradients
    and dh0 (fp64, 1e-9)."""
    C, scale = 16, 0.25
    q, k, v, g, beta, do, h0, dht = _inputs(torch.float64, B=1, T=142, H=2, seed=6)
    q, k = q[:, :, :1], k[:, :, :1]
    h0, dht = torch.cat([h0, 0.5 * h0, -h0]), torch.cat([dht, dht.flip(-1), -dht])
    cu = [0, 37, 137, 142]
    qe, ke = q.expand(-1, -1, 2, -1), k.expand(-1, -1, 2, -1)
    ag, gs, h, first = kept_for_walk(q, k, v, g, beta, h0, cu, C, scale)
    bounds, offs, fin, ends = [], [], [], []
    for n in range(3):
        starts = list(range(cu[n], cu[n + 1], 2 * C))
        for j, s0 in enumerate(starts):
            e = min(s0 + 2 * C, cu[n + 1])
            bounds.append(s0)
            offs.append(first[n] + (s0 - cu[n]) // C)
            fin.append(n if j == 0 else -1)
            if e == cu[n + 1]:
                ends.append(dht[n])
            else:  # the gradient entering the rest of the sequence: independent of the states
                sl = slice(e, cu[n + 1])
                rest = reverse_backward(qe[:, sl], ke[:, sl], v[:, sl], g[:, sl], beta[:, sl], do[:, sl], scale=scale,
                                        dht=dht[n : n + 1], chunk_size=C)  # fmt: skip
                ends.append(rest[5][0])
    bounds.append(cu[-1])
    got = reverse_walk(q, k, v, g, gs, beta, ag, h, do, scale=scale, cu=torch.tensor(bounds),
                       chunk_offsets=torch.tensor(offs), ends=torch.stack(ends), final_idx=torch.tensor(fin),
                       num_seqs=3)  # fmt: skip
    dq, dk, dv, dg, dbeta, dh0 = got
    dq, dk = (x.view(1, 142, 1, 2, -1).sum(3) for x in (dq, dk))
    want = reverse_backward(qe, ke, v, g, beta, do, scale=scale,
                            initial_state=h0, dht=dht, cu_seqlens=torch.tensor(cu), chunk_size=C)  # fmt: skip
    wdq, wdk = (x.view(1, 142, 1, 2, -1).sum(3) for x in want[:2])
    for name, a, b in zip(NAMES, (dq, dk, dv, dg, dbeta, dh0), (wdq, wdk, *want[2:]), strict=True):
        assert_rel_close(name, b, a, 1e-9)
