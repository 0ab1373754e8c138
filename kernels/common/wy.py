"""Intra-chunk preparation (the WY form) of GDN and KDA, one Triton program per (chunk, head).

Per chunk of C = 64 tokens (DESIGN.md §1), with G the cumulative log gate inside the chunk:

    A = StrictLower(beta_i k_i.k_j exp(G_i - G_j))      (KDA: sum_d k_id k_jd exp(G_id - G_jd))
    T = (I + A)^{-1}                                     (4x4 blocks of 16: forward substitution on the
                                                          diagonal blocks, block forward substitution off it)
    w = T (beta * exp(G) * K),   u = T (beta * V)

Both store the intra-chunk attention Aqk = scale * (Q K^T (x) exp(G_i - G_j)) on and below the diagonal,
[B, T, H, C], when q is given (the transition primitive has no q). GDN (`wy_gdn_fwd`) also stores the fp32
in-chunk gate cumsum `gcum` [B, T, H]; the state and output kernels apply the scalar gate themselves. KDA (`wy_kda_fwd`) stores everything the later kernels need so that they
never touch the per-key gate again: kg = K * exp(G_C - G) (the gated key of the state update), the per-chunk
last-row gate gc [NT_total, H, K] fp32, and when q is given qg = scale * Q * exp(G).

T itself is written to `ainv` [B, T, H, C] (k's dtype, like FLA's A) and read back by the same program as one
64x64 tile for the w/u products (a `debug_barrier` orders the write and the read within the program).

KDA numerics: exp(G_i - G_j) is factored around a reference row per 16-row block so that every factor is
<= 1 except on the diagonal blocks, where the factor exp(G_ref - G_j) spans at most 16 tokens: the per-key
log-decay summed over 16 consecutive tokens must stay above -88 (fp32 exp overflow), i.e. g >= -5.5 per
token is always safe (FLA's safe_gate asks g >= -5).

Grid: dense input (NT, B*H); varlen (NT_total, H) with the chunk index of `kernels.common.index`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.index import ChunkIndex
from kernels.configs import KernelSpec, LaunchConfig, pick_config, register

__all__ = ["WY_GDN_FWD", "WY_KDA_FWD", "wy_gdn_fwd", "wy_kda_fwd"]

BT_WY = 64  # the kernels are written for 4 blocks of 16 rows

WY_GDN_FWD = register(KernelSpec(
    name="wy_gdn_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # BK/BV: column blocks of the whole-chunk products (w, u, Aqk); 64 keeps a [64, 64] fp32 accumulator at
    # 32 registers a thread with 4 warps. 8 warps: the 16-row phase holds four [16, K] key blocks
    default=LaunchConfig(BK=64, BV=64, num_warps=8, num_stages=2),
    # chunk-parallel, so occupancy matters more than per-program speed; num_stages only affects the loads
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2)},
))

WY_KDA_FWD = register(KernelSpec(
    name="wy_kda_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # the per-key gate needs fp32 [64, BK] tiles (G, exp factors) next to the keys: BK 64 with 8 warps
    default=LaunchConfig(BK=64, BV=64, num_warps=8, num_stages=2),
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2)},
))


# ---------------------------------------------------------------------------------------------------------------------
# helpers


@triton.jit
def _load_tile(p, bos, r0, T, i_h, H: tl.constexpr, D: tl.constexpr, c0, BR: tl.constexpr, BC: tl.constexpr):
    """Rows [r0, r0+BR), columns [c0, c0+BC) of a [.., T, H, D] tensor for head i_h, zero past T."""
    o_r = r0 + tl.arange(0, BR)
    o_d = c0 + tl.arange(0, BC)
    m_r = o_r < T
    return tl.load(p + ((bos + o_r) * H + i_h)[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.)


@triton.jit
def _load_vec(p, bos, r0, T, i_h, H: tl.constexpr, BR: tl.constexpr):
    """Rows [r0, r0+BR) of a [.., T, H] tensor for head i_h as fp32 [BR], zero past T."""
    o_r = r0 + tl.arange(0, BR)
    return tl.load(p + (bos + o_r) * H + i_h, mask=o_r < T, other=0.).to(tl.float32)


@triton.jit
def _inv_unit_lower16(b_A):
    """(I + A)^{-1} of a strictly lower 16x16 fp32 tile, by forward substitution row by row."""
    o_i = tl.arange(0, 16)
    b_T = -b_A
    for i in tl.static_range(2, 16):
        # row i of T (strict part) = -A_i - sum_k A_ik T_k
        b_a = -tl.sum(tl.where(o_i[:, None] == i, b_A, 0.), 0)
        b_a = b_a + tl.sum(b_a[:, None] * b_T, 0)
        b_T = tl.where(o_i[:, None] == i, b_a[None, :], b_T)
    return b_T + tl.where(o_i[:, None] == o_i[None, :], 1., 0.)


@triton.jit
def _solve_blocks(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33):
    """T = (I + A)^{-1} for a 64x64 strictly lower A given as 16x16 blocks: T_IJ = -T_II sum_K A_IK T_KJ."""
    T00 = _inv_unit_lower16(A00)
    T11 = _inv_unit_lower16(A11)
    T22 = _inv_unit_lower16(A22)
    T33 = _inv_unit_lower16(A33)
    T10 = -tl.dot(T11, tl.dot(A10, T00))
    T21 = -tl.dot(T22, tl.dot(A21, T11))
    T32 = -tl.dot(T33, tl.dot(A32, T22))
    T20 = -tl.dot(T22, tl.dot(A20, T00) + tl.dot(A21, T10))
    T31 = -tl.dot(T33, tl.dot(A31, T11) + tl.dot(A32, T21))
    T30 = -tl.dot(T33, tl.dot(A30, T00) + tl.dot(A31, T10) + tl.dot(A32, T20))
    return T00, T10, T11, T20, T21, T22, T30, T31, T32, T33


@triton.jit
def _store_block(p, b, bos, r0, c0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """Store a 16x16 tile at rows [r0, r0+16), columns [c0, c0+16) of a [.., T, H, BT] tensor."""
    o_i = tl.arange(0, 16)
    o_r = r0 + o_i
    tl.store(p + ((bos + o_r) * H + i_h)[:, None] * BT + (c0 + o_i)[None, :], b.to(p.dtype.element_ty),
             mask=(o_r < T)[:, None])


@triton.jit
def _store_inverse(ainv, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h,
                   H: tl.constexpr, BT: tl.constexpr):
    _store_block(ainv, T00, bos, t0, 0, T, i_h, H, BT)
    _store_block(ainv, T10, bos, t0 + 16, 0, T, i_h, H, BT)
    _store_block(ainv, T11, bos, t0 + 16, 16, T, i_h, H, BT)
    _store_block(ainv, T20, bos, t0 + 32, 0, T, i_h, H, BT)
    _store_block(ainv, T21, bos, t0 + 32, 16, T, i_h, H, BT)
    _store_block(ainv, T22, bos, t0 + 32, 32, T, i_h, H, BT)
    _store_block(ainv, T30, bos, t0 + 48, 0, T, i_h, H, BT)
    _store_block(ainv, T31, bos, t0 + 48, 16, T, i_h, H, BT)
    _store_block(ainv, T32, bos, t0 + 48, 32, T, i_h, H, BT)
    _store_block(ainv, T33, bos, t0 + 48, 48, T, i_h, H, BT)


@triton.jit
def _load_inverse(ainv, bos, t0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """T as one [BT, BT] tile (lower triangle incl. diagonal; zero above and past T)."""
    o_t = tl.arange(0, BT)
    m_t = (t0 + o_t) < T
    return tl.load(ainv + ((bos + t0 + o_t) * H + i_h)[:, None] * BT + o_t[None, :],
                   mask=m_t[:, None] & (o_t[:, None] >= o_t[None, :]), other=0.)


@triton.jit
def _gdn_gate(b_A, b_gi, b_bi, b_gj, DIAG: tl.constexpr):
    """beta_i (k_i.k_j) exp(G_i - G_j) for one 16x16 block from its k_i.k_j (strictly lower when DIAG)."""
    o_i = tl.arange(0, 16)
    b_d = b_gi[:, None] - b_gj[None, :]
    if DIAG:
        b_d = tl.where(o_i[:, None] > o_i[None, :], b_d, float("-inf"))
    return b_A * tl.exp(b_d) * b_bi[:, None]


# ---------------------------------------------------------------------------------------------------------------------
# GDN


@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_Q": lambda args: args["q"] is not None,
})
@triton.jit(do_not_specialize=["T"])
def wy_gdn_fwd_kernel(
    q,  # [B, T, H, K] or None (transition only)
    k,  # [B, T, H, K]
    v,  # [B, T, H, V]
    g,  # [B, T, H] natural-log gate
    beta,  # [B, T, H]
    w,  # out [B, T, H, K]
    u,  # out [B, T, H, V]
    gcum,  # out [B, T, H] fp32 in-chunk cumsum of g
    aqk,  # out [B, T, H, BT] = scale (Q K^T (x) decay), lower incl. diagonal (if q)
    ainv,  # out [B, T, H, BT] (I + A)^{-1}
    cu_seqlens,  # [N+1] int32 or None
    chunk_indices,  # [NT_total, 2] int32 or None
    scale,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_Q: tl.constexpr,
):
    tl.static_assert(BT == 64, "the WY kernel is written for 64-token chunks")
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_t * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = eos - bos
    else:
        bos = i_b.to(tl.int64) * T
    t0 = i_t * BT

    # 16-row blocks: beta and the cumulative gate (carried across blocks)
    b_b0 = _load_vec(beta, bos, t0, T, i_h, H, 16)
    b_b1 = _load_vec(beta, bos, t0 + 16, T, i_h, H, 16)
    b_b2 = _load_vec(beta, bos, t0 + 32, T, i_h, H, 16)
    b_b3 = _load_vec(beta, bos, t0 + 48, T, i_h, H, 16)
    b_r = _load_vec(g, bos, t0, T, i_h, H, 16)
    b_g0 = tl.cumsum(b_r, 0)
    b_s = tl.sum(b_r, 0)
    b_r = _load_vec(g, bos, t0 + 16, T, i_h, H, 16)
    b_g1 = tl.cumsum(b_r, 0) + b_s
    b_s += tl.sum(b_r, 0)
    b_r = _load_vec(g, bos, t0 + 32, T, i_h, H, 16)
    b_g2 = tl.cumsum(b_r, 0) + b_s
    b_s += tl.sum(b_r, 0)
    b_r = _load_vec(g, bos, t0 + 48, T, i_h, H, 16)
    b_g3 = tl.cumsum(b_r, 0) + b_s

    # K K^T blocks, accumulated over column blocks of BK (keeps the key tiles small)
    A00 = tl.zeros([16, 16], dtype=tl.float32)
    A10 = tl.zeros([16, 16], dtype=tl.float32)
    A11 = tl.zeros([16, 16], dtype=tl.float32)
    A20 = tl.zeros([16, 16], dtype=tl.float32)
    A21 = tl.zeros([16, 16], dtype=tl.float32)
    A22 = tl.zeros([16, 16], dtype=tl.float32)
    A30 = tl.zeros([16, 16], dtype=tl.float32)
    A31 = tl.zeros([16, 16], dtype=tl.float32)
    A32 = tl.zeros([16, 16], dtype=tl.float32)
    A33 = tl.zeros([16, 16], dtype=tl.float32)
    for i_k in tl.static_range(K // BK):
        b_k0 = _load_tile(k, bos, t0, T, i_h, H, K, i_k * BK, 16, BK)
        b_k1 = _load_tile(k, bos, t0 + 16, T, i_h, H, K, i_k * BK, 16, BK)
        b_k2 = _load_tile(k, bos, t0 + 32, T, i_h, H, K, i_k * BK, 16, BK)
        b_k3 = _load_tile(k, bos, t0 + 48, T, i_h, H, K, i_k * BK, 16, BK)
        A00 = tl.dot(b_k0, tl.trans(b_k0), A00)
        A10 = tl.dot(b_k1, tl.trans(b_k0), A10)
        A11 = tl.dot(b_k1, tl.trans(b_k1), A11)
        A20 = tl.dot(b_k2, tl.trans(b_k0), A20)
        A21 = tl.dot(b_k2, tl.trans(b_k1), A21)
        A22 = tl.dot(b_k2, tl.trans(b_k2), A22)
        A30 = tl.dot(b_k3, tl.trans(b_k0), A30)
        A31 = tl.dot(b_k3, tl.trans(b_k1), A31)
        A32 = tl.dot(b_k3, tl.trans(b_k2), A32)
        A33 = tl.dot(b_k3, tl.trans(b_k3), A33)
    A00 = _gdn_gate(A00, b_g0, b_b0, b_g0, True)
    A10 = _gdn_gate(A10, b_g1, b_b1, b_g0, False)
    A11 = _gdn_gate(A11, b_g1, b_b1, b_g1, True)
    A20 = _gdn_gate(A20, b_g2, b_b2, b_g0, False)
    A21 = _gdn_gate(A21, b_g2, b_b2, b_g1, False)
    A22 = _gdn_gate(A22, b_g2, b_b2, b_g2, True)
    A30 = _gdn_gate(A30, b_g3, b_b3, b_g0, False)
    A31 = _gdn_gate(A31, b_g3, b_b3, b_g1, False)
    A32 = _gdn_gate(A32, b_g3, b_b3, b_g2, False)
    A33 = _gdn_gate(A33, b_g3, b_b3, b_g3, True)
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve_blocks(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    _store_inverse(ainv, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h, H, BT)
    tl.debug_barrier()

    # whole-chunk tiles, in column blocks of BK / BV: w = T (beta exp(G) K), u = T (beta V),
    # Aqk = scale (Q K^T (x) exp(G_i - G_j)) on and below the diagonal
    o_t = tl.arange(0, BT)
    m_t = (t0 + o_t) < T
    p_row = (bos + t0 + o_t) * H + i_h
    b_T = _load_inverse(ainv, bos, t0, T, i_h, H, BT)
    b_g = tl.cumsum(_load_vec(g, bos, t0, T, i_h, H, BT), 0)
    b_beta = _load_vec(beta, bos, t0, T, i_h, H, BT)
    tl.store(gcum + p_row, b_g, mask=m_t)
    b_kb = b_beta * tl.exp(b_g)
    if HAS_Q:
        b_Aq = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in tl.static_range(K // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k = tl.load(k + p_row[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.)
        b_w = tl.dot(b_T, (b_k * b_kb[:, None]).to(b_T.dtype))
        tl.store(w + p_row[:, None] * K + o_k[None, :], b_w.to(w.dtype.element_ty), mask=m_t[:, None])
        if HAS_Q:
            b_q = tl.load(q + p_row[:, None] * K + o_k[None, :], mask=m_t[:, None], other=0.)
            b_Aq = tl.dot(b_q, tl.trans(b_k), b_Aq)
    if HAS_Q:
        b_Aq = b_Aq * tl.exp(tl.where(o_t[:, None] >= o_t[None, :], b_g[:, None] - b_g[None, :], float("-inf"))) * scale
        tl.store(aqk + p_row[:, None] * BT + o_t[None, :], b_Aq.to(aqk.dtype.element_ty), mask=m_t[:, None])
    for i_v in tl.static_range(V // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        b_v = tl.load(v + p_row[:, None] * V + o_v[None, :], mask=m_t[:, None], other=0.)
        b_u = tl.dot(b_T, (b_v * b_beta[:, None]).to(b_T.dtype))
        tl.store(u + p_row[:, None] * V + o_v[None, :], b_u.to(u.dtype.element_ty), mask=m_t[:, None])


# ---------------------------------------------------------------------------------------------------------------------
# KDA


@triton.jit
def _kda_gsum(g, bos, r0, T, i_h, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr):
    """Sum over one 16-row block of the per-key gate, columns [c0, c0+BK), fp32 (rows past T add 0)."""
    return tl.sum(_load_tile(g, bos, r0, T, i_h, H, K, c0, 16, BK).to(tl.float32), 0)


@triton.jit
def _kda_row(q, k, g, bos, r0, T, i_h, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr, b_A, b_Aq,
             HAS_Q: tl.constexpr):
    """Add one column block to the diagonal 16x16 blocks of A and Aqk of the row block at r0 (unmasked).

    Reference = the gate just before the block: a = k exp(L), kb = k exp(-L) with L the in-block cumsum.
    Returns A, Aqk and the left factors a, aq = q exp(L) that the off-diagonal blocks of this row reuse.
    """
    b_k = _load_tile(k, bos, r0, T, i_h, H, K, c0, 16, BK)
    b_L = tl.cumsum(_load_tile(g, bos, r0, T, i_h, H, K, c0, 16, BK).to(tl.float32), 0)
    b_e = tl.exp(b_L)
    b_a = b_k * b_e
    b_kb = tl.trans(b_k * tl.exp(-b_L))  # bounded by the 16-token span of the gate (module docstring)
    b_A = tl.dot(b_a, b_kb, b_A)
    if HAS_Q:
        b_aq = _load_tile(q, bos, r0, T, i_h, H, K, c0, 16, BK) * b_e
        b_Aq = tl.dot(b_aq, b_kb, b_Aq)
    else:
        b_aq = b_a
    return b_A, b_Aq, b_a, b_aq


@triton.jit
def _kda_off(b_a, b_aq, k, g, bos, r0, T, i_h, b_d, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr, b_A,
             b_Aq, HAS_Q: tl.constexpr):
    """Add one column block to block (I, J), J < I (J's rows at r0): a_I . (k_J exp(base_I - G_J))^T.

    b_d = base_I - base_J (the gate summed over blocks J..I-1), [BK]; every exponent is <= 0.
    """
    b_k = _load_tile(k, bos, r0, T, i_h, H, K, c0, 16, BK)
    b_L = tl.cumsum(_load_tile(g, bos, r0, T, i_h, H, K, c0, 16, BK).to(tl.float32), 0)
    b_c = tl.trans(b_k * tl.exp(b_d[None, :] - b_L))
    b_A = tl.dot(b_a, b_c, b_A)
    if HAS_Q:
        b_Aq = tl.dot(b_aq, b_c, b_Aq)
    return b_A, b_Aq


@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_Q": lambda args: args["q"] is not None,
})
@triton.jit(do_not_specialize=["T"])
def wy_kda_fwd_kernel(
    q,  # [B, T, H, K] or None (transition only)
    k,  # [B, T, H, K]
    v,  # [B, T, H, V]
    g,  # [B, T, H, K] natural-log per-key gate
    beta,  # [B, T, H]
    w,  # out [B, T, H, K]
    u,  # out [B, T, H, V]
    kg,  # out [B, T, H, K] = K exp(G_C - G)
    gc,  # out [NT_total, H, K] fp32: G at the chunk's last row
    qg,  # out [B, T, H, K] = scale Q exp(G) (if q)
    aqk,  # out [B, T, H, BT] = scale (Q K^T (x) decay), lower incl. diagonal (if q)
    ainv,  # out [B, T, H, BT]
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_Q: tl.constexpr,
):
    tl.static_assert(BT == 64, "the WY kernel is written for 64-token chunks")
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = eos - bos
        i_tg = i_c.to(tl.int64)
    else:
        i_t = i_c
        bos = i_b.to(tl.int64) * T
        i_tg = i_b.to(tl.int64) * tl.cdiv(T, BT) + i_t
    t0 = i_t * BT

    # blocks of A and Aqk, accumulated over column blocks of BK (the gate is per key dim, so the exp
    # factors of one column block only involve that block); earlier row blocks are reloaded, not kept
    A00 = tl.zeros([16, 16], dtype=tl.float32)
    A10 = tl.zeros([16, 16], dtype=tl.float32)
    A11 = tl.zeros([16, 16], dtype=tl.float32)
    A20 = tl.zeros([16, 16], dtype=tl.float32)
    A21 = tl.zeros([16, 16], dtype=tl.float32)
    A22 = tl.zeros([16, 16], dtype=tl.float32)
    A30 = tl.zeros([16, 16], dtype=tl.float32)
    A31 = tl.zeros([16, 16], dtype=tl.float32)
    A32 = tl.zeros([16, 16], dtype=tl.float32)
    A33 = tl.zeros([16, 16], dtype=tl.float32)
    Q00 = tl.zeros([16, 16], dtype=tl.float32)
    Q10 = tl.zeros([16, 16], dtype=tl.float32)
    Q11 = tl.zeros([16, 16], dtype=tl.float32)
    Q20 = tl.zeros([16, 16], dtype=tl.float32)
    Q21 = tl.zeros([16, 16], dtype=tl.float32)
    Q22 = tl.zeros([16, 16], dtype=tl.float32)
    Q30 = tl.zeros([16, 16], dtype=tl.float32)
    Q31 = tl.zeros([16, 16], dtype=tl.float32)
    Q32 = tl.zeros([16, 16], dtype=tl.float32)
    Q33 = tl.zeros([16, 16], dtype=tl.float32)
    for i_k in tl.static_range(K // BK):
        c0 = i_k * BK
        # per-block gate sums [BK]: the cumulative gate before block I is s_0 + ... + s_{I-1}
        b_s0 = _kda_gsum(g, bos, t0, T, i_h, H, K, c0, BK)
        b_s1 = _kda_gsum(g, bos, t0 + 16, T, i_h, H, K, c0, BK)
        b_s2 = _kda_gsum(g, bos, t0 + 32, T, i_h, H, K, c0, BK)

        A00, Q00, b_a, b_aq = _kda_row(q, k, g, bos, t0, T, i_h, H, K, c0, BK, A00, Q00, HAS_Q)

        A11, Q11, b_a, b_aq = _kda_row(q, k, g, bos, t0 + 16, T, i_h, H, K, c0, BK, A11, Q11, HAS_Q)
        A10, Q10 = _kda_off(b_a, b_aq, k, g, bos, t0, T, i_h, b_s0, H, K, c0, BK, A10, Q10, HAS_Q)

        A22, Q22, b_a, b_aq = _kda_row(q, k, g, bos, t0 + 32, T, i_h, H, K, c0, BK, A22, Q22, HAS_Q)
        A20, Q20 = _kda_off(b_a, b_aq, k, g, bos, t0, T, i_h, b_s0 + b_s1, H, K, c0, BK, A20, Q20, HAS_Q)
        A21, Q21 = _kda_off(b_a, b_aq, k, g, bos, t0 + 16, T, i_h, b_s1, H, K, c0, BK, A21, Q21, HAS_Q)

        A33, Q33, b_a, b_aq = _kda_row(q, k, g, bos, t0 + 48, T, i_h, H, K, c0, BK, A33, Q33, HAS_Q)
        A30, Q30 = _kda_off(b_a, b_aq, k, g, bos, t0, T, i_h, b_s0 + b_s1 + b_s2, H, K, c0, BK, A30, Q30, HAS_Q)
        A31, Q31 = _kda_off(b_a, b_aq, k, g, bos, t0 + 16, T, i_h, b_s1 + b_s2, H, K, c0, BK, A31, Q31, HAS_Q)
        A32, Q32 = _kda_off(b_a, b_aq, k, g, bos, t0 + 32, T, i_h, b_s2, H, K, c0, BK, A32, Q32, HAS_Q)

    b_b0 = _load_vec(beta, bos, t0, T, i_h, H, 16)
    b_b1 = _load_vec(beta, bos, t0 + 16, T, i_h, H, 16)
    b_b2 = _load_vec(beta, bos, t0 + 32, T, i_h, H, 16)
    b_b3 = _load_vec(beta, bos, t0 + 48, T, i_h, H, 16)
    o_i = tl.arange(0, 16)
    m_strict = o_i[:, None] > o_i[None, :]
    A00 = tl.where(m_strict, A00, 0.) * b_b0[:, None]
    A11 = tl.where(m_strict, A11, 0.) * b_b1[:, None]
    A22 = tl.where(m_strict, A22, 0.) * b_b2[:, None]
    A33 = tl.where(m_strict, A33, 0.) * b_b3[:, None]
    A10 = A10 * b_b1[:, None]
    A20 = A20 * b_b2[:, None]
    A21 = A21 * b_b2[:, None]
    A30 = A30 * b_b3[:, None]
    A31 = A31 * b_b3[:, None]
    A32 = A32 * b_b3[:, None]
    if HAS_Q:
        m_lower = o_i[:, None] >= o_i[None, :]
        _store_inverse(aqk, tl.where(m_lower, Q00, 0.) * scale, Q10 * scale, tl.where(m_lower, Q11, 0.) * scale,
                       Q20 * scale, Q21 * scale, tl.where(m_lower, Q22, 0.) * scale, Q30 * scale, Q31 * scale,
                       Q32 * scale, tl.where(m_lower, Q33, 0.) * scale, bos, t0, T, i_h, H, BT)

    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve_blocks(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    _store_inverse(ainv, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h, H, BT)
    tl.debug_barrier()

    # whole-chunk tiles in column blocks of BK (the gate is per key dim, so blocks are independent)
    o_t = tl.arange(0, BT)
    m_t = (t0 + o_t) < T
    p_row = (bos + t0 + o_t) * H + i_h
    b_T = _load_inverse(ainv, bos, t0, T, i_h, H, BT)
    b_beta = _load_vec(beta, bos, t0, T, i_h, H, BT)
    for i_k in tl.static_range(K // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        p_k = p_row[:, None] * K + o_k[None, :]
        b_r = tl.load(g + p_k, mask=m_t[:, None], other=0.).to(tl.float32)
        b_g = tl.cumsum(b_r, 0)
        b_gl = tl.sum(b_r, 0)  # G at the last valid row (rows past T add 0)
        tl.store(gc + (i_tg * H + i_h) * K + o_k, b_gl)
        b_e = tl.exp(b_g)
        b_k = tl.load(k + p_k, mask=m_t[:, None], other=0.)
        b_w = tl.dot(b_T, (b_k * b_e * b_beta[:, None]).to(b_T.dtype))
        tl.store(w + p_k, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
        tl.store(kg + p_k, (b_k * tl.exp(b_gl[None, :] - b_g)).to(kg.dtype.element_ty), mask=m_t[:, None])
        if HAS_Q:
            b_q = tl.load(q + p_k, mask=m_t[:, None], other=0.)
            tl.store(qg + p_k, (b_q * b_e * scale).to(qg.dtype.element_ty), mask=m_t[:, None])
    for i_v in tl.static_range(V // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        b_v = tl.load(v + p_row[:, None] * V + o_v[None, :], mask=m_t[:, None], other=0.)
        b_u = tl.dot(b_T, (b_v * b_beta[:, None]).to(b_T.dtype))
        tl.store(u + p_row[:, None] * V + o_v[None, :], b_u.to(u.dtype.element_ty), mask=m_t[:, None])


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def _key(index: ChunkIndex, H: int, K: int, V: int, dtype: torch.dtype) -> dict[str, object]:
    return {"H": H, "K": K, "V": V, "BT": index.chunk_size, "IS_VARLEN": index.is_varlen,
            "dtype": str(dtype).removeprefix("torch.")}


def _grid(index: ChunkIndex, B: int, T: int, H: int) -> tuple[int, int]:
    if index.is_varlen:
        return (index.num_chunks, H)
    return (triton.cdiv(T, index.chunk_size), B * H)


def _check(index: ChunkIndex, K: int, V: int) -> None:
    assert index.chunk_size == BT_WY, f"WY kernels need chunk_size {BT_WY}, got {index.chunk_size}"
    assert K >= 16 and V >= 16, f"tiles must be >= 16, got K={K} V={V}"


def _blocks(cfg: LaunchConfig, K: int, V: int) -> tuple[int, int]:
    BK, BV = min(cfg.BK or 64, K), min(cfg.BV or 64, V)
    assert BK >= 16 and BV >= 16 and K % BK == 0 and V % BV == 0, f"bad column blocks BK={BK} BV={BV} for K={K} V={V}"
    return BK, BV


def wy_gdn_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    config: LaunchConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """GDN intra-chunk pass: (w, u, gcum fp32 [B, T, H], aqk or None without q, ainv)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    _check(index, K, V)
    cfg = pick_config(WY_GDN_FWD, _key(index, H, K, V, k.dtype), config)
    BK, BV = _blocks(cfg, K, V)
    BT = index.chunk_size
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    gcum = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    ainv = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device)
    wy_gdn_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, gcum, aqk, ainv,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return w, u, gcum, aqk, ainv


def wy_kda_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    config: LaunchConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor]:
    """KDA intra-chunk pass: (w, u, kg, gc fp32 [NT_total, H, K], qg, aqk, ainv); qg/aqk are None without q."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    _check(index, K, V)
    cfg = pick_config(WY_KDA_FWD, _key(index, H, K, V, k.dtype), config)
    BK, BV = _blocks(cfg, K, V)
    BT = index.chunk_size
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    kg = torch.empty_like(k)
    gc = torch.empty(index.num_chunks, H, K, dtype=torch.float32, device=k.device)
    qg = torch.empty_like(q) if q is not None else None
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    ainv = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device)
    wy_kda_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, kg, gc, qg, aqk, ainv,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return w, u, kg, gc, qg, aqk, ainv
