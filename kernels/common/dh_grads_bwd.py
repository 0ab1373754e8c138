"""GDN's backward with the reverse state pass fused into the gradient kernel: `chunk_bwd_dh_grads`, one program per
(segment, value head) walking its segment's chunks in reverse, the gradient state dS in registers, computing each
chunk's dq, dk, dv, dbeta and dg before stepping dS back over the chunk (issue 26: "the dh pass fused with
dq/dk/dv/dg", FlashQLA's design). Chosen by `LaunchPlan(bwd_grads="fused_dh")` (`kernels.vocabulary.BWD_GRADS`);
opt-in, GDN only (`kernels.common.chunk_bwd` raises a one-line ValueError for KDA, and for K or V above 128).

It replaces the last launch of the split reverse pass (`kernels.common.state_bwd.chunk_state_bwd` storing dh and
dv_new) and the gradient kernel after it (`kernels.common.dqk_wy_bwd`): dh ([NT, H, K, V], 512 MB at B=1 T=64K
H=16 K=V=128 in bf16) and dv_new ([B, T, H, V]) are neither written nor read back. Everything before it is
`chunk_bwd`'s: the WY factors and T, the chunk states h and v_new (forward recompute or kept), and each segment's
entering gradient dS_end (dht unsplit; split: `seg_chain_bwd` from the exact maps, or the gate-certified warm windows
of `kernels.common.warm_bwd`), with the same split. Per chunk (notation of `kernels.common.chunk_bwd`; S = h of the
chunk, dS' = dS the gradient at its end):

    dv_new = Aqk^T dO + K~ dS'                                      (as `chunk_state_bwd`)
    then the fused kernel's chunk body (`kernels.common.dqk_wy_bwd`, GDN, one column block each way):
      dAqk = scale Tril(dO v_new^T), dA = -StrictLower(T^T (dv_new v_new^T)), dvb = T^T dv_new (dv = beta dvb),
      dQg = dO S^T, dK~ = v_new dS'^T, dw = -dv_new S^T, dgamma = rowsum_V(S * dS'); dq, dk, dbeta, dg
    dS <- gamma_C dS + Qg^T dO - w^T dv_new                         (after chunk 0 of a first segment: dh0)

Why one program covers all of V (BV = V, and BK = K): dq, dk, dg and dbeta are sums over V of the chunk's products
(dO S^T, v_new dS'^T, dv_new S^T, dO v_new^T, dv_new v_new^T, the dv_new row sums); with V split over programs each
would have to be summed across them, either through fp32 partials [NV, B, T, H, K] for three of them (1.5 GB at
NV = 2, 64K, H=16: three times the dh it saves) or fp32 atomics of the same volume. One program holds dS [K, V] fp32
(64 KB at 128 x 128: 64 registers per thread at 8 warps) and the chunk's [64, 128] tiles; the compiler spills what
does not fit (the H200 lab decides, `benchmarks/bwd_ag_lab.py` variant `inputs:fused_dh:warm`). The cost: NS * H
programs instead of NS * H * V / BV, so on this path the automatic split (`kernels.common.seqsplit`) counts one program
per (segment, head) and cuts the sequence into twice the segments it cuts for 64-column blocks (1x64K, H=16: 32
segments of 32 chunks, 512 programs; `split_chunks` sets it; kept states bring the forward's split).

The `ds_mem` code variant (`DH_VARIANTS`, the launch config's VARIANT bit 1, with its BK; opt-in, outside the tuning
space: `chunk_bwd_dh_grads_mem_kernel`) keeps dS in a per-program fp32 scratch `[N_programs * H, K, V]` in global
memory instead of registers (64 KB per program, 32 MB at 512 programs; only the resident programs' are in use, read
and written with evict_last so they stay in L2) and walks the key side in BK-column blocks: dv_new's K~ dS' summed over
the blocks first, then per block its dS' rows (dK~, d gamma_C's sum, the rows stepped back and stored), dq, dk and the
row sums of dbeta and dG. The same products, the sums over K in blocks; one block's [BT, BK] and [BK, V] tiles live
instead of the whole [BT, K] and [K, V] ones (ptxas: 0.6 KB spilled per thread instead of 2.3 KB, the rest shared
memory addresses, not data; kernels/NOTES.md) for 192 KB more L2 traffic per chunk and head (dS read twice, written
once: about the floor's 3.1 KB per token-head again).

Inputs it reads per chunk: q, k (at head h // G, grouped heads), v, raw g (the in-chunk cumsum formed here, floored,
`bwd_tiles._gate_tile`), beta, T, Aqk, w, h, v_new, do; per segment dS_end. Writes dq, dk (per value head with
grouped heads, in the input dtype, summed over the group afterwards as the other gradient kernels), dv, dbeta, dg, and dh0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common import bwd_tiles
from kernels.common.bwd_tiles import _gate_tile, _store_dg_rows, _wy_rows
from kernels.common.chunk_program import given, group_heads
from kernels.common.chunk_state import SeqLayout
from kernels.common.index import ChunkIndex
from kernels.common.state_program import range_of_program
from kernels.configs import KernelSpec, LaunchConfig, head_block, register
from kernels.plan import LaunchPlan

__all__ = ["CHUNK_BWD_DH_GRADS", "DH_VARIANTS", "MAX_HEAD_DIM", "dh_grads_bwd"]

MAX_HEAD_DIM = 128  # K and V: one program holds the whole [K, V] gradient state and [BT, K], [BT, V] tiles

CHUNK_BWD_DH_GRADS = register(
    KernelSpec(
        name="chunk_bwd_dh_grads",
        key=("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype"),
        # BK = K and BV = V always (module docstring); 8 warps, one stage as the state pass's hints (untimed: session 13)
        default=LaunchConfig(num_warps=8, num_stages=1),
        # one stage only: two stage the [K, V] tile too, past the SM's 228 KB (ptxas_report: 0 programs per SM)
        space={"num_warps": (4, 8, 16), "num_stages": (1,)},
    )
)
# code variants, bits of the launch config's VARIANT (None: 0, dS in registers): ds_mem: dS in a per-program fp32
# scratch in global memory (L2-resident) and the key side in BK-column blocks (`chunk_bwd_dh_grads_mem_kernel`; BK from
# the config, default DS_MEM_BK). Opt-in, outside the tuning space: the H200 decides (kernels/NOTES.md, dh_grads).
DH_VARIANTS = {"ds_mem": 1}
DS_MEM_BK = 32


@triton.heuristics(
    {
        **given(USE_DHT="dht", STORE_DS="ds_out", IS_VARLEN="cu_seqlens", USE_FINAL_IDX="final_idx"),
        "G": group_heads("do"),
    }
)
@triton.jit(do_not_specialize=["T"])
def chunk_bwd_dh_grads_kernel(
    q, k,  # [B, T, H / G, K] raw
    v,  # [B, T, H, V]
    g,  # raw gate [B, T, H]
    beta,  # [B, T, H]
    tt,  # [B, T, H, BT] T = (I + A)^{-1}, lower incl. the diagonal
    aqk,  # [B, T, H, BT] scaled, lower incl. the diagonal
    w,  # [B, T, H, K]
    h,  # [NT_total, H, K, V] state entering each chunk
    v_new,  # [B, T, H, V]
    do,  # [B, T, H, V]
    dht,  # [N_programs, H, K, V] fp32 gradient at the end of each program's range, or None (zeros)
    ds_out,  # out [N*, H, K, V] fp32 or None: the gradient at the range's start (dh0)
    dq, dk,  # out [B, T, H, K] (per value head with grouped heads, `bwd_tiles.per_value_head`)
    dv,  # out [B, T, H, V]
    dbeta,  # out [B, T, H]
    dg,  # out [B, T, H]
    cu_seqlens, chunk_offsets,  # the ranges (segments) or None (dense rows of T)
    final_idx,  # [N_programs] int32 or None: program n stores ds_out[final_idx[n]] (nowhere if < 0)
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DS: tl.constexpr, IS_VARLEN: tl.constexpr, USE_FINAL_IDX: tl.constexpr,
    G: tl.constexpr,
):  # fmt: skip
    i_nh = tl.program_id(0)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    _s, bos, T, boc, NT = range_of_program(i_n, None, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN, False)
    dt = k.dtype.element_ty
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)  # K and V padded to powers of two, the columns past them masked
    o_v = tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    p_kv = o_k[:, None] * V + o_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]
    m_strict = o_t[:, None] > o_t[None, :]
    b_ds = tl.zeros([BK, BV], dtype=tl.float32)  # dS: the gradient at the end of the chunk being walked
    if USE_DHT:
        b_ds += tl.load(dht + (i_n * H + i_h) * K * V + p_kv, mask=m_kv, other=0.0)

    for i_r in range(NT):
        i_t = NT - 1 - i_r
        o_r = i_t * BT + o_t
        m_r = o_r < T
        m_rk = m_r[:, None] & m_k[None, :]
        m_rv = m_r[:, None] & m_v[None, :]
        p_row = (bos + o_r) * H + i_h
        p_k = p_row[:, None] * K + o_k[None, :]
        p_v = p_row[:, None] * V + o_v[None, :]
        p_qk = ((bos + o_r) * (H // G) + i_h // G)[:, None] * K + o_k[None, :]  # grouped heads: the shared q/k head
        b_q = tl.load(q + p_qk, mask=m_rk, other=0.0)
        b_k = tl.load(k + p_qk, mask=m_rk, other=0.0)
        b_do = tl.load(do + p_v, mask=m_rv, other=0.0)
        b_vn = tl.load(v_new + p_v, mask=m_rv, other=0.0)
        p_S = h + ((boc + i_t) * H + i_h) * K * V + p_kv  # S, the state entering the chunk
        b_Tt, b_beta = _wy_rows(tt, beta, p_row, m_r, BT, dt)
        b_aT = _wy_rows(aqk, beta, p_row, m_r, BT, dt)[0]  # Aqk^T (the same lower-incl.-diagonal layout as T)
        b_G = _gate_tile(g, p_row, m_r, o_k, K, False)  # [BT, 1], flat past T
        b_gr = tl.sum(b_G, 1)
        b_gl = tl.sum(tl.where(o_t == BT - 1, b_gr, 0.0), 0)  # G at the chunk's last row before T
        b_eg = tl.exp(b_G)
        b_ekt = tl.exp(b_gl - b_G)
        b_dsd = b_ds.to(dt)

        # 1. the state pass's dv_new = Aqk^T dO + K~ dS', in registers only; dv and dbeta's dvb v
        b_dvn = tl.dot((b_k.to(tl.float32) * b_ekt).to(dt), b_dsd, tl.dot(b_aT, b_do)).to(dt)
        b_t = tl.dot(b_Tt, b_dvn)  # dvb = T^T dv_new
        b_db = tl.sum(b_t * tl.load(v + p_v, mask=m_rv, other=0.0).to(tl.float32), 1)
        tl.store(dv + p_v, (b_t * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_rv)
        # 2. the in-chunk [BT, BT] gradients decayed once: dAqk below the diagonal (its diagonal kept in fp32 and out
        # of dG, where its two terms cancel: `kernels.common.dqk_wy_bwd`), dA = -StrictLower(T^T dv_new v_new^T)
        b_da = tl.dot(b_do, tl.trans(b_vn)) * scale
        b_E = tl.exp(tl.where(m_strict, b_gr[:, None] - b_gr[None, :], float("-inf")))
        b_XE = (tl.where(m_strict, b_da, 0.0) * b_E).to(dt)
        b_xd = tl.sum(tl.where(o_t[:, None] == o_t[None, :], b_da, 0.0), 1)[:, None]  # [BT, 1]
        b_AE = (-tl.where(m_strict, tl.dot(b_Tt, tl.dot(b_dvn, tl.trans(b_vn)).to(dt)), 0.0) * b_E).to(dt)
        # each state product consumed right after it is formed (h read where used: L2), fewer [BT, K] tiles live:
        # 3. dq = R(dAqk, k) + diag(dAqk) k + scale e^G (x) dO S^T; dG's q terms (summed over K at once)
        b_t = tl.dot(b_XE, b_k, tl.dot(b_do, tl.trans(tl.load(p_S, mask=m_kv, other=0.0))) * scale * b_eg)
        tl.store(dq + p_k, (b_t + b_xd * b_k.to(tl.float32)).to(dq.dtype.element_ty), mask=m_rk)
        b_dgs = tl.sum(b_q.to(tl.float32) * b_t, 1)
        # 4. dk's K~ terms e^(G_C - G) (x) v_new dS'^T; their sum and d gamma_C = rowsum_V(S * dS') on the last row
        b_t = b_ekt * tl.dot(b_vn, tl.trans(b_dsd))
        b_dk = b_t + b_xd * b_q.to(tl.float32)
        b_t = b_k.to(tl.float32) * b_t
        b_dgs -= tl.sum(b_t, 1)
        b_last = tl.sum(b_t) + tl.exp(b_gl) * tl.sum(tl.load(p_S, mask=m_kv, other=0.0).to(tl.float32) * b_ds)
        # 5. the WY terms: dkb (x) e^G + R(dA, k), dkb = T^T (-dv_new S^T); beta times them in dk, dbeta and dG
        b_t = tl.dot(b_Tt, (-tl.dot(b_dvn, tl.trans(tl.load(p_S, mask=m_kv, other=0.0)))).to(dt)) * b_eg
        b_t = tl.dot(b_AE, b_k, b_t)
        b_dk += b_beta[:, None] * b_t
        b_t = tl.sum(b_k.to(tl.float32) * b_t, 1)
        b_db += b_t
        b_dgs += b_beta * b_t
        # 6. the column products Cc(dAqk, q) + Cc(dA, beta k)
        b_t = tl.dot(tl.trans(b_AE), (b_k.to(tl.float32) * b_beta[:, None]).to(dt), tl.dot(tl.trans(b_XE), b_q))
        tl.store(dk + p_k, (b_dk + b_t).to(dk.dtype.element_ty), mask=m_rk)
        b_dgs -= tl.sum(b_k.to(tl.float32) * b_t, 1)
        b_dgs += tl.where(o_t == tl.minimum(T - i_t * BT, BT) - 1, b_last, 0.0)
        _store_dg_rows(dg, g, b_dgs, p_row, m_r)
        tl.store(dbeta + p_row, b_db.to(dbeta.dtype.element_ty), mask=m_r)

        # 7. dS over the chunk (as `chunk_state_bwd`): gamma_C dS + Qg^T dO - w^T dv_new
        b_w = tl.load(w + p_k, mask=m_rk, other=0.0)
        b_qg = (b_q.to(tl.float32) * b_eg * scale).to(dt)
        b_ds = tl.dot(tl.trans(b_w), -b_dvn, tl.dot(tl.trans(b_qg), b_do, b_ds * tl.exp(b_gl)))

    if STORE_DS:
        i_f = i_n
        if USE_FINAL_IDX:
            i_f = tl.load(final_idx + i_n).to(tl.int64)
        if i_f >= 0:
            tl.store(ds_out + (i_f * H + i_h) * K * V + p_kv, b_ds, mask=m_kv)


@triton.heuristics(
    {
        **given(USE_DHT="dht", STORE_DS="ds_out", IS_VARLEN="cu_seqlens", USE_FINAL_IDX="final_idx"),
        "G": group_heads("do"),
    }
)
@triton.jit(do_not_specialize=["T"])
def chunk_bwd_dh_grads_mem_kernel(
    q, k, v, g, beta, tt, aqk, w, h, v_new, do, dht,  # as chunk_bwd_dh_grads_kernel's
    ds_mem,  # [N_programs * H, K, V] fp32 scratch: each program's dS between its chunks (L2-resident)
    ds_out, dq, dk, dv, dbeta, dg, cu_seqlens, chunk_offsets, final_idx, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DS: tl.constexpr, IS_VARLEN: tl.constexpr, USE_FINAL_IDX: tl.constexpr,
    G: tl.constexpr,
):  # fmt: skip
    """The `ds_mem` variant (DH_VARIANTS): chunk_bwd_dh_grads_kernel's products, dS kept in `ds_mem` instead of
    registers, and the key side walked in BK-column blocks (dv_new's K~ dS' summed over them first; then per block
    dS's rows stepped back, dq, dk and the row sums of dbeta and dG, the sums over K accumulated block by block), so
    one block's [BT, BK] and [BK, V] tiles are live, not the whole [BT, K] and [K, V] ones. A barrier orders every
    thread's reads of dS' rows before their writes, and a chunk's writes before the next chunk's reads."""
    i_nh = tl.program_id(0)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    _s, bos, T, boc, NT = range_of_program(i_n, None, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN, False)
    dt = k.dtype.element_ty
    o_t = tl.arange(0, BT)
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    m_strict = o_t[:, None] > o_t[None, :]
    p_m = ds_mem + i_nh.to(tl.int64) * K * V  # this program's dS
    for i_k in range(tl.cdiv(K, BK)):  # dS_end (or zeros) into the scratch
        o_k = i_k * BK + tl.arange(0, BK)
        p_kv = o_k[:, None] * V + o_v[None, :]
        m_kv = (o_k < K)[:, None] & m_v[None, :]
        b_ds = tl.zeros([BK, BV], dtype=tl.float32)
        if USE_DHT:
            b_ds += tl.load(dht + (i_n * H + i_h) * K * V + p_kv, mask=m_kv, other=0.0)
        tl.store(p_m + p_kv, b_ds, mask=m_kv, eviction_policy="evict_last")
    tl.debug_barrier()

    for i_r in range(NT):
        i_t = NT - 1 - i_r
        o_r = i_t * BT + o_t
        m_r = o_r < T
        m_rv = m_r[:, None] & m_v[None, :]
        p_row = (bos + o_r) * H + i_h
        p_qr = (bos + o_r) * (H // G) + i_h // G  # grouped heads: the shared q/k head's rows
        p_v = p_row[:, None] * V + o_v[None, :]
        p_h = h + ((boc + i_t) * H + i_h) * K * V  # S, the state entering the chunk
        b_G = _gate_tile(g, p_row, m_r, o_t, K, False)  # [BT, 1], flat past T
        b_gl = tl.sum(tl.where(o_t == BT - 1, tl.sum(b_G, 1), 0.0), 0)

        # 1. dv_new = K~ dS' (summed over the key blocks) + Aqk^T dO, the key blocks first (nothing else live);
        # dv and dbeta's dvb v
        b_acc = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_k = tl.load(k + p_qr[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
            p_kv = o_k[:, None] * V + o_v[None, :]
            b_dsd = tl.load(p_m + p_kv, mask=m_k[:, None] & m_v[None, :], other=0.0, eviction_policy="evict_last")
            b_acc = tl.dot((b_k.to(tl.float32) * tl.exp(b_gl - b_G)).to(dt), b_dsd.to(dt), b_acc)
        b_do = tl.load(do + p_v, mask=m_rv, other=0.0)
        b_dvn = tl.dot(_wy_rows(aqk, beta, p_row, m_r, BT, dt)[0], b_do, b_acc).to(dt)  # Aqk^T dO
        b_vn = tl.load(v_new + p_v, mask=m_rv, other=0.0)
        b_Tt, b_beta = _wy_rows(tt, beta, p_row, m_r, BT, dt)
        b_gr = tl.sum(b_G, 1)
        b_eg = tl.exp(b_G)
        b_ekt = tl.exp(b_gl - b_G)
        b_t = tl.dot(b_Tt, b_dvn)
        b_db = tl.sum(b_t * tl.load(v + p_v, mask=m_rv, other=0.0).to(tl.float32), 1)
        tl.store(dv + p_v, (b_t * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_rv)
        # 2. the in-chunk [BT, BT] gradients (as chunk_bwd_dh_grads_kernel's)
        b_da = tl.dot(b_do, tl.trans(b_vn)) * scale
        b_E = tl.exp(tl.where(m_strict, b_gr[:, None] - b_gr[None, :], float("-inf")))
        b_XE = (tl.where(m_strict, b_da, 0.0) * b_E).to(dt)
        b_xd = tl.sum(tl.where(o_t[:, None] == o_t[None, :], b_da, 0.0), 1)[:, None]
        b_AE = (-tl.where(m_strict, tl.dot(b_Tt, tl.dot(b_dvn, tl.trans(b_vn)).to(dt)), 0.0) * b_E).to(dt)
        b_dgs = tl.zeros([BT], dtype=tl.float32)
        b_last = tl.sum(tl.zeros([BT], dtype=tl.float32), 0)
        for i_k in range(tl.cdiv(K, BK)):  # 3.-7. per key block (chunk_bwd_dh_grads_kernel's steps)
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_rk = m_r[:, None] & m_k[None, :]
            m_kv = m_k[:, None] & m_v[None, :]
            p_k = p_row[:, None] * K + o_k[None, :]
            p_qk = p_qr[:, None] * K + o_k[None, :]
            p_kv = o_k[:, None] * V + o_v[None, :]
            b_q = tl.load(q + p_qk, mask=m_rk, other=0.0)
            b_k = tl.load(k + p_qk, mask=m_rk, other=0.0)
            b_S = tl.load(p_h + p_kv, mask=m_kv, other=0.0)
            b_ds = tl.load(p_m + p_kv, mask=m_kv, other=0.0, eviction_policy="evict_last")  # dS' rows, fp32
            # first what reads them (dK~'s block, d gamma_C's S * dS' sum) and 7. the rows stepped back, gamma_C dS' +
            # Qg^T dO - w^T dv_new, stored: the fp32 rows not live through 3.-6. (fewer spills: kernels/NOTES.md)
            b_dkt = b_ekt * tl.dot(b_vn, tl.trans(b_ds.to(dt)))
            b_last += tl.exp(b_gl) * tl.sum(b_S.to(tl.float32) * b_ds)
            b_w = tl.load(w + p_k, mask=m_rk, other=0.0)
            b_qg = (b_q.to(tl.float32) * b_eg * scale).to(dt)
            b_ds = tl.dot(tl.trans(b_w), -b_dvn, tl.dot(tl.trans(b_qg), b_do, b_ds * tl.exp(b_gl)))
            tl.debug_barrier()  # every thread's reads of these rows (1. and here) before any write
            tl.store(p_m + p_kv, b_ds, mask=m_kv, eviction_policy="evict_last")
            # 3. dq
            b_x = tl.dot(b_XE, b_k, tl.dot(b_do, tl.trans(b_S)) * scale * b_eg)
            tl.store(dq + p_k, (b_x + b_xd * b_k.to(tl.float32)).to(dq.dtype.element_ty), mask=m_rk)
            b_dgs += tl.sum(b_q.to(tl.float32) * b_x, 1)
            # 4. dk's K~ terms; d gamma_C's sums
            b_dk = b_dkt + b_xd * b_q.to(tl.float32)
            b_x = b_k.to(tl.float32) * b_dkt
            b_dgs -= tl.sum(b_x, 1)
            b_last += tl.sum(b_x)
            # 5. the WY terms
            b_x = tl.dot(b_Tt, (-tl.dot(b_dvn, tl.trans(b_S))).to(dt)) * b_eg
            b_x = tl.dot(b_AE, b_k, b_x)
            b_dk += b_beta[:, None] * b_x
            b_x = tl.sum(b_k.to(tl.float32) * b_x, 1)
            b_db += b_x
            b_dgs += b_beta * b_x
            # 6. the column products
            b_x = tl.dot(tl.trans(b_AE), (b_k.to(tl.float32) * b_beta[:, None]).to(dt), tl.dot(tl.trans(b_XE), b_q))
            tl.store(dk + p_k, (b_dk + b_x).to(dk.dtype.element_ty), mask=m_rk)
            b_dgs -= tl.sum(b_k.to(tl.float32) * b_x, 1)
        tl.debug_barrier()  # the writes before the next chunk's reads
        b_dgs += tl.where(o_t == tl.minimum(T - i_t * BT, BT) - 1, b_last, 0.0)
        _store_dg_rows(dg, g, b_dgs, p_row, m_r)
        tl.store(dbeta + p_row, b_db.to(dbeta.dtype.element_ty), mask=m_r)

    if STORE_DS:
        i_f = i_n
        if USE_FINAL_IDX:
            i_f = tl.load(final_idx + i_n).to(tl.int64)
        if i_f >= 0:
            for i_k in range(tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                p_kv = o_k[:, None] * V + o_v[None, :]
                m_kv = (o_k < K)[:, None] & m_v[None, :]
                tl.store(ds_out + (i_f * H + i_h) * K * V + p_kv, tl.load(p_m + p_kv, mask=m_kv, other=0.0), mask=m_kv)


def dh_grads_bwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, tt: Tensor, aqk: Tensor, w: Tensor, h: Tensor,
    v_new: Tensor, do: Tensor, *, layout: SeqLayout, dht: Tensor | None, ds_out: Tensor | None, scale: float,
    index: ChunkIndex, launch: LaunchPlan,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv, dg, dbeta) of GDN from the backward's intermediates without dh or dv_new (module docstring), one
    launch over `layout`'s ranges (the reverse pass's last layout: whole sequences, or the split's segments with
    `final_idx`), from dht `[N_programs, H, K, V]` fp32 (each range's end gradient; None: zeros); writes ds_out (dh0)
    where given."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[-1]  # the value heads; q, k have Hk = H / G (grouped heads)
    assert layout.seq_map is None, "the gradient kernel walks every range of its layout"
    assert K <= MAX_HEAD_DIM and V <= MAX_HEAD_DIM, f"K={K}, V={V}: at most {MAX_HEAD_DIM}"
    cfg = launch.config_for(CHUNK_BWD_DH_GRADS, bwd_tiles._key(index, H, K, V, False, k.dtype))
    bits = cfg.VARIANT or 0
    if bits & ~sum(DH_VARIANTS.values()):
        raise ValueError(f"chunk_bwd_dh_grads: unknown VARIANT bits {bits}; the bits are {DH_VARIANTS}")
    dq, dk = bwd_tiles.per_value_head(q, H), bwd_tiles.per_value_head(k, H)  # grouped heads: summed below
    dv, dbeta, dg = torch.empty_like(v), torch.empty_like(beta), torch.empty_like(g)
    grid = (layout.num_programs * H,)
    if grid[0] and bits & DH_VARIANTS["ds_mem"]:
        ds_mem = k.new_empty(grid[0], K, V, dtype=torch.float32)  # each program's dS (64 KB at K = V = 128)
        chunk_bwd_dh_grads_mem_kernel[grid](
            q, k, v, g, beta, tt, aqk, w, h, v_new, do, dht, ds_mem, ds_out, dq, dk, dv, dbeta, dg,
            layout.cu_seqlens, layout.chunk_offsets, layout.final_idx, scale, T,
            H=H, K=K, V=V, BT=index.chunk_size, BK=min(cfg.BK or DS_MEM_BK, head_block(K)), BV=head_block(V),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    elif grid[0]:
        chunk_bwd_dh_grads_kernel[grid](
            q, k, v, g, beta, tt, aqk, w, h, v_new, do, dht, ds_out, dq, dk, dv, dbeta, dg,
            layout.cu_seqlens, layout.chunk_offsets, layout.final_idx, scale, T,
            H=H, K=K, V=V, BT=index.chunk_size, BK=head_block(K), BV=head_block(V),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    dq = bwd_tiles.group_sum(dq, Hk)
    dk = bwd_tiles.group_sum(dk, Hk)
    return dq, dk, dv, dg, dbeta
