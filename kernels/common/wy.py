"""Intra-chunk preparation (the WY form) of GDN and KDA, one Triton program per (chunk, head).

Per chunk of C = 64 tokens (DESIGN.md §1), with G the cumulative log gate inside the chunk:

    A = StrictLower(beta_i k_i.k_j exp(G_i - G_j))      (KDA: sum_d k_id k_jd exp(G_id - G_jd))
    T = (I + A)^{-1}
    w = T (beta * exp(G) * K),   u = T (beta * V)

and, when q is given (the transition primitive has none), the intra-chunk attention
Aqk = scale * (Q K^T (x) exp(G_i - G_j)) on and below the diagonal, [B, T, H, C] in k's dtype.
GDN (`wy_gdn_fwd`) also stores the fp32 in-chunk gate cumsum `gcum` [B, T, H]; the later kernels apply the
scalar gate themselves. KDA (`wy_kda_fwd`) stores what the later kernels need so that they never touch the
per-key gate again: kg = K * exp(G_C - G) (the gated key of the state update), the per-chunk last-row gate
gc [NT_total, H, K] fp32, and qg = scale * Q * exp(G).

Three phases in one program, ordered by `debug_barrier` (all within the program):
1. A (fp32) into `ainv` [B, T, H, C] (GDN: one 64x64 product over column blocks of K; KDA: one 16-row block
   at a time, see below), Aqk into `aqk`.
2. T = (I + A)^{-1} by forward substitution on the four diagonal 16x16 blocks, interleaved (rows read back
   from `ainv`, as FLA's solve_tril does) and block forward substitution T_IJ = -T_II sum_K A_IK T_KJ off it
   (tf32 products); T overwrites A in `ainv` (so `ainv` ends as T, fp32).
3. w and u from T as one 64x64 tile, in column blocks of BK / BV.

KDA numerics: for the rows of 16-row block I, exp(G_i - G_j) = exp(G_i - b_I) exp(b_I - G_j) with b_I the
gate just before the block: every factor is <= 1 except exp(b_I - G_j) for j inside block I, which spans at
most 16 tokens, so the per-key log-decay summed over 16 consecutive tokens must stay above -88 (fp32 exp
overflow): g >= -5.5 per token is always safe (FLA's safe_gate asks g >= -5).

Grid: dense input (NT, B*H); varlen (NT_total, H) with the chunk index of `kernels.common.index`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program
from kernels.common.index import ChunkIndex
from kernels.configs import KernelSpec, LaunchConfig, pick_config, register

__all__ = ["BT_WY", "WY_GDN_FWD", "WY_KDA_FWD", "wy_gdn_fwd", "wy_kda_fwd"]

BT_WY = 64  # the kernels are written for 4 blocks of 16 rows

WY_GDN_FWD = register(KernelSpec(
    name="wy_gdn_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # BK/BV: column blocks of the 64-row products. BK 32 / BV 64 / 4 warps (one warpgroup: wgmma) compiles to
    # 177 registers and no spills for K=V=128 (ptxas, sm_90a): 2 programs per SM; BK 64 needs 241
    default=LaunchConfig(BK=32, BV=64, num_warps=4, num_stages=2),
    # chunk-parallel, so occupancy matters more than per-program speed; num_stages only affects the loads
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2)},
))

WY_KDA_FWD = register(KernelSpec(
    name="wy_kda_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # the per-key gate needs fp32 [64, BK] tiles (G, exp factors) next to the keys: BK 32 with 8 warps is
    # the smallest setting without register spills for K=V=128 (4 warps spill ~70 bytes; ptxas, sm_90a)
    default=LaunchConfig(BK=32, BV=64, num_warps=8, num_stages=2),
    space={"BK": (32, 64), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2)},
))


# ---------------------------------------------------------------------------------------------------------------------
# helpers


@triton.jit
def _load_tile(p, bos, r0, T, i_h, H: tl.constexpr, D: tl.constexpr, c0, BR: tl.constexpr, BC: tl.constexpr):
    """Rows [r0, r0+BR), columns [c0, c0+BC) of a [.., T, H, D] tensor for head i_h, zero past T."""
    o_r = r0 + tl.arange(0, BR)
    o_d = c0 + tl.arange(0, BC)
    return tl.load(p + ((bos + o_r) * H + i_h)[:, None] * D + o_d[None, :], mask=(o_r < T)[:, None], other=0.)


@triton.jit
def _load_vec(p, bos, r0, T, i_h, H: tl.constexpr, BR: tl.constexpr):
    """Rows [r0, r0+BR) of a [.., T, H] tensor for head i_h as fp32 [BR], zero past T."""
    o_r = r0 + tl.arange(0, BR)
    return tl.load(p + (bos + o_r) * H + i_h, mask=o_r < T, other=0.).to(tl.float32)


@triton.jit
def _diag_row(a, bos, r0, i, T, i_h, b_T, H: tl.constexpr, BT: tl.constexpr):
    """One forward-substitution step on a diagonal 16x16 block (rows [r0, r0+16) of the token axis, chunk
    columns [r0 % BT, ...)): row i of T (strict part) = -A_i - sum_k A_ik T_k, A_i read from memory."""
    o_i = tl.arange(0, 16)
    b_a = -tl.load(a + ((bos + r0 + i) * H + i_h) * BT + r0 % BT + o_i, mask=(o_i < i) & (r0 + i < T), other=0.)
    b_a = b_a + tl.sum(b_a[:, None] * b_T, 0)
    return tl.where(o_i[:, None] == i, b_a[None, :], b_T)


@triton.jit
def _diag_init(a, bos, r0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """-StrictLower(A_II) of the diagonal block at rows [r0, r0+16); rows past T are zero."""
    o_i = tl.arange(0, 16)
    p_a = a + ((bos + r0 + o_i) * H + i_h)[:, None] * BT + (r0 % BT + o_i)[None, :]
    return -tl.load(p_a, mask=((r0 + o_i) < T)[:, None] & (o_i[:, None] > o_i[None, :]), other=0.)


@triton.jit
def _load_block(a, bos, r0, c0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """The 16x16 block at rows [r0, r0+16) (sequence token axis), chunk columns [c0, c0+16) of A."""
    o_i = tl.arange(0, 16)
    return tl.load(a + ((bos + r0 + o_i) * H + i_h)[:, None] * BT + (c0 + o_i)[None, :], mask=((r0 + o_i) < T)[:, None],
                   other=0.)


@triton.jit
def _store_block(p, b, bos, r0, c0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """Store a 16x16 tile at rows [r0, r0+16) (sequence token axis), chunk columns [c0, c0+16)."""
    o_i = tl.arange(0, 16)
    tl.store(p + ((bos + r0 + o_i) * H + i_h)[:, None] * BT + (c0 + o_i)[None, :], b.to(p.dtype.element_ty),
             mask=((r0 + o_i) < T)[:, None])


@triton.jit
def _solve(a, bos, t0, T, i_h, H: tl.constexpr, BT: tl.constexpr):
    """Replace the chunk's strictly lower A (fp32, in memory at `a`) by T = (I + A)^{-1}.

    Block forward substitution with 16x16 blocks: T_IJ = -T_II sum_{K=J}^{I-1} A_IK T_KJ.
    """
    # the four diagonal blocks by forward substitution, interleaved (independent chains: 4x the ILP)
    T00 = _diag_init(a, bos, t0, T, i_h, H, BT)
    T11 = _diag_init(a, bos, t0 + 16, T, i_h, H, BT)
    T22 = _diag_init(a, bos, t0 + 32, T, i_h, H, BT)
    T33 = _diag_init(a, bos, t0 + 48, T, i_h, H, BT)
    for i in range(2, 16):
        T00 = _diag_row(a, bos, t0, i, T, i_h, T00, H, BT)
        T11 = _diag_row(a, bos, t0 + 16, i, T, i_h, T11, H, BT)
        T22 = _diag_row(a, bos, t0 + 32, i, T, i_h, T22, H, BT)
        T33 = _diag_row(a, bos, t0 + 48, i, T, i_h, T33, H, BT)
    o_i = tl.arange(0, 16)
    b_I = tl.where(o_i[:, None] == o_i[None, :], 1., 0.)
    T00 += b_I
    T11 += b_I
    T22 += b_I
    T33 += b_I
    A10 = _load_block(a, bos, t0 + 16, 0, T, i_h, H, BT)
    A20 = _load_block(a, bos, t0 + 32, 0, T, i_h, H, BT)
    A21 = _load_block(a, bos, t0 + 32, 16, T, i_h, H, BT)
    A30 = _load_block(a, bos, t0 + 48, 0, T, i_h, H, BT)
    A31 = _load_block(a, bos, t0 + 48, 16, T, i_h, H, BT)
    A32 = _load_block(a, bos, t0 + 48, 32, T, i_h, H, BT)
    tl.debug_barrier()  # every read of A is done before T overwrites it
    T10 = -tl.dot(T11, tl.dot(A10, T00))
    T21 = -tl.dot(T22, tl.dot(A21, T11))
    T32 = -tl.dot(T33, tl.dot(A32, T22))
    T20 = -tl.dot(T22, tl.dot(A20, T00) + tl.dot(A21, T10))
    T31 = -tl.dot(T33, tl.dot(A31, T11) + tl.dot(A32, T21))
    T30 = -tl.dot(T33, tl.dot(A30, T00) + tl.dot(A31, T10) + tl.dot(A32, T20))
    _store_block(a, T00, bos, t0, 0, T, i_h, H, BT)
    _store_block(a, T10, bos, t0 + 16, 0, T, i_h, H, BT)
    _store_block(a, T11, bos, t0 + 16, 16, T, i_h, H, BT)
    _store_block(a, T20, bos, t0 + 32, 0, T, i_h, H, BT)
    _store_block(a, T21, bos, t0 + 32, 16, T, i_h, H, BT)
    _store_block(a, T22, bos, t0 + 32, 32, T, i_h, H, BT)
    _store_block(a, T30, bos, t0 + 48, 0, T, i_h, H, BT)
    _store_block(a, T31, bos, t0 + 48, 16, T, i_h, H, BT)
    _store_block(a, T32, bos, t0 + 48, 32, T, i_h, H, BT)
    _store_block(a, T33, bos, t0 + 48, 48, T, i_h, H, BT)
    tl.debug_barrier()  # T is in memory before the whole-chunk phase reads it


@triton.jit
def _load_inverse(a, p_row, m_t, BT: tl.constexpr):
    """T as one [BT, BT] fp32 tile (lower triangle incl. diagonal; zero above and past T)."""
    o_t = tl.arange(0, BT)
    return tl.load(a + p_row[:, None] * BT + o_t[None, :], mask=m_t[:, None] & (o_t[:, None] >= o_t[None, :]), other=0.)


@triton.jit
def _store_u(v, u, b_T, b_beta, p_row, m_t, V: tl.constexpr, BV: tl.constexpr):
    """u = T (beta V), in column blocks of BV (both ops); b_T is already in the input dtype."""
    for i_v in tl.static_range(V // BV):
        p_v = p_row[:, None] * V + (i_v * BV + tl.arange(0, BV))[None, :]
        b_v = tl.load(v + p_v, mask=m_t[:, None], other=0.)
        b_u = tl.dot(b_T, (b_v * b_beta[:, None]).to(b_T.dtype))
        tl.store(u + p_v, b_u.to(u.dtype.element_ty), mask=m_t[:, None])


# ---------------------------------------------------------------------------------------------------------------------
# GDN


@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_Q": lambda args: args["q"] is not None,
    "USE_NEED": lambda args: args["need"] is not None,
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
    aqk,  # out [B, T, H, BT] (if q)
    ainv,  # out [B, T, H, BT] fp32: A, then T = (I + A)^{-1}
    cu_seqlens,  # [N+1] int32 or None
    chunk_indices,  # [NT_total, 2] int32 or None
    need,  # [N] uint8 or None (transition only): 0 = this sequence's outputs are not needed, skip its chunks
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
    USE_NEED: tl.constexpr,
):
    tl.static_assert(BT == 64, "the WY kernel is written for 64-token chunks")
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_t, _, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    # nested on purpose: the constexpr branch must guard the load (need is None when USE_NEED is False)
    if USE_NEED:  # noqa: SIM102
        if tl.load(need + i_n) == 0:
            return
    t0 = i_t * BT
    o_t = tl.arange(0, BT)
    m_t = (t0 + o_t) < T
    p_row = (bos + t0 + o_t) * H + i_h

    b_g = tl.cumsum(_load_vec(g, bos, t0, T, i_h, H, BT), 0)
    b_beta = _load_vec(beta, bos, t0, T, i_h, H, BT)
    tl.store(gcum + p_row, b_g, mask=m_t)

    # phase 1: A = beta K K^T (x) decay (strictly lower) and Aqk, over column blocks of K
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_Aq = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in tl.static_range(K // BK):
        p_k = p_row[:, None] * K + (i_k * BK + tl.arange(0, BK))[None, :]
        b_k = tl.load(k + p_k, mask=m_t[:, None], other=0.)
        b_kT = tl.trans(b_k)
        b_A = tl.dot(b_k, b_kT, b_A)
        if HAS_Q:
            b_Aq = tl.dot(tl.load(q + p_k, mask=m_t[:, None], other=0.), b_kT, b_Aq)
    b_d = b_g[:, None] - b_g[None, :]
    b_A = b_A * tl.exp(tl.where(o_t[:, None] > o_t[None, :], b_d, float("-inf"))) * b_beta[:, None]
    tl.store(ainv + p_row[:, None] * BT + o_t[None, :], b_A, mask=m_t[:, None])
    if HAS_Q:
        b_Aq = b_Aq * tl.exp(tl.where(o_t[:, None] >= o_t[None, :], b_d, float("-inf"))) * scale
        tl.store(aqk + p_row[:, None] * BT + o_t[None, :], b_Aq.to(aqk.dtype.element_ty), mask=m_t[:, None])
    tl.debug_barrier()

    # phase 2: T = (I + A)^{-1} in place
    _solve(ainv, bos, t0, T, i_h, H, BT)

    # phase 3: w = T (beta exp(G) K), u = T (beta V), in column blocks
    dt = k.dtype.element_ty
    b_T = _load_inverse(ainv, p_row, m_t, BT).to(dt)
    b_kb = b_beta * tl.exp(b_g)
    for i_k in tl.static_range(K // BK):
        p_k = p_row[:, None] * K + (i_k * BK + tl.arange(0, BK))[None, :]
        b_k = tl.load(k + p_k, mask=m_t[:, None], other=0.)
        b_w = tl.dot(b_T, (b_k * b_kb[:, None]).to(dt))
        tl.store(w + p_k, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
    _store_u(v, u, b_T, b_beta, p_row, m_t, V, BV)


# ---------------------------------------------------------------------------------------------------------------------
# KDA


@triton.jit
def _kda_rows(q, k, g, ainv, aqk, beta, bos, t0, T, i_h, scale, I: tl.constexpr, R: tl.constexpr, H: tl.constexpr,
              K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HAS_Q: tl.constexpr):
    """Rows of 16-row block I of A (strictly lower, times beta) and Aqk (lower, times scale), stored.

    With b the gate just before block I: left factor k_i exp(G_i - b) (rows of block I, <= 1), right factor
    k_j exp(b - G_j) for j < R = 16(I+1) rounded up to a power of two (<= 1 before the block, a span of <= 16
    tokens inside it; zero after it). Accumulated over column blocks of BK.
    """
    o_i = tl.arange(0, 16)
    o_j = tl.arange(0, R)
    r0 = t0 + 16 * I
    m_j = (t0 + o_j) < T
    p_j = ((bos + t0 + o_j) * H + i_h)[:, None] * K
    m_c = (o_j < 16 * I + 16)[:, None]
    b_A = tl.zeros([16, R], dtype=tl.float32)
    b_Aq = tl.zeros([16, R], dtype=tl.float32)
    for i_k in tl.static_range(K // BK):
        o_k = (i_k * BK + tl.arange(0, BK))[None, :]
        b_r = tl.load(g + p_j + o_k, mask=m_j[:, None], other=0.).to(tl.float32)  # [R, BK]
        b_b = tl.sum(tl.where((o_j < 16 * I)[:, None], b_r, 0.), 0)  # [BK]
        b_G = tl.cumsum(b_r, 0)
        b_kj = tl.load(k + p_j + o_k, mask=m_j[:, None], other=0.)
        b_c = tl.trans(tl.where(m_c, b_kj * tl.exp(tl.where(m_c, b_b[None, :] - b_G, 0.)), 0.))  # [BK, R]
        b_L = tl.cumsum(_load_tile(g, bos, r0, T, i_h, H, K, i_k * BK, 16, BK).to(tl.float32), 0)
        b_e = tl.exp(b_L)
        b_A = tl.dot(_load_tile(k, bos, r0, T, i_h, H, K, i_k * BK, 16, BK) * b_e, b_c, b_A)
        if HAS_Q:
            b_Aq = tl.dot(_load_tile(q, bos, r0, T, i_h, H, K, i_k * BK, 16, BK) * b_e, b_c, b_Aq)
    m_r = ((r0 + o_i) < T)[:, None]
    p = ((bos + r0 + o_i) * H + i_h)[:, None] * BT + o_j[None, :]
    b_beta = _load_vec(beta, bos, r0, T, i_h, H, 16)
    tl.store(ainv + p, tl.where((16 * I + o_i)[:, None] > o_j[None, :], b_A, 0.) * b_beta[:, None], mask=m_r)
    if HAS_Q:
        b_Aq = tl.where((16 * I + o_i)[:, None] >= o_j[None, :], b_Aq, 0.) * scale
        tl.store(aqk + p, b_Aq.to(aqk.dtype.element_ty), mask=m_r)


@triton.heuristics({
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_Q": lambda args: args["q"] is not None,
    "USE_NEED": lambda args: args["need"] is not None,
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
    aqk,  # out [B, T, H, BT] (if q)
    ainv,  # out [B, T, H, BT] fp32: A, then T = (I + A)^{-1}
    cu_seqlens,
    chunk_indices,
    need,  # [N] uint8 or None (transition only): 0 = this sequence's outputs are not needed, skip its chunks
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
    USE_NEED: tl.constexpr,
):
    tl.static_assert(BT == 64, "the WY kernel is written for 64-token chunks")
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    # nested on purpose: the constexpr branch must guard the load (need is None when USE_NEED is False)
    if USE_NEED:  # noqa: SIM102
        if tl.load(need + i_n) == 0:
            return
    t0 = i_t * BT
    o_t = tl.arange(0, BT)
    m_t = (t0 + o_t) < T
    p_row = (bos + t0 + o_t) * H + i_h

    # phase 1: A and Aqk one 16-row block at a time (columns past the block's end are zero and not
    # stored for the first two blocks; nothing reads them: T and Aqk are loaded lower-triangular)
    _kda_rows(q, k, g, ainv, aqk, beta, bos, t0, T, i_h, scale, 0, 16, H, K, BT, BK, HAS_Q)
    _kda_rows(q, k, g, ainv, aqk, beta, bos, t0, T, i_h, scale, 1, 32, H, K, BT, BK, HAS_Q)
    _kda_rows(q, k, g, ainv, aqk, beta, bos, t0, T, i_h, scale, 2, 64, H, K, BT, BK, HAS_Q)
    _kda_rows(q, k, g, ainv, aqk, beta, bos, t0, T, i_h, scale, 3, 64, H, K, BT, BK, HAS_Q)
    tl.debug_barrier()

    # phase 2: T = (I + A)^{-1} in place
    _solve(ainv, bos, t0, T, i_h, H, BT)

    # phase 3: w, kg, qg, gc in column blocks of BK (the gate is per key dim); u in blocks of BV
    dt = k.dtype.element_ty
    b_T = _load_inverse(ainv, p_row, m_t, BT).to(dt)
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
        b_w = tl.dot(b_T, (b_k * b_e * b_beta[:, None]).to(dt))
        tl.store(w + p_k, b_w.to(w.dtype.element_ty), mask=m_t[:, None])
        tl.store(kg + p_k, (b_k * tl.exp(b_gl[None, :] - b_g)).to(kg.dtype.element_ty), mask=m_t[:, None])
        if HAS_Q:
            b_q = tl.load(q + p_k, mask=m_t[:, None], other=0.)
            tl.store(qg + p_k, (b_q * b_e * scale).to(qg.dtype.element_ty), mask=m_t[:, None])
    _store_u(v, u, b_T, b_beta, p_row, m_t, V, BV)


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def _key(index: ChunkIndex, H: int, K: int, V: int, dtype: torch.dtype) -> dict[str, object]:
    return {"H": H, "K": K, "V": V, "BT": index.chunk_size, "IS_VARLEN": index.is_varlen,
            "dtype": str(dtype).removeprefix("torch.")}


def _grid(index: ChunkIndex, B: int, T: int, H: int) -> tuple[int, int]:
    if index.is_varlen:
        return (index.num_chunks, H)
    return (triton.cdiv(T, index.chunk_size), B * H)


def _blocks(cfg: LaunchConfig, index: ChunkIndex, K: int, V: int) -> tuple[int, int]:
    assert index.chunk_size == BT_WY, f"WY kernels need chunk_size {BT_WY}, got {index.chunk_size}"
    BK, BV = min(cfg.BK or 64, K), min(cfg.BV or 64, V)
    assert BK >= 16 and BV >= 16 and K % BK == 0 and V % BV == 0, f"bad column blocks BK={BK} BV={BV} for K={K} V={V}"
    return BK, BV


def _need_flags(need: Tensor | None, index: ChunkIndex, q: Tensor | None) -> Tensor | None:
    """bool [N] -> one byte per sequence for the kernel (same bytes); only without q (transition), since the
    forward needs every chunk's outputs."""
    if need is None:
        return None
    assert q is None, "need masks the transition's WY prep only"
    assert need.shape == (index.num_seqs,) and need.dtype == torch.bool, \
        f"need must be bool [{index.num_seqs}], got {need.dtype} {tuple(need.shape)}"
    return need.contiguous().view(torch.uint8)


