"""The backward's gradient kernels fused per chunk: `chunk_bwd_dqk_wy`, one program per (chunk, head) computing dq,
dk, dv, dbeta and dg (GDN and KDA), the alternative to `kernels.common.chunk_bwd`'s pair `chunk_bwd_dqk` (per K
block) + `wy_bwd`, which hands fp32 dk / dG partials ([B, T, H, K] each, 2 KB per token-head written and read back)
and dw through memory. Chosen by the launch plan (`LaunchPlan.bwd_grads`, one of `kernels.vocabulary.BWD_GRADS`).

Notation of `kernels.common.chunk_bwd`. The pair forms dA, the gradient of the WY matrix, as
-StrictLower(dkb w^T + dvb u^T) with dkb = T^T dw and dw = -dv_new S^T, which needs dw over all of K before any
column block of dk can take its WY terms. Since v_new = u - w S, dw w^T = -dv_new (u - v_new)^T, so

    dA = -StrictLower(T^T (dv_new v_new^T))

a [C, C] product over the V columns alone (no cancellation between the two terms either). One program then runs:
1. over V blocks: dAqk = scale Tril(dO v_new^T), dv_new v_new^T, dvb = T^T dv_new (dv = beta dvb, stored; dbeta's
   sum of dvb v); then dA;
2. over K blocks (BK columns; BK = K keeps the whole [C, K] in one step): over V blocks dQg = dO S^T,
   dK~ = v_new dS'^T, dw = -dv_new S^T, dgamma = rowsum_V(S * dS'); then dq (stored), dkb = T^T dw and dk (stored,
   the Aqk, K~ and WY terms at once), dbeta's terms and dG, reverse-cumsummed per column block (KDA, stored) or
   summed over K (GDN, cumsummed and stored after the loop).
Nothing but the gradients is written. do, v_new and dv_new are read once in step 1 and once per K block in step 2
(the same chunk's rows: L2, as the pair's per-K-block programs read them). The decayed products are those of the
pair (`kernels.common.bwd_tiles`), with the same precision (KDA: `VECTOR_GATE_DOT`). Grouped value heads: q and k
at head h // G; for GDN one program runs the G value heads of a q/k head in turn and sums their dq and dk in the input
dtype as it goes (each head's fp32 terms plus the previous heads' stored sum, rounded once per head); KDA, the pair
and FLA write them per value head and sum after.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common import bwd_tiles
from kernels.common.bwd_tiles import (
    _chunk_rows,
    _cols_vec,
    _dg_columns,
    _gate_tile,
    _rows_vec,
    _state_products,
    _store_dg_rows,
    _wy_rows,
)
from kernels.common.chunk_program import group_heads, heuristics
from kernels.common.index import ChunkIndex
from kernels.configs import KernelSpec, LaunchConfig, register
from kernels.plan import LaunchPlan

__all__ = ["CHUNK_BWD_DQK_WY", "dqk_wy_bwd"]

CHUNK_BWD_DQK_WY = register(
    KernelSpec(
        name="chunk_bwd_dqk_wy",
        key=("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype"),
        # 8 warps: the pair's tuned KDA config; at 4 warps the compiler spills 2.9 KB per thread (GDN; KDA 7.9 KB),
        # at 8 warps 0.7 KB (KDA 3.8 KB), at 8 warps and BK = BV = 32 56 B (KDA 1.4 KB): kernels/NOTES.md
        default=LaunchConfig(BK=64, BV=64, num_warps=8, num_stages=2),
        # no single-stage configs: one stage with 32-wide blocks hits the Triton 3.6 sm_90 miscompile (kernels/NOTES.md)
        space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3)},
        hints=(
            LaunchConfig(BK=32, BV=32, num_warps=8, num_stages=2),
            LaunchConfig(BK=64, BV=64, num_warps=4, num_stages=2),
            LaunchConfig(BK=128, BV=64, num_warps=8, num_stages=2),
        ),
    )
)


@triton.jit
def _head_grads(
    q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, scale, T, i_h, i_t, i_tg, bos, o_r, m_r,
    ADD_QK, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GATE_VECTOR: tl.constexpr, DOT_PREC: tl.constexpr, G: tl.constexpr, SUM_GROUP: tl.constexpr,
):  # fmt: skip
    """The gradients of one value head i_h over one chunk (module docstring); dq and dk at its q/k head i_h // G
    with SUM_GROUP, added to what is there when ADD_QK (a later head of the group: the sum over the group), else at
    the value head (per-value-head buffers)."""
    dt = k.dtype.element_ty
    o_t = tl.arange(0, BT)
    p_row = (bos + o_r) * H + i_h
    p_qk = (bos + o_r) * (H // G) + i_h // G  # grouped heads: the shared q/k head
    if SUM_GROUP:
        p_dqk = p_qk
    else:
        p_dqk = p_row
    p_h = (i_tg * H + i_h) * K * V
    m_strict = o_t[:, None] > o_t[None, :]
    b_Tt, b_beta = _wy_rows(tt, beta, p_row, m_r, BT, dt)

    # 1. over V: dAqk, dv_new v_new^T, dv and dbeta's dvb v
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_m = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        p_v = p_row[:, None] * V + o_v[None, :]
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        b_vn = tl.load(v_new + p_v, mask=m_rv, other=0.0)
        b_dvn = tl.load(dv_new + p_v, mask=m_rv, other=0.0)
        b_da = tl.dot(tl.load(do + p_v, mask=m_rv, other=0.0), tl.trans(b_vn), b_da)
        b_m = tl.dot(b_dvn, tl.trans(b_vn), b_m)
        b_dvb = tl.dot(b_Tt, b_dvn.to(dt))
        b_db += tl.sum(b_dvb * tl.load(v + p_v, mask=m_rv, other=0.0).to(tl.float32), 1)
        tl.store(dv + p_v, (b_dvb * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_rv)
    b_dA = -tl.where(m_strict, tl.dot(b_Tt, b_m.to(dt)), 0.0)
    # dAqk below the diagonal goes through the decayed products; its diagonal is added in fp32 and left out of dG
    # (its two terms cancel exactly there: chunk_bwd_dqk's note)
    b_X = tl.where(m_strict, b_da * scale, 0.0)
    b_xd = tl.sum(tl.where(o_t[:, None] == o_t[None, :], b_da * scale, 0.0), 1)[:, None]  # [BT, 1]
    i_last = tl.minimum(T - i_t * BT, BT) - 1  # the chunk's last row before T: d gamma_C and the K~ sums land there
    if not GATE_VECTOR:  # the scalar gate: one decay tile for every K block, dAqk and dA decayed once (in dt)
        b_Gs = _gate_tile(g, p_row, m_r, o_t, K, False)  # [BT, 1]
        b_gr = tl.sum(b_Gs, 1)
        b_E = tl.exp(tl.where(m_strict, b_gr[:, None] - b_gr[None, :], float("-inf")))
        b_XE = (b_X * b_E).to(dt)
        b_AE = (b_dA * b_E).to(dt)

    # 2. over K blocks
    b_dgs = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_rk = m_r[:, None] & m_k[None, :]
        b_dqg, b_dkt, b_dw, b_dgam, _ = _state_products(
            h, dh, v_new, dv_new, do, p_h, p_row, m_r, o_k, K, V, BT, BK, BV, False
        )
        p_k = p_row[:, None] * K + o_k[None, :]
        p_qkk = p_qk[:, None] * K + o_k[None, :]
        p_out = p_dqk[:, None] * K + o_k[None, :]
        b_q = tl.load(q + p_qkk, mask=m_rk, other=0.0).to(tl.float32)
        b_k = tl.load(k + p_qkk, mask=m_rk, other=0.0).to(tl.float32)
        if GATE_VECTOR:
            b_G = _gate_tile(g, p_row, m_r, o_k, K, True)
        else:
            b_G = b_Gs
        b_Gl = tl.sum(tl.where(o_t[:, None] == BT - 1, b_G, 0.0), 0)[None, :]  # [1, BK] (KDA) or [1, 1] (GDN)
        b_bk = b_k * b_beta[:, None]
        if GATE_VECTOR:
            b_rq = _rows_vec(b_X, b_k, b_G, BT, BK, dt, DOT_PREC)
            b_ra = _rows_vec(b_dA, b_k, b_G, BT, BK, dt, DOT_PREC)
            b_c = _cols_vec(b_X, b_q, b_G, BT, BK, dt, DOT_PREC) + _cols_vec(b_dA, b_bk, b_G, BT, BK, dt, DOT_PREC)
        else:
            b_rq = tl.dot(b_XE, b_k.to(dt))
            b_ra = tl.dot(b_AE, b_k.to(dt))
            b_c = tl.dot(tl.trans(b_AE), b_bk.to(dt), tl.dot(tl.trans(b_XE), b_q.to(dt)))  # Cc(dAqk, q) + Cc(dA, bk)
        b_eg = tl.exp(b_G)
        b_ekt = tl.exp(b_Gl - b_G)
        b_dqs = b_dqg * scale * b_eg
        b_dq = b_rq + b_xd * b_k + b_dqs
        if SUM_GROUP:
            b_dq += tl.load(dq + p_out, mask=m_rk & ADD_QK, other=0.0).to(tl.float32)
        tl.store(dq + p_out, b_dq.to(dq.dtype.element_ty), mask=m_rk)
        b_ktdkt = b_k * b_ekt * b_dkt
        b_dkb = tl.dot(b_Tt, (-b_dw).to(dt))
        b_kbd = b_dkb * b_eg * b_k  # dkb (x) e^G (x) k
        b_db += tl.sum(b_kbd + b_k * b_ra, 1)
        b_dk = b_c + b_xd * b_q + b_ekt * b_dkt + b_dkb * b_eg * b_beta[:, None] + b_beta[:, None] * b_ra
        if SUM_GROUP:
            b_dk += tl.load(dk + p_out, mask=m_rk & ADD_QK, other=0.0).to(tl.float32)
        tl.store(dk + p_out, b_dk.to(dk.dtype.element_ty), mask=m_rk)
        b_dG = b_q * b_rq - b_k * b_c + b_dqs * b_q - b_ktdkt + b_beta[:, None] * (b_kbd + b_k * b_ra)
        b_dG += tl.where(o_t[:, None] == i_last, tl.sum(b_ktdkt, 0)[None, :] + tl.exp(b_Gl) * b_dgam[None, :], 0.0)
        b_dgs = _dg_columns(dg, g, b_dG, b_dgs, p_k, m_rk, GATE_VECTOR)
    if not GATE_VECTOR:
        _store_dg_rows(dg, g, b_dgs, p_row, m_r)
    tl.store(dbeta + p_row, b_db.to(dbeta.dtype.element_ty), mask=m_r)


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None, "G": group_heads("do")})
@triton.jit(do_not_specialize=["T"])
def chunk_bwd_dqk_wy_kernel(
    q,  # [B, T, H / G, K] raw
    k,  # [B, T, H / G, K] raw
    v,  # [B, T, H, V]
    g,  # raw gate: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    beta,  # [B, T, H]
    tt,  # [B, T, H, BT] T = (I + A)^{-1}, lower incl. the diagonal
    h,  # [NT_total, H, K, V] state entering each chunk
    dh,  # [NT_total, H, K, V] gradient at each chunk's end
    v_new,  # [B, T, H, V]
    dv_new,  # [B, T, H, V]
    do,  # [B, T, H, V]
    dq,  # out [B, T, H / G, K] summed over the group by its program (SUM_GROUP), else [B, T, H, K] per value head
    dk,  # out (likewise)
    dv,  # out [B, T, H, V]
    dbeta,  # out [B, T, H]
    dg,  # out: [B, T, H] (GDN) or [B, T, H, K] (KDA)
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, DOT_PREC: tl.constexpr, IS_VARLEN: tl.constexpr, G: tl.constexpr,
    SUM_GROUP: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, value head); with SUM_GROUP (GDN's grouped heads) one per (chunk, q/k head), running
    its G value heads one after another (`_head_grads`), each adding its dq and dk to the previous heads' (read back
    from the program's own stores after a barrier): no per-value-head buffers nor a reduction (session 19: they held
    2 KB per token and value head more at the step's peak, and the reduction took 0.14 ms at 1x8K, HV=32)."""
    if SUM_GROUP:
        i_hk, i_t, i_tg, bos, T, o_r, m_r, _ = _chunk_rows(cu_seqlens, chunk_indices, T, H // G, BT, IS_VARLEN)
        for i_g in range(G):
            _head_grads(q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, scale, T,
                        i_hk * G + i_g, i_t, i_tg, bos, o_r, m_r, i_g > 0, H, K, V, BT, BK, BV, GATE_VECTOR,
                        DOT_PREC, G, True)  # fmt: skip
            tl.debug_barrier()  # this head's dq, dk stores before the next head's loads of them (other threads')
    else:
        i_h, i_t, i_tg, bos, T, o_r, m_r, _ = _chunk_rows(cu_seqlens, chunk_indices, T, H, BT, IS_VARLEN)
        _head_grads(q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, scale, T, i_h, i_t, i_tg,
                    bos, o_r, m_r, False, H, K, V, BT, BK, BV, GATE_VECTOR, DOT_PREC, G, False)  # fmt: skip


def dqk_wy_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    tt: Tensor,
    h: Tensor,
    dh: Tensor,
    v_new: Tensor,
    dv_new: Tensor,
    do: Tensor,
    *,
    scale: float,
    index: ChunkIndex,
    gate_vector: bool,
    dot_prec: str,
    launch: LaunchPlan,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta) of the chunked op from the backward's intermediates (`kernels.common.chunk_bwd`: T,
    the chunk states h and their gradients dh, v_new, dv_new), one launch (module docstring); dot_prec: KDA's
    decayed products' precision (`VECTOR_GATE_DOT`)."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[-1]  # the value heads; q, k have Hk = H / G (grouped heads)
    cfg = launch.config_for(CHUNK_BWD_DQK_WY, bwd_tiles._key(index, H, K, V, gate_vector, k.dtype))
    BK, BV = bwd_tiles._fit(cfg, K, V)
    if gate_vector and min(BK, BV) < bwd_tiles.KDA_HOPPER_MIN_BLOCK and bwd_tiles.hopper_miscompile_range(k.device):
        raise ValueError(
            f"chunk_bwd_dqk_wy: KDA's fused gradient kernel with {BK}x{BV} column blocks computed a wrong dk on sm_90 "
            f"under Triton {triton.__version__} (kernels/NOTES.md, session 19); use bwd_grads='pair' (KDA's default) "
            "or column blocks of 64"
        )
    # grouped heads: GDN sums dq, dk over the group in the kernel; KDA writes them per value head, summed below (its
    # in-kernel sum gave non-finite dk on the H200 in session 19's GPU test at BK = BV = 32, the narrow blocks refused
    # above: the code before the sum fails there too, session 20)
    sum_group = not gate_vector and Hk != H
    dq, dk = (
        (torch.empty_like(q), torch.empty_like(k))
        if sum_group
        else (bwd_tiles.per_value_head(q, H), bwd_tiles.per_value_head(k, H))
    )
    dv, dbeta, dg = torch.empty_like(v), torch.empty_like(beta), torch.empty_like(g)
    cu, ci = bwd_tiles._bounds(index)
    chunk_bwd_dqk_wy_kernel[bwd_tiles._chunk_grid(index, B, T, Hk if sum_group else H)](
        q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, dq, dk, dv, dbeta, dg, cu, ci, scale, T,
        H=H, K=K, V=V, BT=index.chunk_size, BK=BK, BV=BV, GATE_VECTOR=gate_vector, DOT_PREC=dot_prec,
        SUM_GROUP=sum_group, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if not sum_group:  # (one at a time: each partial buffer is freed before the next sum is made)
        dq = bwd_tiles.group_sum(dq, Hk)
        dk = bwd_tiles.group_sum(dk, Hk)
    return dq, dk, dv, dg, dbeta
