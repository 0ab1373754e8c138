"""The per-token loop shared by the fp32 references of GDN and KDA (tests and `backend="reference"` only).

`per_token_recurrence(step, ...)` walks every sequence token by token in fp32 (fp64 for fp64 inputs), from the
initial state or zeros, calls the op's `step(S, k_t, v_t, g_t, beta_t) -> S_t` (the op's own recurrence, written in
`kernels/ops/<op>/naive.py`) and reads `o_t = scale * S_t^T q_t`. Varlen via host bounds (B == 1). No cumulative
sums: a -inf or -1000 gate is exact (`kernels.common.decay`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["Step", "per_token_recurrence"]

Step = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (S, k_t, v_t, g_t, beta_t) -> S_t, per head


def per_token_recurrence(
    step: Step,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None,
    initial_state: Tensor | None,
    output_final_state: bool,
    cu_seqlens_cpu: list[int] | None,
) -> tuple[Tensor, Tensor | None]:
    """(o `[B,T,H,V]` in q.dtype, final state `[N,H,K,V]` fp32 or None) of the recurrence `step`."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    bounds = cu_seqlens_cpu if cu_seqlens_cpu is not None else [i * T for i in range(B + 1)]
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32  # fp64 inputs (tests) stay fp64
    qf, kf, vf, gf, bf = (x.to(cd).reshape(B * T, *x.shape[2:]) for x in (q, k, v, g, beta))
    o = torch.zeros(B * T, H, V, dtype=cd, device=q.device)
    N = len(bounds) - 1
    ht = torch.zeros(N, H, K, V, dtype=cd, device=q.device)
    for n in range(N):
        S = torch.zeros(H, K, V, dtype=cd, device=q.device)
        if initial_state is not None:
            S = initial_state[n].to(cd).clone()
        for t in range(bounds[n], bounds[n + 1]):
            S = step(S, kf[t], vf[t], gf[t], bf[t])
            o[t] = scale * torch.einsum("hkv,hk->hv", S, qf[t])
        ht[n] = S
    return o.reshape(B, T, H, V).to(q.dtype), (ht if output_final_state else None)
