"""Gradients of GDN through the fp32 per-token reference (autograd), with grouped value heads: the baseline the
backward tests compare every gradient against."""

from __future__ import annotations

from torch import Tensor

from kernels.ops.gdn.naive import naive_recurrent_gdn

__all__ = ["gdn_reference_grads"]


def gdn_reference_grads(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor | None, do: Tensor, dht: Tensor | None,
    bounds: list[int], *, scale: float,
) -> list[Tensor | None]:  # fmt: skip
    """(dq, dk, dv, dg, dbeta, dh0) by autograd through the per-token reference in fp32 (q, k expanded to the value
    heads; their gradients summed back over each group); bounds: the sequences' token bounds."""
    G = v.shape[2] // k.shape[2]
    xs = [x.detach().float().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    qe, ke = (x.repeat_interleave(G, dim=2) for x in xs[:2])
    o, ht = naive_recurrent_gdn(qe, ke, *xs[2:], scale=scale, initial_state=s0, output_final_state=True,
                                cu_seqlens_cpu=bounds)  # fmt: skip
    ((o * do.float()).sum() + ((ht * dht).sum() if dht is not None else 0.0)).backward()
    return [x.grad for x in xs] + [s0.grad if s0 is not None else None]
