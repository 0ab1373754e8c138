"""MATH REFERENCE for KDA: the per-token recurrence in fp32 (tests and `backend="reference"` only), and the
reference of the transition primitive.

    S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

with a per-key-dim natural-log gate g `[B, T, H, K]`. Varlen via `cu_seqlens` (B == 1), optional initial
state in and final state out. A Python loop over tokens (`kernels.common.per_token`): slow on purpose, obviously
right. Any g <= 0 is exact, -1000 and -inf masks included: each token multiplies by exp(g_t) (0 at -inf) and no
cumulative sums are subtracted, so it needs no gate floor (`kernels.common.decay`); autograd gives a masked gate the
gradient 0 (exp(g) = 0). It is also the general per-token reference: a GDN gate is a KDA gate broadcast over K, which
is how `naive_transition` (the `reference` backend of `kernels.transition`) runs both ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.per_token import per_token_recurrence

__all__ = ["naive_recurrent_kda", "naive_transition"]


def _kda_step(S: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor, b_t: Tensor) -> Tensor:
    """One token: S `[H, K, V]`, k_t and g_t `[H, K]` (or g_t `[H, 1]`), v_t `[H, V]`, b_t `[H]`."""
    S = S * g_t.exp()[:, :, None]                                         # Diag(exp(g_t)) S
    err = v_t - torch.einsum("hkv,hk->hv", S, k_t)                        # v_t - S^T k_t
    return S + b_t[:, None, None] * k_t[:, :, None] * err[:, None, :]


def naive_recurrent_kda(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, cu_seqlens_cpu: list[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token KDA. q, k, g `[B,T,H,K]`, v `[B,T,H,V]`, beta `[B,T,H]`; state `[N,H,K,V]` fp32.

    g may also be `[B,T,H,1]` (one gate per head, broadcast over K): that is GDN.
    Returns o `[B,T,H,V]` in q.dtype and the final state (fp32) or None.
    """
    return per_token_recurrence(_kda_step, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens_cpu=cu_seqlens_cpu)


def naive_transition(k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, cu_seqlens_cpu: list[int] | None) -> tuple[Tensor, Tensor]:
    """The segment map (M `[N,H,K,K]`, S_ext `[N,H,K,V]`) fp32 from the per-token reference, on the augmented state
    [K, K+V] from [I | 0] with values [0 | v] (`kernels.common.transition`); g `[B,T,H,Kg]`, Kg in {1, K}."""
    B, T, H, K = k.shape
    N = len(cu_seqlens_cpu) - 1 if cu_seqlens_cpu is not None else B
    v_aug = torch.cat([v.new_zeros(B, T, H, K), v], -1)
    eye = torch.eye(K, dtype=torch.float32, device=k.device)
    h0 = torch.cat([eye.expand(N, H, K, K), k.new_zeros(N, H, K, v.shape[-1], dtype=torch.float32)], -1)
    # q is not used for the state; pass k so shapes line up
    _, S = naive_recurrent_kda(k, k, v_aug.float(), g, beta, initial_state=h0, output_final_state=True, cu_seqlens_cpu=cu_seqlens_cpu)
    assert S is not None
    return S[..., :K].contiguous(), S[..., K:].contiguous()
