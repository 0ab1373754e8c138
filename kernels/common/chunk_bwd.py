"""The chunk-parallel kernels of the backward (GDN and KDA) and the launch sequence shared by both ops.

Notation of DESIGN.md §1 and `kernels.common.wy` (per chunk of C = 64 tokens, G the in-chunk cumsum of the gate,
S the state entering the chunk, dS' the gradient at its end from `kernels.common.state_bwd`, T = (I + A)^{-1},
kb = beta exp(G) K, vb = beta V, w = T kb, u = T vb, K~ = K exp(G_C - G), Qg = scale Q exp(G)):

    wy_inverse      T (the forward does not keep it), [B, T, H, C] in k's dtype; one program per (chunk, head)
    chunk_bwd_dqk   per (K block, chunk, head), summing over V blocks:
                      dQg = dO S^T,  dAqk = scale Tril(dO v_new^T),  dK~ = v_new dS'^T,  dw = -dv_new S^T,
                      dgamma = rowsum_V(S * dS');
                    then dq (final) and the parts of dk and dG that do not need the WY backward
    wy_bwd          per (chunk, head): dkb = T^T dw, dvb = T^T dv_new, dA = -StrictLower(dkb w^T + dvb u^T);
                    dv = beta dvb, dk, dbeta, and dg = the reverse in-chunk cumsum of dG

The decayed products of dAqk and dA (R(X, b)_i = sum_j X_ij b_j e^(G_i - G_j), Cc(X, a)_j = sum_i X_ij a_i
e^(G_i - G_j)): for GDN one [C, C] decay tile; for KDA (a decay per key) the factor is split around the gate at
the row block's boundary (both factors <= 1) for the earlier blocks, one matmul per 16-row block of the output,
and taken elementwise inside the diagonal 16-row blocks (`_diag_rows` / `_diag_cols`), so no exponent is positive
for any gate; the gate is floored where it is loaded (`kernels.common.decay`) and dg of a gate below the floor is 0.
These device helpers live in `kernels.common.bwd_tiles`.

`chunk_bwd` is the whole backward: recompute (WY prep, T, the chunk states with the forward's sequence split), the
reverse state pass (split the same way; with `LaunchPlan.bwd_warm_for(op)` > 0 its chain, and the recompute's, take
gate-certified warm windows instead of full-segment walks where the gates allow, `kernels.common.warm_bwd`), then
the two kernels above (`pair_grads`), or with the plan's `bwd_grads="fused"` one kernel per (chunk, head) in their
place (`kernels.common.dqk_wy_bwd`: no dw, no partials); the default "auto" takes the fused kernel for GDN and the
pair for KDA (`kernels.vocabulary.AUTO_BWD_GRADS`). Extra memory: the chunk states h and their gradients dh
([NT, H, K, V] each), v_new, dv_new, T, and for the pair dw
([B, T, H, K]) and fp32 [B, T, H, K] buffers for the partial dk and dG; never [T, K, K] or a per-token state.

Grouped value heads (q, k with H / G heads, v, g, beta with H; G from the shapes): every kernel reads q and k at
head h // G; dq and dk are computed per value head into fp32 [B, T, H, K] buffers and summed over the G heads of
each group by one torch reduction (`.view(B, T, H / G, G, K).sum(3)`, FLA's design); at G = 1 the launches are
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.bwd_tiles import (
    _bounds,
    _chunk_grid,
    _chunk_rows,
    _cols_vec,
    _dg_columns,
    _fit,
    _gate_tile,
    _key,
    _rows_vec,
    _state_products,
    _store_dg_rows,
    _wy_rows,
    group_sum,
    pair_blocks,
    per_value_head,
)
from kernels.common.chunk_program import chunk_of_program, group_heads, heuristics
from kernels.common.chunk_state import SeqLayout, chunk_state_fwd, chunk_state_transition_fwd
from kernels.common.dqk_wy_bwd import dqk_wy_bwd
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.seqsplit import resolve_split, seg_chain_fwd, seg_chain_states
from kernels.common.state_bwd import chunk_state_bwd, first_segments, seg_chain_bwd, state_bwd_config
from kernels.common.warm_bwd import (
    RevWarmInputs,
    kept_rev_sums,
    need_chunks,
    reverse_chunk_bound,
    reverse_chunk_bound_kept,
    reverse_window_plan,
    warm_segment_ends,
    window_chunk_sel,
)
from kernels.common.warm_split import WarmInputs, warm_transitions, window_plan
from kernels.common.wy import (
    BT_WY,
    _decay,
    _gdn_cumsum,
    _gram,
    _kda_gram,
    _load_vec,
    _solve,
    _store_aqk,
    wy_gdn_fwd,
    wy_kda_fwd,
)
from kernels.configs import KernelSpec, LaunchConfig, cdiv, register
from kernels.plan import LaunchPlan, default_plan, launch_config
from kernels.vocabulary import AUTO_BWD_GRADS, REVERSE_WALKS

__all__ = ["CHUNK_BWD_DQK", "WY_BWD", "WY_INVERSE", "chunk_bwd", "chunk_state_grad", "pair_grads"]

_KEY = ("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype")

# KDA's decayed products (`_rows_vec` / `_cols_vec`): the operands' precision in their matmuls. "bf16" rounds the
# decayed operand to bf16 (its 2^-8 error survives the q.rq - k.cq cancellation of dG: dg 1.1e-2 rel_l2 on the
# H200); "tf32" / "tf32x3" keep them fp32 (Triton's input_precision). GDN's scalar-gate products stay in bf16.
# Measured: benchmarks/results/bwd_dot_precision_h200.md.
VECTOR_GATE_DOT = "tf32"

WY_INVERSE = register(KernelSpec(
    name="wy_inverse",
    key=_KEY,
    # the WY prep's A and solve without w/u (same 16x16 register tiles: one warp, BK 32 / 16 as the forward)
    default=LaunchConfig(BK=32, num_warps=1, num_stages=2),
    space={"BK": (16, 32, 64), "num_warps": (1, 2, 4), "num_stages": (1, 2, 3)},
))

CHUNK_BWD_DQK = register(KernelSpec(
    name="chunk_bwd_dqk",
    key=_KEY,
    # BK = BV = 64 at 8 warps (FLA's chunk_bwd_dqkwg: 4): the pair runs KDA's gradients by default (GDN's: the fused
    # kernel), and on the H200 KDA's pair at 1x64K took 12.0 ms at 8 warps against 15.3 at 4
    # (benchmarks/results/dqk_wy_lab_h200.md, session 11; the tuner chose 8 warps for both in session 8 too)
    default=LaunchConfig(BK=64, BV=64, num_warps=8, num_stages=2),
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
    # the compiler's other low-spill config (benchmarks/results/ptxas_bwd_sm90.md): 32-wide tiles at 8 warps
    hints=(LaunchConfig(BK=32, BV=32, num_warps=8, num_stages=2),),
))

WY_BWD = register(KernelSpec(
    name="wy_bwd",
    key=_KEY,
    # 64-wide column blocks at 8 warps (FLA's prepare_wy_repr_bwd: 2-4): as chunk_bwd_dqk above (KDA's pair, H200)
    default=LaunchConfig(BK=64, BV=64, num_warps=8, num_stages=2),
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
    # the compiler's other low-spill config (benchmarks/results/ptxas_bwd_sm90.md): 32-wide tiles at 8 warps
    hints=(LaunchConfig(BK=32, BV=32, num_warps=8, num_stages=2),),
))


# ---------------------------------------------------------------------------------------------------------------------
# kernels


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None, "G": group_heads("beta")})
@triton.jit(do_not_specialize=["T"])
def wy_inverse_kernel(
    k,  # [B, T, H, K]
    g,  # raw gate: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    beta,  # [B, T, H]
    tt,  # out [B, T, H, BT]: T = (I + A)^{-1}, lower blocks incl. the diagonal (the others are not written)
    kg,  # KDA: [B, T, H, K] rewritten with the values the WY prep stored (the gram helper stores them)
    gc,  # KDA: [NT_total, H, K] fp32, likewise
    cu_seqlens,
    chunk_indices,
    T,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, GATE_VECTOR: tl.constexpr,
    IS_VARLEN: tl.constexpr, G: tl.constexpr,
):
    tl.static_assert(BT == 16 or BT == 32 or BT == 64, "written for chunks of 16, 32 or 64 tokens")
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    t0 = i_t * BT
    T = tl.minimum(T, t0 + BT)  # the four 16-row blocks end at the chunk: rows past it load as zero (BT 16, 32)
    o_i = tl.arange(0, 16)
    b0 = _load_vec(beta, bos, t0, T, i_h, H, 16)
    b1 = _load_vec(beta, bos, t0 + 16, T, i_h, H, 16)
    b2 = _load_vec(beta, bos, t0 + 32, T, i_h, H, 16)
    b3 = _load_vec(beta, bos, t0 + 48, T, i_h, H, 16)
    if GATE_VECTOR:
        m_d = o_i[:, None] > o_i[None, :]
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(k, k, g, kg, bos, t0, T, i_h,
                                                                     gc + (i_tg * H + i_h) * K, 1.0, H, K, BK, True, G)
        A00 = tl.where(m_d, A00, 0.)
        A11 = tl.where(m_d, A11, 0.)
        A22 = tl.where(m_d, A22, 0.)
        A33 = tl.where(m_d, A33, 0.)
    else:
        # the in-chunk cumsum of the raw gate, flat past T (as the WY prep: a zero there would make
        # exp(G_i - G_j) overflow against a strongly decayed G_j)
        _, _, _, _, g0, g1, g2, g3 = _gdn_cumsum(g, bos, t0, T, i_h, H)
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gram(k, k, bos, t0, T, i_h // G, H // G, K, BK)
        A00 *= _decay(g0, g0, True)
        A11 *= _decay(g1, g1, True)
        A22 *= _decay(g2, g2, True)
        A33 *= _decay(g3, g3, True)
        A10 *= tl.exp(g1[:, None] - g0[None, :])
        A20 *= tl.exp(g2[:, None] - g0[None, :])
        A21 *= tl.exp(g2[:, None] - g1[None, :])
        A30 *= tl.exp(g3[:, None] - g0[None, :])
        A31 *= tl.exp(g3[:, None] - g1[None, :])
        A32 *= tl.exp(g3[:, None] - g2[None, :])
    A00, A11, A22, A33 = A00 * b0[:, None], A11 * b1[:, None], A22 * b2[:, None], A33 * b3[:, None]
    A10, A20, A21 = A10 * b1[:, None], A20 * b2[:, None], A21 * b2[:, None]
    A30, A31, A32 = A30 * b3[:, None], A31 * b3[:, None], A32 * b3[:, None]
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    _store_aqk(tt, bos, t0, T, i_h, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, H, BT)


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None, "G": group_heads("do")})
@triton.jit(do_not_specialize=["T"])
def chunk_bwd_dqk_kernel(
    q,  # [B, T, H, K] raw
    k,  # [B, T, H, K] raw
    g,  # raw gate: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    h,  # [NT_total, H, K, V] state entering each chunk
    dh,  # [NT_total, H, K, V] gradient at each chunk's end
    v_new,  # [B, T, H, V]
    dv_new,  # [B, T, H, V]
    do,  # [B, T, H, V]
    dq,  # out [B, T, H, K]
    dk,  # out [B, T, H, K] fp32: dK~ and Aqk parts of dk
    dw,  # out [B, T, H, K] in k's dtype
    dg,  # out [B, T, H, K] fp32: the dG terms known here (not yet summed over K for GDN, not cumsummed)
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, DOT_PREC: tl.constexpr, IS_VARLEN: tl.constexpr, G: tl.constexpr,
):
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    dt = k.dtype.element_ty
    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    o_r = i_t * BT + o_t
    m_r = o_r < T
    m_rk = m_r[:, None] & m_k[None, :]
    p_row = (bos + o_r) * H + i_h
    p_h = (i_tg * H + i_h) * K * V

    b_dqg, b_dkt, b_dw, b_dgam, b_da = _state_products(h, dh, v_new, dv_new, do, p_h, p_row, m_r, o_k, K, V, BT, BK, BV,
                                                       True)

    p_qk = ((bos + o_r) * (H // G) + i_h // G)[:, None] * K + o_k[None, :]  # grouped heads: the shared q/k head
    b_q = tl.load(q + p_qk, mask=m_rk, other=0.).to(tl.float32)
    b_k = tl.load(k + p_qk, mask=m_rk, other=0.).to(tl.float32)
    b_G = _gate_tile(g, p_row, m_r, o_k, K, GATE_VECTOR)
    b_Gl = tl.sum(tl.where(o_t[:, None] == BT - 1, b_G, 0.), 0)[None, :]  # [1, BK] (KDA) or [1, 1] (GDN)
    # dAqk below the diagonal goes through the decayed products; its diagonal (decay e^0 = 1) is added in fp32 and
    # left out of dG, where its two terms cancel exactly (with bf16 products they would not: under strong decay
    # that rounding is larger than dg itself)
    b_X = tl.where(o_t[:, None] > o_t[None, :], b_da * scale, 0.)
    b_xd = tl.sum(tl.where(o_t[:, None] == o_t[None, :], b_da * scale, 0.), 1)[:, None]  # [BT, 1]
    if GATE_VECTOR:
        b_rq = _rows_vec(b_X, b_k, b_G, BT, BK, dt, DOT_PREC)
        b_cq = _cols_vec(b_X, b_q, b_G, BT, BK, dt, DOT_PREC)
    else:
        b_gr = tl.sum(b_G, 1)  # [BT]
        b_XE = b_X * tl.exp(tl.where(o_t[:, None] > o_t[None, :], b_gr[:, None] - b_gr[None, :], float("-inf")))
        b_rq = tl.dot(b_XE.to(dt), b_k.to(dt))
        b_cq = tl.dot(tl.trans(b_XE).to(dt), b_q.to(dt))
    b_eg = tl.exp(b_G)
    b_ekt = tl.exp(b_Gl - b_G)
    b_dqs = b_dqg * scale * b_eg
    b_dq = b_rq + b_xd * b_k + b_dqs
    b_kt = b_k * b_ekt
    b_ktdkt = b_kt * b_dkt
    b_dG = b_q * b_rq - b_k * b_cq + b_dqs * b_q - b_ktdkt
    # d gamma_C and the sum of the K~ terms land on the last row of the chunk (the last one before T)
    i_last = tl.minimum(T - i_t * BT, BT) - 1
    b_dG += tl.where(o_t[:, None] == i_last, tl.sum(b_ktdkt, 0)[None, :] + tl.exp(b_Gl) * b_dgam[None, :], 0.)
    p_out = p_row[:, None] * K + o_k[None, :]
    tl.store(dq + p_out, b_dq.to(dq.dtype.element_ty), mask=m_rk)
    tl.store(dk + p_out, b_cq + b_xd * b_q + b_ekt * b_dkt, mask=m_rk)
    tl.store(dw + p_out, (-b_dw).to(dw.dtype.element_ty), mask=m_rk)
    tl.store(dg + p_out, b_dG, mask=m_rk)


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None, "G": group_heads("v")})
@triton.jit(do_not_specialize=["T"])
def wy_bwd_kernel(
    k,  # [B, T, H, K] raw
    v,  # [B, T, H, V]
    g,  # raw gate: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    beta,  # [B, T, H]
    tt,  # [B, T, H, BT] T, lower incl. the diagonal
    w,  # [B, T, H, K]
    u,  # [B, T, H, V]
    dv_new,  # [B, T, H, V]
    dw,  # [B, T, H, K] in k's dtype
    dk_part,  # [B, T, H, K] fp32
    dg_part,  # [B, T, H, K] fp32
    dk,  # out [B, T, H, K]
    dv,  # out [B, T, H, V]
    dbeta,  # out [B, T, H]
    dg,  # out: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    cu_seqlens,
    chunk_indices,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, DOT_PREC: tl.constexpr, IS_VARLEN: tl.constexpr, G: tl.constexpr,
):
    i_h, _, _, bos, T, o_r, m_r, p_row = _chunk_rows(cu_seqlens, chunk_indices, T, H, BT, IS_VARLEN)
    dt = k.dtype.element_ty
    o_t = tl.arange(0, BT)
    b_Tt, b_beta = _wy_rows(tt, beta, p_row, m_r, BT, dt)

    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        p_v = p_row[:, None] * V + o_v[None, :]
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        b_dvb = tl.dot(b_Tt, tl.load(dv_new + p_v, mask=m_rv, other=0.))
        b_dA = tl.dot(b_dvb.to(dt), tl.trans(tl.load(u + p_v, mask=m_rv, other=0.)), b_dA)
        b_v = tl.load(v + p_v, mask=m_rv, other=0.).to(tl.float32)
        b_db += tl.sum(b_dvb * b_v, 1)
        tl.store(dv + p_v, (b_dvb * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_rv)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        p_k = p_row[:, None] * K + o_k[None, :]
        m_rk = m_r[:, None] & (o_k < K)[None, :]
        b_dkb = tl.dot(b_Tt, tl.load(dw + p_k, mask=m_rk, other=0.).to(dt))
        b_dA = tl.dot(b_dkb.to(dt), tl.trans(tl.load(w + p_k, mask=m_rk, other=0.)), b_dA)
    b_dA = -tl.where(o_t[:, None] > o_t[None, :], b_dA, 0.)

    b_dgs = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        p_k = p_row[:, None] * K + o_k[None, :]
        m_rk = m_r[:, None] & (o_k < K)[None, :]
        b_dkb = tl.dot(b_Tt, tl.load(dw + p_k, mask=m_rk, other=0.).to(dt))
        b_k = tl.load(k + ((bos + o_r) * (H // G) + i_h // G)[:, None] * K + o_k[None, :], mask=m_rk,
                      other=0.).to(tl.float32)  # grouped heads: the shared key head
        b_G = _gate_tile(g, p_row, m_r, o_k, K, GATE_VECTOR)
        b_bk = b_k * b_beta[:, None]
        if GATE_VECTOR:
            b_ra = _rows_vec(b_dA, b_k, b_G, BT, BK, dt, DOT_PREC)
            b_ca = _cols_vec(b_dA, b_bk, b_G, BT, BK, dt, DOT_PREC)
        else:
            b_gr = tl.sum(b_G, 1)
            b_XE = b_dA * tl.exp(tl.where(o_t[:, None] > o_t[None, :], b_gr[:, None] - b_gr[None, :], float("-inf")))
            b_ra = tl.dot(b_XE.to(dt), b_k.to(dt))
            b_ca = tl.dot(tl.trans(b_XE).to(dt), b_bk.to(dt))
        b_kbd = b_dkb * tl.exp(b_G) * b_k  # dkb (x) e^G (x) k
        b_db += tl.sum(b_kbd + b_k * b_ra, 1)
        b_dk = tl.load(dk_part + p_k, mask=m_rk, other=0.)
        b_dk += b_dkb * tl.exp(b_G) * b_beta[:, None] + b_beta[:, None] * b_ra + b_ca
        tl.store(dk + p_k, b_dk.to(dk.dtype.element_ty), mask=m_rk)
        b_dG = tl.load(dg_part + p_k, mask=m_rk, other=0.)
        b_dG += b_beta[:, None] * (b_kbd + b_k * b_ra) - b_k * b_ca
        b_dgs = _dg_columns(dg, g, b_dG, b_dgs, p_k, m_rk, GATE_VECTOR)
    if not GATE_VECTOR:
        _store_dg_rows(dg, g, b_dgs, p_row, m_r)
    tl.store(dbeta + p_row, b_db.to(dbeta.dtype.element_ty), mask=m_r)


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def wy_inverse(k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, gate_vector: bool, kg: Tensor | None = None,
               gc: Tensor | None = None, launch: LaunchPlan | None = None) -> Tensor:
    """T = (I + A)^{-1} per chunk, [B, T, H, BT] in k's dtype (lower blocks), from the raw gate g (H: beta's heads)."""
    B, T, _, K = k.shape
    H = beta.shape[2]
    cfg = launch_config(launch, WY_INVERSE, _key(index, H, K, K, gate_vector, k.dtype))
    BK, _ = _fit(cfg, K, K)
    BT = index.chunk_size
    tt = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device)
    cu, ci = _bounds(index)
    wy_inverse_kernel[_chunk_grid(index, B, T, H)](
        k, g, beta, tt, kg, gc, cu, ci, T, H=H, K=K, BT=BT, BK=BK, GATE_VECTOR=gate_vector,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return tt


def _wy_factors(
    gate_vector: bool, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    launch: LaunchPlan, wy: Mapping[str, Tensor] | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(w, u, ks, gs, qs, aqk): the forward's kept factors, or the WY prep run again (GDN: ks, qs = k, q)."""
    if wy is not None:
        w, u, gs, aqk = wy["w"], wy["u"], wy["gs"], wy["aqk"]
        ks, qs = (wy["ks"], wy["qs"]) if gate_vector else (k, q)
    elif gate_vector:
        w, u, ks, gs, qs, aqk = wy_kda_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
    else:
        w, u, gs, aqk = wy_gdn_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
        qs, ks = q, k
    assert qs is not None and aqk is not None
    return w, u, ks, gs, qs, aqk


