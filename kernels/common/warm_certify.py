"""The warm split's certification from the per-chunk bound sums in one Triton launch (`kernels.common.warm_split`).

`certify_windows` on the chunk sums was about 12 torch launches on fp64 `[NT, H]` tensors (0.4 ms measured on the
H200 at 1x128K, kernels/NOTES.md): a transpose, a cumsum, a logcumsumexp, index_selects, the norm of E_win and the
comparison. Here one program per (window, head) computes the same fp64 quantities:

    Lam_j = sum_{i <= j} L_i                      (over the global chunk axis, as `decay_bound.log_window_bound`)
    bound = Lam_{e-1} + log sum_{j < s} exp(W_j - Lam_j)     for the window [s, e) of chunks
    certified = valid and bound <= log ||E_win||_F + log(tol / (1 + tol))   (`decay_bound.window_certified`)

scanning the chunks [0, e) in blocks with an online log-sum-exp (no host sync). An initial state's write at a
sequence's first chunk is folded into W by the caller (`certify_windows`) before the launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.configs import next_power_of_2

__all__ = ["certify_chunk_windows"]

BLOCK_CHUNKS = 256  # chunks per scan step
BLOCK_STATE = 1024  # E_win elements per step of its norm


@triton.jit
def certify_chunk_windows_kernel(
    ell, log_u,  # [NT, H] any float (strided: the chunk sums' two columns): L_j and W_j
    s_t, s_h,  # their strides (elements) along chunks and heads
    starts, ends, valid,  # [NW] int64 chunk indices [s, e) of the windows, bool valid
    e_win,  # [NW, H, K*V] fp32: the windows' states from zero
    log_bound, ok, need,  # out [NW, H] fp64 bound, bool certified, bool not certified (the transitions' flags)
    log_ratio,  # log(tol / (1 + tol))
    H: tl.constexpr, KV: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    i_w, i_h = tl.program_id(0), tl.program_id(1)
    s = tl.load(starts + i_w)
    e = tl.load(ends + i_w)
    o_c = tl.arange(0, BC)
    lam = tl.zeros([], dtype=tl.float64)  # Lam before the block
    m = tl.full([], float("-inf"), dtype=tl.float64)  # running max of W_j - Lam_j, j < s
    acc = tl.zeros([], dtype=tl.float64)  # sum of exp(W_j - Lam_j - m)
    for c0 in range(0, e, BC):
        j = c0 + o_c
        L = tl.load(ell + j * s_t + i_h * s_h, mask=j < e, other=0.0).to(tl.float64)
        lam_j = lam + tl.cumsum(L, 0)
        u = tl.load(log_u + j * s_t + i_h * s_h, mask=j < s, other=float("-inf")).to(tl.float64)
        x = tl.where(j < s, u - lam_j, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # finite: exp(-inf - m_ref) = 0, never NaN
        acc = acc * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref), 0)
        m = m_new
        lam = lam + tl.sum(L, 0)
    bound = lam + m + tl.log(acc)  # -inf when nothing comes before the window
    bound = tl.where(tl.load(valid + i_w) != 0, bound, float("-inf"))
    ss = tl.zeros([], dtype=tl.float64)
    o_s = tl.arange(0, BS)
    for p0 in range(0, KV, BS):
        y = tl.load(e_win + (i_w * H + i_h) * KV + p0 + o_s, mask=p0 + o_s < KV, other=0.0).to(tl.float64)
        ss += tl.sum(y * y, 0)
    tl.store(log_bound + i_w * H + i_h, bound)
    b_ok = bound <= 0.5 * tl.log(ss) + log_ratio
    tl.store(ok + i_w * H + i_h, b_ok.to(tl.uint8))
    tl.store(need + i_w * H + i_h, (b_ok == 0).to(tl.uint8))


def certify_chunk_windows(
    ell: Tensor, log_u: Tensor, starts: Tensor, ends: Tensor, valid: Tensor, E_win: Tensor, tol: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(log bound fp64 `[NW, H]`, certified bool `[NW, H]`, its negation: the pairs whose exact transitions run, in
    the same launch (session 32: a torch `~` less on the host)) of the windows [starts, ends) (global chunk indices,
    int64 `[NW]`; valid bool `[NW]`) from the per-chunk L = ell and W = log_u (`[NT, H]`, any float dtype and strides)
    and the windows' states E_win fp32 `[NW, H, K, V]`: `decay_bound.log_window_bound` and `window_certified` at once."""
    NW, H = E_win.shape[0], E_win.shape[1]
    assert ell.shape == log_u.shape and ell.shape[1] == H and ell.stride() == log_u.stride(), (
        f"ell {tuple(ell.shape)} / log_u {tuple(log_u.shape)} must share shape and strides with H={H} heads"
    )
    log_bound = torch.empty(NW, H, dtype=torch.float64, device=E_win.device)
    ok, need = torch.empty(2, NW, H, dtype=torch.bool, device=E_win.device)
    if NW == 0:
        return log_bound, ok, need
    KV = E_win.shape[2] * E_win.shape[3]
    certify_chunk_windows_kernel[(NW, H)](
        ell, log_u, ell.stride(0), ell.stride(1), starts, ends, valid, E_win.contiguous(),
        log_bound, ok, need, math.log(tol / (1.0 + tol)),
        H=H, KV=KV, BC=BLOCK_CHUNKS, BS=min(BLOCK_STATE, next_power_of_2(KV)), num_warps=4,
    )  # fmt: skip
    return log_bound, ok, need