def wy_gdn_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    config: LaunchConfig | None = None, need: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """GDN intra-chunk pass: (w, u, gcum fp32 [B, T, H], aqk or None without q, T = (I + A)^{-1} fp32).

    need: bool `[N]` (transition only): chunks of unflagged sequences are skipped and their outputs left unwritten.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    cfg = pick_config(WY_GDN_FWD, _key(index, H, K, V, k.dtype), config)
    BK, BV = _blocks(cfg, index, K, V)
    BT = index.chunk_size
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    gcum = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    ainv = torch.empty(B, T, H, BT, dtype=torch.float32, device=k.device)
    wy_gdn_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, gcum, aqk, ainv,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        _need_flags(need, index, q), scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return w, u, gcum, aqk, ainv


def wy_kda_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    config: LaunchConfig | None = None, need: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor]:
    """KDA intra-chunk pass: (w, u, kg, gc fp32 [NT_total, H, K], qg, aqk, T fp32); qg/aqk are None without q.

    need: bool `[N]` (transition only): chunks of unflagged sequences are skipped and their outputs left unwritten.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    cfg = pick_config(WY_KDA_FWD, _key(index, H, K, V, k.dtype), config)
    BK, BV = _blocks(cfg, index, K, V)
    BT = index.chunk_size
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    kg = torch.empty_like(k)
    gc = torch.empty(index.num_chunks, H, K, dtype=torch.float32, device=k.device)
    qg = torch.empty_like(q) if q is not None else None
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    ainv = torch.empty(B, T, H, BT, dtype=torch.float32, device=k.device)
    wy_kda_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, kg, gc, qg, aqk, ainv,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        _need_flags(need, index, q), scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return w, u, kg, gc, qg, aqk, ainv
