"""Rigorous per-channel bound on the state a warmup window drops, computed on the device from the gates (no sync).

A token's map is A_t = (I - beta_t k_t k_t^T) D_t with D_t = Diag(exp(g_t)) (GDN: exp(g_t) I), so

    ||A_t||_2 <= max(1, |1 - beta_t ||k_t||^2|) * max_k exp(g_t,k) =: exp(l_t)

(the slowest key channel, never an average over channels; the first factor is 1 for unit keys with
0 <= beta <= 2). Writing the state at the window start c as S_{c-1} and the window [c, b), the warmup
estimate E_win misses exactly M_[c,b) S_{c-1}, and with u_s = |beta_s| ||k_s|| ||v_s|| (the norm of a
write) ||S_{c-1}||_F <= sum_{s<c} u_s prod_{s<r<c} exp(l_r). With Lam_t = sum_{r<=t} l_r:

    ||M_[c,b) S_{c-1}||_F <= exp(Lam_{b-1}) * sum_{s<c} u_s exp(-Lam_s) = exp(Lam_{b-1} + LCSE_{c-1}),

LCSE = logcumsumexp(log u - Lam) over the flat token axis. The sum may include earlier sequences of a
varlen batch: more non-negative terms, still an upper bound. Everything is fp64 on the device, per
(segment, head); the max over heads is taken by the caller's decision. `log_span_bound` gives the
plain map bound exp(Lam_{b-1} - Lam_{a-1}) >= ||M_[a,b)||_2 of whole spans (how far an error in the state
entering a span can reach its end). Gates of any strength: l_t takes the gate floor of `kernels.common.decay`
(-inf masks included), so every sum stays finite. See kernels/cp/README.md. Used by the CP scheme warmup_correct and by
the intra-device split's certified warmup (`kernels.common.warm_split`), hence in kernels/common.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels.common.decay import floor_gate

__all__ = ["log_span_bound", "log_window_bound", "token_terms", "window_certified"]


def token_terms(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Per token and head, fp64 `[T, H]`: l_t (log of the map-norm bound) and log u_t (log of the write norm)."""
    gmax = g[0] if op == "gdn" else g[0].amax(-1)                         # slowest channel: the largest log decay
    kk = torch.linalg.vector_norm(k[0], dim=-1, dtype=torch.float32).double().square()
    kk = kk.repeat_interleave(v.shape[2] // k.shape[2], dim=-1)  # grouped heads: key head h // G of value head h
    vn = torch.linalg.vector_norm(v[0], dim=-1, dtype=torch.float32).double()
    b = beta[0].double()
    # the gate floor (kernels.common.decay): a -inf mask would make the span sums below -inf - (-inf); a larger log
    # bound is still a bound, and exp(-112) is 0 at fp32 anyway (the masked token is a reset)
    ell = floor_gate(gmax.double()) + (1.0 - b * kk).abs().clamp_min(1.0).log()
    log_u = b.abs().log() + 0.5 * kk.log() + vn.log()
    return ell, log_u


def log_window_bound(ell: Tensor, log_u: Tensor, ends: Tensor, starts: Tensor, valid: Tensor) -> Tensor:
    """log of the bound on ||M_[c,b) S_{c-1}||_F, fp64 `[n, H]`, for windows [c, b) = [starts, ends).

    ends/starts: int64 `[n]` token indices (b and c); valid: bool `[n]`, False where c is the sequence start
    (nothing dropped: the bound is 0, i.e. -inf here).
    """
    # scan along the innermost dim: PyTorch's CUDA scan over an outer dim walks it serially per column
    # (16 threads for [T, 16]: ~1 us per token, 60 ms at T = 64K measured on an H200); [H, T] is a parallel scan
    ell_t, log_u_t = ell.t().contiguous(), log_u.t().contiguous()
    lam = ell_t.cumsum(-1)
    lcse = torch.logcumsumexp(log_u_t - lam, -1)
    prev = (starts - 1).clamp_min(0)
    out = (lam.index_select(1, ends - 1) + lcse.index_select(1, prev)).t()
    return torch.where(valid[:, None], out, torch.full_like(out, float("-inf")))


def window_certified(log_bound: Tensor, log_window_norm: Tensor, tol: float) -> Tensor:
    """bool: the window's dropped state (log bound) is <= tol/(1+tol) of the window's own state norm, so the warmup
    estimate is within tol of the exact state, relative, in Frobenius norm (warmup_correct's rule, kept once here for
    the CP scheme and the intra-device split)."""
    return log_bound <= log_window_norm + math.log(tol / (1.0 + tol))


def log_span_bound(ell: Tensor, starts: Tensor, ends: Tensor) -> Tensor:
    """log of the bound on ||M_[a,b)||_2, fp64 `[n, H]`: sum of l_t over each span [a, b) = [starts, ends)."""
    lam = ell.t().cumsum(-1)                                               # [H, T] (a parallel scan, see above)
    lam = torch.cat([lam.new_zeros(lam.shape[0], 1), lam], -1)             # lam[:, t] = sum over tokens < t
    return (lam.index_select(1, ends) - lam.index_select(1, starts)).t()
