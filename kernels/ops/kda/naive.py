"""MATH REFERENCE for KDA: the per-token recurrence in fp32 (tests and `backend="reference"` only).

It lives in `common/` because it is also the general per-token reference that `common/transition.py` runs
(a GDN gate is a KDA gate broadcast over K); the op package `kernels.kda` re-exports it.

    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

with a per-key-dim natural-log gate g `[B, T, H, K]`. Varlen via `cu_seqlens` (B == 1), optional initial
state in and final state out. A Python loop over tokens: slow on purpose, obviously right. Any g <= 0 is exact,
-1000 and -inf masks included: each token multiplies by exp(g_t) (0 at -inf) and no cumulative sums are subtracted,
so it needs no gate floor (`kernels.common.decay`); autograd gives a masked gate the gradient 0 (exp(g) = 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["naive_recurrent_kda"]


def naive_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens_cpu: list[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token KDA. q, k, g `[B,T,H,K]`, v `[B,T,H,V]`, beta `[B,T,H]`; state `[N,H,K,V]` fp32.

    g may also be `[B,T,H,1]` (one gate per head, broadcast over K): that is GDN.
    Returns o `[B,T,H,V]` in q.dtype and the final state (fp32) or None.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    bounds = cu_seqlens_cpu if cu_seqlens_cpu is not None else [i * T for i in range(B + 1)]
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32   # fp64 inputs (tests) stay fp64
    qf, kf, vf, gf, bf = (x.to(cd).reshape(B * T, *x.shape[2:]) for x in (q, k, v, g, beta))
    o = torch.zeros(B * T, H, V, dtype=cd, device=q.device)
    N = len(bounds) - 1
    ht = torch.zeros(N, H, K, V, dtype=cd, device=q.device)
    for n in range(N):
        S = torch.zeros(H, K, V, dtype=cd, device=q.device)
        if initial_state is not None:
            S = initial_state[n].to(cd).clone()
        for t in range(bounds[n], bounds[n + 1]):
            S = S * gf[t].exp()[:, :, None]                                   # Diag(exp(g_t)) S
            k_t, b_t = kf[t], bf[t]                                           # [H, K], [H]
            err = vf[t] - torch.einsum("hkv,hk->hv", S, k_t)                  # v_t - S^T k_t
            S = S + b_t[:, None, None] * k_t[:, :, None] * err[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, qf[t])
        ht[n] = S
    return o.reshape(B, T, H, V).to(q.dtype), (ht if output_final_state else None)
