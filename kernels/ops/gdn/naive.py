"""MATH REFERENCE for Gated DeltaNet: the per-token recurrence in fp32 (tests and `backend="reference"` only).

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

with one natural-log gate per head and token, g `[B, T, H]`. Varlen via `cu_seqlens` (B == 1), optional
initial state in and final state out. The step is written independently of the KDA reference (a scalar gate, not a
broadcast one) so the two check each other where they overlap; the token loop is `kernels.common.per_token`.
Any g <= 0 is exact, -1000 and -inf masks included (exp(g_t) token by token, no cumulative sums: no gate floor
needed, `kernels.common.decay`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.per_token import per_token_recurrence

__all__ = ["naive_recurrent_gdn"]


def _gdn_step(S: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor, b_t: Tensor) -> Tensor:
    """One token: S `[H, K, V]`, k_t `[H, K]`, v_t `[H, V]`, g_t and b_t `[H]`."""
    S = S * g_t.exp()[:, None, None]                                      # alpha_t S
    kS = torch.einsum("hk,hkv->hv", k_t, S)                               # k_t^T (alpha_t S)
    return S + b_t[:, None, None] * k_t[:, :, None] * (v_t - kS)[:, None, :]


def naive_recurrent_gdn(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, cu_seqlens_cpu: list[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token GDN. q, k `[B,T,H,K]`, v `[B,T,H,V]`, g and beta `[B,T,H]`; state `[N,H,K,V]` fp32.

    Returns o `[B,T,H,V]` in q.dtype and the final state (fp32) or None.
    """
    return per_token_recurrence(_gdn_step, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens_cpu=cu_seqlens_cpu)