def _state_pass(
    qs: Tensor, ks: Tensor, w: Tensor, u: Tensor, gs: Tensor, aqk: Tensor, do: Tensor, *, index: ChunkIndex,
    gate_vector: bool, scale: float, h0: Tensor | None, dht: Tensor | None, dh0: Tensor | None,
    launch: LaunchPlan, split_chunks: int | None, states: bool,
    kept: Mapping[str, Tensor] | None = None, warm: RevWarmInputs | None = None,
    seg_states: Mapping[str, Any] | None = None, new_values: bool = True,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The reverse state pass, split across the sequence like the forward (module docstring), writing dh0 when given;
    with `states` also the chunk states h and v_new (forward, from h0) and their gradients dh, dv_new that the
    gradient kernels read. Returns (h, v_new, dh, dv_new), all None without `states`; v_new and dv_new None without
    `new_values` too (the passes then store neither: gradients that form U and dU themselves, KDA's "tilelang").

    kept: the forward's h, v_new, split and (optionally) segment maps M (`kernels.common.state_keep`): its split
    replaces `split_chunks`, and the forward state pass (and with M the transition pass) is not run again.
    warm: the raw inputs and window of the gate-certified warm window of the split's reverse chain
    (`kernels.common.warm_bwd`, `LaunchPlan.bwd_warm`), or None (exact); it acts only when the split runs.
    seg_states: the forward's split and segment entering states (`kernels.common.seqsplit.keep_segment_states`): its
    split replaces `split_chunks`, and the chunk states are recomputed from them (no transitions, warm windows or
    chain for the recompute)."""
    h, v_new, layout, ends = reverse_ends(qs, ks, w, u, gs, aqk, do, index=index, gate_vector=gate_vector, scale=scale,
                                           h0=h0, dht=dht, launch=launch, split_chunks=split_chunks, states=states,
                                           kept=kept, warm=warm, seg_states=seg_states,
                                           new_values=new_values)  # fmt: skip
    H, K, V = do.shape[2], ks.shape[3], do.shape[-1]
    dh = ks.new_empty(index.num_chunks, H, K, V) if states else None
    dv_new = do.new_empty(do.shape, dtype=ks.dtype) if states and new_values else None
    chunk_state_bwd(qs, ks, w, gs, aqk, do, layout=layout, dht=ends, ds_out=dh0, dh=dh, dv_new=dv_new,
                    BT=index.chunk_size, gate_vector=gate_vector, scale=scale, launch=launch)  # fmt: skip
    return h, v_new, dh, dv_new


@dataclass(frozen=True, eq=False)
class LazyFactors:
    """w, u, aqk formed only for the chunks a pass reads, and the chunk states without them (GDN's reverse walk from
    the kept Ag, `kernels.ops.gdn.ag_bwd`). form(sel): forms those of the chunks sel flags (bool `[NT_total]` or
    `[NT_total, H]` on the device; None: every chunk) into one set of buffers and returns (w, u, aqk); states(layout,
    h0): the plain state pass, h `[NT_total, H, K, V]` only (`chunk_state_ag_fwd`)."""

    form: Callable[[Tensor | None], tuple[Tensor, Tensor, Tensor]]
    states: Callable[[SeqLayout, Tensor | None], Tensor]


def reverse_ends(
    qs: Tensor, ks: Tensor, w: Tensor | None, u: Tensor | None, gs: Tensor, aqk: Tensor | None, do: Tensor, *,
    index: ChunkIndex, gate_vector: bool, scale: float, h0: Tensor | None, dht: Tensor | None, launch: LaunchPlan,
    split_chunks: int | None, states: bool, kept: Mapping[str, Tensor] | None = None,
    warm: RevWarmInputs | None = None, seg_states: Mapping[str, Any] | None = None, lazy: LazyFactors | None = None,
    new_values: bool = True,
) -> tuple[Tensor | None, Tensor | None, SeqLayout, Tensor | None]:
    """`_state_pass` up to its last launch: (h, v_new (None without `states`), the layout of the last reverse walk
    (whole sequences; or the split's segments, `final_idx` naming each sequence's first for dh0), the fp32 gradient
    at the end of each of its ranges (dht; or the chained segment ends)). The last walk, `chunk_state_bwd` storing
    dh and dv_new, is `_state_pass`'s.

    lazy (w, u, aqk then None): the factors are formed on demand. Where the states are recomputed without a split,
    none; where they are kept, or recomputed from the forward's segment states, and warm windows run, only the
    windows' and the uncertified segments' (`warm_bwd.window_chunk_sel`); a recompute comes from `lazy.states` (v_new
    None). On any other path every chunk's are formed first. new_values False: a recompute stores no v_new."""
    H, K = do.shape[2], ks.shape[3]  # H: the value heads (ks may have H / G, grouped)
    V = do.shape[-1]
    if kept is not None:
        split_chunks = int(kept["split"])  # a CPU scalar: no device read
    hs = None
    if kept is None and seg_states is not None and states:
        split_chunks, hs = seg_states["seg_chunks"], seg_states["hs"]
    BT, NT, N = index.chunk_size, index.num_chunks, index.num_seqs
    nv = cdiv(V, state_bwd_config(H, K, V, BT, gate_vector, index.is_varlen, ks.dtype, launch).BV or 64)
    plan = resolve_split(index, split_chunks, H=H, NV=nv, device=ks.device)
    common: dict[str, Any] = {"BT": BT, "gate_vector": gate_vector}
    bwd: dict[str, Any] = {"scale": scale, "launch": launch, **common}
    h = v_new = None
    if kept is not None:  # (v_new None: the TileLang walk's kept states, read by the reverse walk alone)
        h, v_new = kept["h"], kept.get("v_new")
    if plan is None:
        layout = SeqLayout(N, index.cu_seqlens if index.is_varlen else None,
                           index.chunk_offsets if index.is_varlen else None)
        if states and kept is None and lazy is not None:
            h = lazy.states(layout, h0)
        elif states and kept is None:
            assert w is not None and u is not None
            h, v_new, _ = chunk_state_fwd(ks, w, u, gs, layout=layout, num_chunks=NT, h0=h0, launch=launch,
                                          save_v_new=new_values, **common)
        return h, v_new, layout, dht
    wp = reverse_window_plan(index, plan, warm.window_chunks) if warm is not None else None  # the reverse windows
    refill = None
    if lazy is not None:  # the windows' chunks only when the states are kept or come from the forward's segment states
        if wp is not None and states and (kept is not None or hs is not None):
            win, seg = window_chunk_sel(plan, wp, NT)
            w, u, aqk = lazy.form(win)

            def refill(need: Tensor) -> None:
                lazy.form(need_chunks(need, win, seg))

        else:
            w, u, aqk = lazy.form(None)
            lazy = None
    assert w is not None and u is not None and aqk is not None
    segs = plan.all_segments
    recompute = states and kept is None
    if hs is not None:
        assert hs.shape[0] == plan.num_segments, f"kept states of {hs.shape[0]} segments, the plan has {plan.num_segments}"
    wpf = bnd = fbnd = None
    if warm is not None:  # the forward's windows for the recompute, and one launch of both bound sums
        if wp is not None and recompute and hs is None and warm.v is not None:
            wpf = window_plan(index, list(plan.bounds_cpu), list(plan.chunk_bounds_cpu), list(plan.transitions_cpu),
                              warm.window_chunks, seg_chunks=plan.seg_chunks, cache=plan.windows)
        if wp is not None and wpf is None and warm.bnd is not None:  # summed by an earlier launch (wy_from_ag)
            bnd = warm.bnd
        elif wp is not None and wpf is None and warm.qk_sums is not None:  # the forward's q, k side: do read alone
            bnd = reverse_chunk_bound_kept(do, warm.qk_sums, scale=scale, index=index)
        elif wp is not None:
            bnd, fbnd = reverse_chunk_bound(warm.q, warm.k, warm.g, warm.beta, do, scale=scale, index=index,
                                            gate_vector=gate_vector, v=warm.v if wpf is not None else None)
    M = kept.get("M") if kept is not None else None
    if M is not None:
        assert M.shape[0] == plan.num_segments, f"kept maps of {M.shape[0]} segments, the plan has {plan.num_segments}"
    elif wp is None or (recompute and hs is None and wpf is None):  # the exact chain, or the recompute below, needs them
        M, S = chunk_state_transition_fwd(ks, w, u, gs, layout=segs, launch=launch, **common)
    if recompute and lazy is not None:  # from the forward's segment states, without w, u
        h = lazy.states(segs, hs)
    elif recompute:  # the chunk states from each segment's entering state hs: the forward's (`seg_states`), or
        if hs is None and wpf is None:  # the exact chain's
            nonlast = plan.transitions.seq_map
            assert nonlast is not None and M is not None
            hs = seg_chain_states(M.index_select(0, nonlast), S.index_select(0, nonlast), h0, plan.seg_ptr,
                                  num_segments=plan.num_segments, launch=launch)
        elif hs is None:  # the chain of the forward's certified windows (`kernels.common.warm_split`), sums above
            assert warm is not None and warm.v is not None
            fwd_report: dict[str, Tensor] = {}
            x = WarmInputs("kda" if gate_vector else "gdn", warm.k, warm.v, warm.g, warm.beta,
                           window_chunks=warm.window_chunks, tol=warm.tol, report=fwd_report, chunk_bound=fbnd)
            M_f, S_f, drop = warm_transitions(ks, w, u, gs, transitions=plan.transitions, wp=wpf, BT=BT,
                                              gate_vector=gate_vector, x=x, h0=h0, launch=launch)
            hs = seg_chain_fwd(M_f, S_f, h0, plan, launch=launch, drop=drop)
            if warm.report is not None:
                warm.report["certified_fwd"] = fwd_report["certified"]
        h, v_new, _ = chunk_state_fwd(ks, w, u, gs, layout=segs, num_chunks=NT, h0=hs, launch=launch,
                                      save_v_new=new_values, **common)
    rest, firsts = first_segments(plan)
    if wp is not None and warm is not None and bnd is not None:  # certified windows instead of the ext pass and maps
        ds_end = warm_segment_ends(qs, ks, w, u, gs, aqk, do, x=warm, wp=wp, plan=plan, index=index, dht=dht, M=M,
                                   bnd=bnd, scale=scale, gate_vector=gate_vector, launch=launch, refill=refill)
    else:
        assert M is not None
        ds_ext = M.new_empty(plan.num_segments, H, K, V)  # fp32 like the maps; rows of first segments stay unused
        chunk_state_bwd(qs, ks, w, gs, aqk, do, dht=None, ds_out=ds_ext,
                        layout=SeqLayout(plan.num_segments, segs.cu_seqlens, segs.chunk_offsets, seq_map=rest,
                                         final_idx=rest), **bwd)
        ds_end = seg_chain_bwd(M, ds_ext, dht, plan, launch=launch)
    return h, v_new, SeqLayout(plan.num_segments, segs.cu_seqlens, segs.chunk_offsets, final_idx=firsts), ds_end


def rev_warm(launch: LaunchPlan, op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
             report: dict[str, Tensor] | None, bnd: Tensor | None = None,
             qk_sums: tuple[Tensor, Tensor] | None = None) -> RevWarmInputs | None:
    """The reverse pass's warm window inputs under the plan's `bwd_warm_for(op)` (None at 0: the exact path); bnd:
    the reverse bound sums if an earlier launch made them (`RevWarmInputs.bnd`); qk_sums: the forward's q, k side of
    them (`RevWarmInputs.qk_sums`)."""
    w = launch.bwd_warm_for(op)
    return RevWarmInputs(q, k, g, beta, window_chunks=w, report=report, v=v, bnd=bnd, qk_sums=qk_sums) if w else None


def chunk_state_grad(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float,
    dht: Tensor | None = None, cu_seqlens: Tensor | None = None, plan: LaunchPlan | None = None,
    split_chunks: int | None = None, chunk_size: int = BT_WY, warm_report: dict[str, Tensor] | None = None,
) -> Tensor:
    """dh0 `[N, H, K, V]` fp32 alone: the gradient of each sequence's entering state, from do (and dht). It does not
    depend on the entering state itself. The WY prep and the reverse state pass of `chunk_bwd` (split the same way),
    without the chunk states, T or the gradient kernels: what true_cp's backward gathers before it knows its dht.
    plan: the launch plan (None: `kernels.plan.default_plan()`); chunk_size: the forward's; warm_report: as
    `chunk_bwd`'s."""
    B, T, _, K = k.shape
    H = v.shape[2]
    launch = plan if plan is not None else default_plan()
    gate_vector = op == "kda"
    q, k, v, g, beta, do = (x.contiguous() for x in (q, k, v, g, beta, do))
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    w, u, ks, gs, qs, aqk = _wy_factors(gate_vector, q, k, v, g, beta, scale=scale, index=index, launch=launch, wy=None)
    dh0 = k.new_empty(index.num_seqs, H, K, v.shape[-1], dtype=torch.float32)
    _state_pass(qs, ks, w, u, gs, aqk, do, index=index, gate_vector=gate_vector, scale=scale, h0=None,
                dht=dht.float().contiguous() if dht is not None else None, dh0=dh0, launch=launch,
                split_chunks=split_chunks, states=False, warm=rev_warm(launch, op, q, k, v, g, beta, warm_report))
    return dh0


def chunk_bwd(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float,
    initial_state: Tensor | None = None, dht: Tensor | None = None, cu_seqlens: Tensor | None = None,
    plan: LaunchPlan | None = None, split_chunks: int | None = None,
    wy: Mapping[str, Tensor] | None = None, chunk_size: int = BT_WY, warm_report: dict[str, Tensor] | None = None,
    seg_states: Mapping[str, Any] | None = None, grads_fn: Callable[..., tuple[Tensor, ...]] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, dg, dbeta, dh0) of the GDN (`op="gdn"`) or KDA chunked forward; see the module docstring.

    split_chunks: None = the automatic sequence split (as the forward), 0 = never, n = segments of n chunks.
    wy: the WY factors the forward kept (`chunk_*_fwd(keep=...)`: w, u, gs, aqk, and ks, qs for KDA): the
    recompute of step 1 is skipped (T is still formed here, unless `wy` holds it: "tt"; the reverse bound sums of
    the warm windows likewise, "bnd", `kernels.common.warm_bwd.RevWarmInputs.bnd`, or their q, k side from GDN's
    forward, `warm_bwd.KEPT_REV_SUMS`, `RevWarmInputs.qk_sums`). With the chunk states too
    (`keep_states=True`: h, v_new, M, split) the forward state pass and the transitions of step 2 are skipped, and
    the forward's split is used (split_chunks is then ignored; kept states without the maps M work too). plan: the
    launch plan (None: `kernels.plan.default_plan()`; its `bwd_warm_for(op)` > 0, GDN's default, certifies warm
    windows in the split reverse chain, `kernels.common.warm_bwd`). chunk_size: the forward's
    (`kernels.common.wy.CHUNK_SIZES`). warm_report: a dict that receives the warm window's device tensor `certified`
    `[NS - N, H]` when it ran (read it after the call). seg_states: what the forward's `seg_states` dict received
    (`kernels.common.seqsplit.keep_segment_states`; empty or None: nothing): the backward runs the forward's split
    and recomputes the chunk states from its segment states. grads_fn: the chunk-parallel gradients of
    `bwd_grads="tilelang"` (KDA's from its kept gated Ag, `kernels.ops.kda.ag_bwd.tilelang_grads`, where the plan
    names it or its "auto" takes it): called as grads_fn(q, k, v, g, beta, do, T, h, dh, index=index) for (dq, dk,
    dv, dg, dbeta) in step 3, whatever the plan's `bwd_grads` says.
    """
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[-1]  # the value heads; q, k have Hk = H / G (grouped heads)
    launch = plan if plan is not None else default_plan()
    gate_vector = op == "kda"
    grads = AUTO_BWD_GRADS.get(op, "pair") if launch.bwd_grads == "auto" else launch.bwd_grads
    if grads_fn is not None:  # the caller chose its chunk-parallel gradients (KDA's "tilelang", explicit or "auto")
        grads = "tilelang"
    q, k, v, g, beta, do = (x.contiguous() for x in (q, k, v, g, beta, do))
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    N = index.num_seqs

    # 1. the WY factors (recomputed unless the forward kept them) and T
    if grads in REVERSE_WALKS:  # reached only where the forward kept no Ag: `kernels.ops.gdn.ag_bwd` runs the walk
        raise ValueError(f"bwd_grads={grads!r} is GDN's backward from the forward's Ag (keep 'ag' or 'ag+states'); "
                         f"got op {op!r} under {'recompute' if wy is None else 'kept WY factors'}")
    if grads == "tilelang" and grads_fn is None:  # reached where KDA's forward kept no gated Ag, or for GDN
        raise ValueError(f"bwd_grads='tilelang' is KDA's backward from the forward's kept gated Ag (keep 'ag' on its "
                         f"two-kernel forward); got op {op!r} under {'recompute' if wy is None else 'kept WY factors'}")
    w, u, ks, gs, qs, aqk = _wy_factors(gate_vector, q, k, v, g, beta, scale=scale, index=index, launch=launch, wy=wy)
    if wy is not None and "tt" in wy:  # T formed from the forward's Ag (kernels.ops.gdn.ag_bwd), no inverse here
        tt = wy["tt"]
    elif gate_vector:
        tt = wy_inverse(k, g, beta, index=index, gate_vector=True, kg=ks, gc=gs, launch=launch)
    else:
        tt = wy_inverse(k, g, beta, index=index, gate_vector=False, launch=launch)

    # 2. the chunk states (forward; or the forward's) and their gradients (reverse), split like the forward
    kept = wy if wy is not None and "h" in wy else None
    dh0 = k.new_empty(N, H, K, V, dtype=torch.float32) if initial_state is not None else None
    state_args: dict[str, Any] = {
        "index": index, "gate_vector": gate_vector, "scale": scale, "launch": launch, "split_chunks": split_chunks,
        "h0": initial_state.float().contiguous() if initial_state is not None else None,
        "dht": dht.float().contiguous() if dht is not None else None, "states": True, "kept": kept,
        "warm": rev_warm(launch, op, q, k, v, g, beta, warm_report, wy.get("bnd") if wy is not None else None,
                         kept_rev_sums(wy)),
        "seg_states": seg_states or None,
        "new_values": grads != "tilelang",  # its first kernel forms U and dU from the states and the kept Ag
    }  # fmt: skip
    h, v_new, dh, dv_new = _state_pass(qs, ks, w, u, gs, aqk, do, dh0=dh0, **state_args)
    assert h is not None and dh is not None

    # 3. the chunk-parallel gradients: one kernel per chunk (`LaunchPlan.bwd_grads` "fused"; "auto": the op's choice in
    # `kernels.vocabulary.AUTO_BWD_GRADS`), or the pair below
    if grads == "tilelang":
        assert grads_fn is not None
        grads = grads_fn(q, k, v, g, beta, do, tt, h, dh, index=index)
    elif grads == "fused":
        assert v_new is not None and dv_new is not None
        grads = dqk_wy_bwd(q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, scale=scale, index=index,
                           gate_vector=gate_vector, dot_prec=VECTOR_GATE_DOT, launch=launch)
    else:
        assert v_new is not None and dv_new is not None
        grads = pair_grads(q, k, v, g, beta, tt, w, u, h, dh, v_new, dv_new, do, scale=scale, index=index,
                           gate_vector=gate_vector, launch=launch)
    return (*grads, dh0)


def pair_grads(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, tt: Tensor, w: Tensor, u: Tensor, h: Tensor, dh: Tensor,
    v_new: Tensor, dv_new: Tensor, do: Tensor, *, scale: float, index: ChunkIndex, gate_vector: bool, launch: LaunchPlan,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta) by the pair `chunk_bwd_dqk` + `wy_bwd` from the backward's intermediates (T, the WY
    factors, the chunk states and their gradients, v_new, dv_new; module docstring)."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[-1]
    BT = index.chunk_size
    cu, ci = _bounds(index)
    key = _key(index, H, K, V, gate_vector, k.dtype)
    dq = per_value_head(q, H)  # grouped heads: dq, dk per value head, summed over the group below
    dk_part = torch.empty(B, T, H, K, dtype=torch.float32, device=k.device)
    dw = k.new_empty(B, T, H, K)
    dg_part = torch.empty_like(dk_part)
    cfg = launch.config_for(CHUNK_BWD_DQK, key)
    BK, BV = pair_blocks(cfg, K, V, gate_vector, k.device)
    grid = (cdiv(K, BK), *_chunk_grid(index, B, T, H))
    chunk_bwd_dqk_kernel[grid](
        q, k, g, h, dh, v_new, dv_new, do, dq, dk_part, dw, dg_part, cu, ci, scale, T,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, GATE_VECTOR=gate_vector,
        DOT_PREC=VECTOR_GATE_DOT,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    dk = per_value_head(k, H)
    dv = torch.empty_like(v)
    dbeta = torch.empty_like(beta)
    dg = torch.empty_like(g)
    cfg = launch.config_for(WY_BWD, key)
    BK, BV = pair_blocks(cfg, K, V, gate_vector, k.device)
    wy_bwd_kernel[_chunk_grid(index, B, T, H)](
        k, v, g, beta, tt, w, u, dv_new, dw, dk_part, dg_part, dk, dv, dbeta, dg, cu, ci, T,
        H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, GATE_VECTOR=gate_vector,
        DOT_PREC=VECTOR_GATE_DOT,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    dq = group_sum(dq, Hk)
    dk = group_sum(dk, Hk)
    return dq, dk, dv, dg, dbeta
