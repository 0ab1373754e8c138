"""The forward's kept factors for GDN's reverse-walk backward (Ag, the gate cumsum, the chunk states), built by the
torch Ag form (`kernels.common.reverse_bwd_torch`): the inputs of `reverse_walk` and of the TileLang kernel it
mirrors, for their tests."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.reverse_bwd_torch import _factors, chunk_forward_ag

__all__ = ["kept_for_walk"]


def kept_for_walk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor, cu: list[int], C: int, scale: float
) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """(Ag `[1, T, H, C]`, gate cumsum `[1, T, H]`, the chunk states `[NT, H, K, V]` entering each chunk, the first
    chunk of each sequence) as the forward keeps them, by the torch Ag form (q, k with Hk heads, v with H), in the
    inputs' dtype and device (B = 1, sequences bounded by cu)."""
    grp = v.shape[2] // k.shape[2]
    qe, ke = (x[0].repeat_interleave(grp, 1) for x in (q, k))
    ag = torch.zeros(*v.shape[:3], C, dtype=q.dtype, device=q.device)
    gs = torch.zeros(g.shape, dtype=q.dtype, device=q.device)
    hs: list[Tensor] = []
    first: list[int] = []
    for n in range(len(cu) - 1):
        S = h0[n]
        first.append(len(hs))
        for c0 in range(cu[n], cu[n + 1], C):
            rows = torch.arange(c0, min(c0 + C, cu[n + 1]), device=q.device)
            m = rows.numel()

            xs = [torch.cat([x[rows], x.new_zeros(C - m, *x.shape[1:])]).transpose(0, 1)  # [H, C, ..], padded
                  for x in (qe, ke, v[0], g[0], beta[0])]  # fmt: skip
            f = _factors(xs[0], xs[1], xs[3], xs[4], scale)
            ag[0, rows] = f["Ag"].transpose(0, 1)[:m]
            gs[0, rows] = f["G"].transpose(0, 1)[:m]
            hs.append(S)
            S = chunk_forward_ag(*xs, S, scale=scale)[1]
    return ag, gs, torch.stack(hs), first
