"""MATH REFERENCE for Gated DeltaNet: the per-token recurrence in fp32 (tests and `backend="reference"` only).

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

with one natural-log gate per head and token, g `[B, T, H]`. Varlen via `cu_seqlens` (B == 1), optional
initial state in and final state out. Written independently of the KDA reference (a scalar gate, not a
broadcast one) so the two check each other where they overlap. Any g <= 0 is exact, -1000 and -inf masks
included (exp(g_t) token by token, no cumulative sums: no gate floor needed, `kernels.common.decay`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["naive_recurrent_gdn"]


def naive_recurrent_gdn(
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
    """Per-token GDN. q, k `[B,T,H,K]`, v `[B,T,H,V]`, g and beta `[B,T,H]`; state `[N,H,K,V]` fp32.

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
            k_t, b_t = kf[t], bf[t]                                           # [H, K], [H]
            S = S * gf[t].exp()[:, None, None]                                # alpha_t S
            kS = torch.einsum("hk,hkv->hv", k_t, S)                           # k_t^T (alpha_t S)
            S = S + b_t[:, None, None] * k_t[:, :, None] * (vf[t] - kS)[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, qf[t])
        ht[n] = S
    return o.reshape(B, T, H, V).to(q.dtype), (ht if output_final_state else None)
