"""GDN's backward as one reverse walk per (segment, value head), in TileLang (Hopper): the state gradient dS `[K, V]`
stays in fp32 registers from chunk to chunk, and every gradient of a chunk is formed where dS reaches it, so no dh,
v_new or dv_new goes through memory (FlashQLA's decomposition, `kernels/NOTES.md` "Session 22"). Its CPU mirror is
`kernels.common.reverse_bwd_torch` (the same per-chunk products, `chunk_backward_ag(..., form="kernel")`), which CI
tests against the per-token reference; this kernel is tested against that mirror on the GPU.

Inputs per chunk (C rows, the segment walked last chunk first): q, k, v, do, the forward's kept Ag `[C, C]` and gate
cumsum G, beta, the chunk's entering state S (a state pass's `h`), and dS' (the gradient at its leaving state). With
Gam_ij = e^(G_i - G_j) (i >= j), eG = e^G, eR = e^(G_L - G), eL = e^(G_L):

    B = K K^T o Gam,  M = StrictLower(B),  T = I - Ag M  (= (I + diag(beta) M)^-1, exact for beta -> 0)
    P = scale Tril(Q K^T o Gam),  W = V - eG o (K S),  U = Ag W
    dU = eR o (K dS') + P^T dO,   dv = Ag^T dU,   Wn = -eG o dv,   Og = scale eG o dO
    dP = Tril(dO U^T),  dAg = dU W^T,  dA = -StrictLower(T^T (dAg diag(beta)) T^T),  dB = diag(beta) dA
    dq = Og S^T + (dP o P / Q K^T) K,   dk = Wn S^T + eR o (U dS'^T) + (scale dP o Gam)^T Q + (dB o Gam + (.)^T) K
    dS = eL dS' + Q^T Og + K^T Wn
    dbeta = colsum(dAg o T) + rowsum(dA o B)
    dG = rowsum - colsum of (dP o P) and of (dB o B), + rowsum(Q o Og S^T) + rowsum(K o Wn S^T) - rowsum(K o eR o U dS'^T),
         its last row + eL sum(S o dS') + sum(K o eR o U dS'^T);  dg = the reverse in-chunk cumsum of dG (0 below the floor)

One program of 256 threads (two warpgroups) per (segment, value head); the products are wgmma tiles through shared
memory (about 223 KB: one program per SM). Around the products (session 23, `benchmarks/reverse_bwd_lab.py` times
each part): the next chunk's dO, Ag and state, then its q, k, v, are loaded by TMA into their tiles as soon as this
step has read them last (only a segment's first step, whose chunk may be partial, loads row by row); dq, dk, dv are
staged in tiles the step no longer reads and stored by TMA, left in flight until the tile is written again; the row
and column sums exchange their partial sums across warps in batches; dG's reverse cumsum is one warp's scan.
Sizes: K = V = 128, chunk 64 (what FlashQLA and our default use); other shapes are refused with a one-line reason,
as is any TileLang other than the version it was checked on and any GPU other than sm_90
(`kernels.ops.gdn.tilelang_hopper`).
"""

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from kernels.common.bwd_tiles import group_sum, per_value_head
from kernels.common.chunk_bwd import LazyFactors, rev_warm, reverse_ends
from kernels.common.decay import GATE_FLOOR
from kernels.common.index import ChunkIndex
from kernels.configs import cdiv
from kernels.ops.gdn.tilelang_hopper import (
    TL_DTYPES,
    check_lab,
    hopper_jit,
    masked_chunk_loads,
    tilelang_refusal,
    tilelang_refusal_cached,
)
from kernels.parallel_compile import build_beside
from kernels.plan import LaunchPlan
from kernels.vocabulary import AUTO_REVERSE_MIN_TOKEN_HEADS

__all__ = ["chunk_gdn_bwd_reverse", "reverse_bwd_refusal", "reverse_bwd_tilelang"]

_THREADS = 256
_WHAT = "reverse backward"  # how the refusals name this kernel
# Sums per thread of each reduction in the 256-thread wgmma fragment layouts ([C, C] rows and columns, [C, K] rows,
# [K, V] rows), reduced in batched cross-warp exchanges of these sizes instead of one exchange (two or four barriers)
# per sum; [C, C] columns take two batches of 4 of their 8 (a batch of 8 needs more shared memory than the SM has)
_BATCH_SIZES = {"cc_rows": 2, "cc_cols": 4, "ck_rows": 2, "kv_rows": 4}


def reverse_bwd_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


def auto_reverse(k: Tensor, v: Tensor, BT: int, launch: LaunchPlan) -> bool:
    """Whether `LaunchPlan.bwd_grads` "auto" takes this walk for GDN's step from the kept Ag: bf16, at least
    `kernels.vocabulary.AUTO_REVERSE_MIN_TOKEN_HEADS` tokens x value heads (v `[B, T, HV, V]`), and nothing refusing
    the kernel here (`reverse_bwd_refusal`); else the fused gradient kernels run, as for any other step."""
    if launch.bwd_grads != "auto" or k.dtype != torch.bfloat16:
        return False
    B, T, HV = v.shape[:3]
    if B * T * HV < AUTO_REVERSE_MIN_TOKEN_HEADS:
        return False
    return tilelang_refusal_cached(_WHAT, k.shape[-1], v.shape[-1], BT, k.device) is None


# Switches that leave a part out or swap it, only to time the rest (`benchmarks/reverse_bwd_lab.py`); a kernel built
# with one that leaves a part out gives wrong gradients; one that swaps a part (`EXACT_SWITCHES`) gives the same ones.
LAB_SWITCHES = {
    "load_once": "the chunk's inputs loaded on the first step only",
    "sync_loads": "every input of a step loaded at its top (no TMA prefetch of the next chunk's)",
    "sync_qkv": "q, k, v loaded at the step's top (dO, Ag and the state still prefetched)",
    "sync_stores": "each TMA store of dv, dk waited for at once",
    "sync_mma": "each product waited for at once (no back-to-back issue of independent products)",
    "unbatched": "each reduction's sums exchanged across warps one by one (session 22's reductions)",
    "no_dg": "no dG combine (dg unwritten)",
    "no_reduce": "no row and column sums (the dG and dbeta terms)",
    "no_store": "no dq, dk, dv stores",
}
EXACT_SWITCHES = frozenset({"sync_loads", "sync_qkv", "sync_stores", "sync_mma", "unbatched"})


@functools.cache
def _build(
    H: int, Hk: int, K: int, V: int, BT: int, scale: float, io: str, gdt: str, bdt: str, lab: frozenset[str] = frozenset()
) -> Any:
    """The compiled kernel for these sizes and dtypes (TileLang JIT, cached on disk by TileLang too); `lab` holds
    `LAB_SWITCHES` keys (timing only)."""
    check_lab(lab, LAB_SWITCHES)
    import tilelang
    import tilelang.language as T

    _BATCH = dict.fromkeys(_BATCH_SIZES, 1) if "unbatched" in lab else _BATCH_SIZES
    prefetch = not {"sync_loads", "load_once"} & lab  # the next chunk's dO, Ag, state by TMA once their tiles are free
    prefetch_qkv = prefetch and "sync_qkv" not in lab  # and its q, k, v after the step's last products
    async_store = "sync_stores" not in lab  # dv and dk's TMA stores in flight until their tiles are written again
    async_mma = "sync_mma" not in lab  # independent products issued back to back, one wait for the group
    G = H // Hk
    fp32 = "float32"
    ntok, nchunk, nseg, nseq = T.dynamic("ntok"), T.dynamic("nchunk"), T.dynamic("nseg"), T.dynamic("nseq")
    floor = float(GATE_FLOOR)

    @hopper_jit()
    def build() -> Any:
        load_chunk = masked_chunk_loads(T, BT, K, V)

        @T.macro
        def store_rows(tile: Any, out: Any, t0: Any, eos: Any, i_h: Any) -> None:
            """A staged [BT, D] shared tile into out[t0 : t0 + BT, i_h]: one TMA store for a full chunk (under
            `async_store`, left in flight: `settle` waits for it before the tile is written again),
            row by row below eos for a range's partial last chunk (rows past it belong to the next range). Every
            thread's writes of the tile are fenced and synced before either branch reads it: TileLang counted the TMA
            branch's barrier for both, and the row-by-row branch read rows other threads had not yet written (dk off
            at 6.5e-2 on an H200 where a range's first chunk was partial, session 24)."""
            T.fence_proxy_async()
            T.sync_threads()
            if t0 + BT <= eos:
                if async_store:
                    T.tma_copy(tile, out[t0 : t0 + BT, i_h, :])
                else:
                    T.copy(tile, out[t0 : t0 + BT, i_h, :])
            else:
                for i, j in T.Parallel(BT, tile.shape[1]):
                    if t0 + i < eos:
                        out[t0 + i, i_h, j] = tile[i, j]

        @T.macro
        def mm(
            a: Any, b: Any, c: Any, transpose_A: bool = False, transpose_B: bool = False, clear_accum: bool = False
        ) -> None:
            """c (+)= a b: issued without a wait (`async_mma`: `mm_wait` waits for every product issued), so
            independent products run back to back; under "sync_mma" each waits for itself (`T.gemm`)."""
            if async_mma:
                T.wgmma_gemm(a, b, c, transpose_A=transpose_A, transpose_B=transpose_B, clear_accum=clear_accum)
            else:
                T.gemm(a, b, c, transpose_A=transpose_A, transpose_B=transpose_B, clear_accum=clear_accum)

        @T.macro
        def mm_wait() -> None:
            if async_mma:
                T.wait_wgmma(0)

        @T.macro
        def settle() -> None:
            """Wait for the TMA stores in flight to have read their tiles (`async_store`)."""
            if async_store:
                T.tma_store_wait()
                T.sync_threads()

        @T.prim_func
        def reverse_bwd(
            q: T.Tensor((ntok, Hk, K), io), k: T.Tensor((ntok, Hk, K), io), v: T.Tensor((ntok, H, V), io),
            do: T.Tensor((ntok, H, V), io), ag: T.Tensor((ntok, H, BT), io), gs: T.Tensor((ntok, H), fp32),
            graw: T.Tensor((ntok, H), gdt), beta: T.Tensor((ntok, H), bdt), h: T.Tensor((nchunk, H, K, V), io),
            ends: T.Tensor((nseg, H, K, V), fp32), cu: T.Tensor((nseg + 1,), "int32"),
            co: T.Tensor((nseg,), "int32"), fin: T.Tensor((nseg,), "int32"),
            dq: T.Tensor((ntok, H, K), io), dk: T.Tensor((ntok, H, K), io), dv: T.Tensor((ntok, H, V), io),
            dg: T.Tensor((ntok, H), fp32), dbeta: T.Tensor((ntok, H), fp32), dh0: T.Tensor((nseq, H, K, V), fp32),
        ):  # fmt: skip
            with T.Kernel(nseg * H, threads=_THREADS) as (bid,):
                i_s = bid // H
                i_h = bid % H
                i_hk = i_h // G
                bos = T.alloc_var("int32")
                eos = T.alloc_var("int32")
                boc = T.alloc_var("int32")
                nt = T.alloc_var("int32")
                bos = cu[i_s]
                eos = cu[i_s + 1]
                boc = co[i_s]
                nt = T.ceildiv(eos - bos, BT)

                q_s = T.alloc_shared((BT, K), io)
                k_s = T.alloc_shared((BT, K), io)
                vw_s = T.alloc_shared((BT, V), io)  # v, then W, then Og
                do_s = T.alloc_shared((BT, V), io)
                ag_s = T.alloc_shared((BT, BT), io)
                h_s = T.alloc_shared((K, V), io)
                u_s = T.alloc_shared((BT, V), io)
                du_s = T.alloc_shared((BT, V), io)  # dU, then Wn
                ds_s = T.alloc_shared((K, V), io)
                p_s = T.alloc_shared((BT, BT), io)  # P, then scale dP o Gam
                m_s = T.alloc_shared((BT, BT), io)  # M, then dAg diag(beta), then the symmetric dB o Gam
                t_s = T.alloc_shared((BT, BT), io)
                x_s = T.alloc_shared((BT, BT), io)
                g_s = T.alloc_shared((BT,), fp32)
                eg_s = T.alloc_shared((BT,), fp32)
                er_s = T.alloc_shared((BT,), fp32)
                b_s = T.alloc_shared((BT,), fp32)
                r1_s = T.alloc_shared((BT,), fp32)  # rowsum, colsum (dP o P + dB o B)
                c1_s = T.alloc_shared((BT,), fp32)
                r3_s = T.alloc_shared((BT,), fp32)  # rowsum(Q o Og S^T + K o Wn S^T)
                b1_s = T.alloc_shared((BT,), fp32)  # colsum(dAg o T)
                b2_s = T.alloc_shared((BT,), fp32)  # rowsum(dA o B)
                # dG per row, rowsum(K o eR o U dS'^T), eL * row sums of S o dS'; then its reverse cumsum
                z_s = T.alloc_shared((2 * BT + K,), fp32)

                T.annotate_layout({
                    x: tilelang.layout.make_swizzled_layout(x)
                    for x in (q_s, k_s, vw_s, do_s, ag_s, h_s, u_s, du_s, ds_s, p_s, m_s, t_s, x_s)
                })  # fmt: skip

                ds_f = T.alloc_fragment((K, V), fp32)
                kv_f = T.alloc_fragment((K, V), fp32)
                qk_f = T.alloc_fragment((BT, BT), fp32)
                kk_f = T.alloc_fragment((BT, BT), fp32)
                gam_f = T.alloc_fragment((BT, BT), fp32)
                tt_f = T.alloc_fragment((BT, BT), fp32)
                x_f = T.alloc_fragment((BT, BT), fp32)
                dp_f = T.alloc_fragment((BT, BT), fp32)
                da_f = T.alloc_fragment((BT, BT), fp32)
                a_f = T.alloc_fragment((BT, V), fp32)
                b_f = T.alloc_fragment((BT, V), fp32)
                c_f = T.alloc_fragment((BT, K), fp32)
                row_f = T.alloc_fragment((BT,), fp32)  # row sums of [C, C] tiles
                col_f = T.alloc_fragment((BT,), fp32)  # column sums of [C, C] tiles
                rowk_f = T.alloc_fragment((BT,), fp32)  # row sums of [C, K] tiles
                vk_f = T.alloc_fragment((K,), fp32)
                el = T.alloc_var(fp32)
                # `prefetch`: the next chunk's dO, Ag and state have landed (every thread arrives after the last issue)
                bar = T.alloc_barrier(arrive_count=_THREADS)
                bar_qkv = T.alloc_barrier(arrive_count=_THREADS)  # `prefetch_qkv`: the next chunk's q, k, v

                T.copy(ends[i_s, i_h, 0:K, 0:V], ds_f)

                for i_r in T.serial(nt):
                    t0 = bos + (nt - 1 - i_r) * BT
                    ic = boc + nt - 1 - i_r
                    # loads: rows past the range are zeros (their gate repeats the last row's cumsum: no decay); under
                    # `prefetch` a step after the first loads g, beta (its chunk is full) and waits for the dO, Ag,
                    # state, q, k and v that the step before sent for
                    if "load_once" in lab and i_r > 0:
                        T.sync_threads()
                    elif prefetch and i_r > 0:
                        if prefetch_qkv:
                            T.barrier_wait(bar_qkv, (i_r + 1) % 2)
                        else:
                            T.copy(q[t0 : t0 + BT, i_hk, :], q_s)
                            T.copy(k[t0 : t0 + BT, i_hk, :], k_s)
                            T.copy(v[t0 : t0 + BT, i_h, :], vw_s)
                        for r in T.Parallel(BT):
                            g_s[r] = gs[t0 + r, i_h]
                            b_s[r] = T.cast(beta[t0 + r, i_h], fp32)
                        T.barrier_wait(bar, (i_r + 1) % 2)
                    else:
                        load_chunk(q, k, v, do, ag, h, gs, beta, q_s, k_s, vw_s, do_s, ag_s, h_s, g_s, b_s, t0, eos, ic,
                                   i_hk, i_h)  # fmt: skip
                    for r in T.Parallel(BT):
                        eg_s[r] = T.exp(g_s[r])
                        er_s[r] = T.exp(g_s[BT - 1] - g_s[r])
                    T.copy(ds_f, ds_s)
                    # the decay's term eL sum(S o dS') (row sums of S o dS', the state's last read before Wn S^T)
                    el = T.exp(g_s[BT - 1])
                    if "no_reduce" not in lab:
                        for i, j in T.Parallel(K, V):
                            kv_f[i, j] = ds_f[i, j] * h_s[i, j] * el
                        T.reduce_sum(kv_f, vk_f, dim=1, batch=_BATCH["kv_rows"])
                        T.copy(vk_f, z_s[2 * BT : 2 * BT + K])

                    # the products that need only the chunk's inputs: Q K^T, K K^T, K S, K dS'; then the grams
                    # P = scale Tril(Q K^T o Gam), B = K K^T o Gam, M = StrictLower(B), and W = V - eG o (K S)
                    mm(q_s, k_s, qk_f, transpose_B=True, clear_accum=True)
                    mm(k_s, k_s, kk_f, transpose_B=True, clear_accum=True)
                    mm(k_s, h_s, a_f, clear_accum=True)
                    mm(k_s, ds_s, c_f, clear_accum=True)
                    mm_wait()
                    for i, j in T.Parallel(BT, BT):
                        gam_f[i, j] = T.if_then_else(i >= j, T.exp(g_s[i] - g_s[j]), 0)
                        qk_f[i, j] = qk_f[i, j] * gam_f[i, j] * scale
                        kk_f[i, j] = kk_f[i, j] * gam_f[i, j]
                    T.copy(qk_f, p_s)
                    for i, j in T.Parallel(BT, BT):
                        m_s[i, j] = T.if_then_else(i > j, kk_f[i, j], 0)
                    for i, j in T.Parallel(BT, V):
                        a_f[i, j] = vw_s[i, j] - eg_s[i] * a_f[i, j]
                    T.copy(a_f, vw_s)
                    # T = I - Ag M, U = Ag W
                    mm(ag_s, m_s, tt_f, clear_accum=True)
                    mm(ag_s, vw_s, b_f, clear_accum=True)
                    mm_wait()
                    for i, j in T.Parallel(BT, BT):
                        tt_f[i, j] = T.if_then_else(i == j, 1.0, 0.0) - tt_f[i, j]
                    T.copy(tt_f, t_s)
                    settle()  # (the step before stored dk from U's tile)
                    T.copy(b_f, u_s)
                    # dU = eR o (K dS') + P^T dO
                    for i, j in T.Parallel(BT, V):
                        c_f[i, j] = c_f[i, j] * er_s[i]
                    mm(p_s, do_s, c_f, transpose_A=True)
                    mm_wait()
                    T.copy(c_f, du_s)
                    # dAg = dU W^T; dv = Ag^T dU; dP = Tril(dO U^T)
                    mm(du_s, vw_s, x_f, transpose_B=True, clear_accum=True)
                    mm(ag_s, du_s, b_f, transpose_A=True, clear_accum=True)
                    mm(do_s, u_s, dp_f, transpose_B=True, clear_accum=True)
                    mm_wait()
                    if prefetch and i_r + 1 < nt:  # Ag's last read: the next chunk's, by TMA
                        T.sync_threads()
                        T.fence_proxy_async()
                        T.tma_copy(ag[t0 - BT : t0, i_h, :], ag_s, barrier=bar)
                    if "no_store" not in lab:  # staged in W's tile (read by nothing after dAg until Og)
                        T.copy(b_f, vw_s)
                        store_rows(vw_s, dv, t0, eos, i_h)
                    for i, j in T.Parallel(BT, V):  # Wn = -eG o dv (dU is read by nothing after dAg and dv)
                        du_s[i, j] = -eg_s[i] * b_f[i, j]
                    # the gate's terms of P, then scale dP o Gam
                    for i, j in T.Parallel(BT, BT):
                        dp_f[i, j] = T.if_then_else(i >= j, dp_f[i, j], 0)
                        qk_f[i, j] = dp_f[i, j] * qk_f[i, j]
                        dp_f[i, j] = dp_f[i, j] * gam_f[i, j] * scale
                    T.copy(dp_f, p_s)  # (dP o P stays in qk_f until dB o B joins it)
                    # dT = dAg diag(beta); dbeta's colsum(dAg o T)
                    for i, j in T.Parallel(BT, BT):
                        m_s[i, j] = x_f[i, j] * b_s[j]
                        x_f[i, j] = x_f[i, j] * tt_f[i, j]
                    if "no_reduce" not in lab:
                        T.reduce_sum(x_f, col_f, dim=0, batch=_BATCH["cc_cols"])
                        T.copy(col_f, b1_s)
                    # dA = -StrictLower(T^T dT T^T), dB = diag(beta) dA
                    mm(t_s, m_s, da_f, transpose_A=True, clear_accum=True)
                    mm_wait()
                    T.copy(da_f, x_s)
                    mm(x_s, t_s, da_f, transpose_B=True, clear_accum=True)
                    mm_wait()
                    for i, j in T.Parallel(BT, BT):
                        da_f[i, j] = T.if_then_else(i > j, -da_f[i, j], 0)
                        tt_f[i, j] = da_f[i, j] * kk_f[i, j]
                    if "no_reduce" not in lab:
                        T.reduce_sum(tt_f, row_f, dim=1, batch=_BATCH["cc_rows"])
                        T.copy(row_f, b2_s)
                    for i, j in T.Parallel(BT, BT):
                        qk_f[i, j] = qk_f[i, j] + tt_f[i, j] * b_s[i]  # dP o P + dB o B: one row and one column sum
                        da_f[i, j] = da_f[i, j] * b_s[i] * gam_f[i, j]
                    if "no_reduce" not in lab:
                        T.reduce_sum(qk_f, row_f, dim=1, batch=_BATCH["cc_rows"])
                        T.copy(row_f, r1_s)
                        T.reduce_sum(qk_f, col_f, dim=0, batch=_BATCH["cc_cols"])
                        T.copy(col_f, c1_s)
                    T.copy(da_f, x_s)
                    for i, j in T.Parallel(BT, BT):
                        da_f[i, j] = da_f[i, j] + x_s[j, i]
                    T.copy(da_f, m_s)
                    # Og = scale eG o dO (into v's tile: W is read by nothing after dAg)
                    settle()  # (dv left from W's tile)
                    for i, j in T.Parallel(BT, V):
                        vw_s[i, j] = do_s[i, j] * eg_s[i] * scale
                    # dq = Og S^T + (scale dP o Gam) K
                    mm(vw_s, h_s, c_f, transpose_B=True, clear_accum=True)
                    mm_wait()
                    for i, j in T.Parallel(BT, K):
                        a_f[i, j] = q_s[i, j] * c_f[i, j]  # (its row sum waits for K o Wn S^T)
                    mm(p_s, k_s, c_f)
                    mm_wait()
                    if "no_store" not in lab:  # staged in dO's tile (read by nothing after Og)
                        T.copy(c_f, do_s)
                        store_rows(do_s, dq, t0, eos, i_h)
                    # dk = Wn S^T + eR o (U dS'^T) + (scale dP o Gam)^T Q + (dB o Gam + (.)^T) K
                    mm(du_s, h_s, c_f, transpose_B=True, clear_accum=True)
                    mm(u_s, ds_s, b_f, transpose_B=True, clear_accum=True)
                    mm_wait()
                    if prefetch and i_r + 1 < nt:  # the state's last read: the next chunk's entering state
                        T.sync_threads()
                        T.fence_proxy_async()
                        T.tma_copy(h[ic - 1, i_h, :, :], h_s, barrier=bar)
                    for i, j in T.Parallel(BT, K):
                        a_f[i, j] = a_f[i, j] + k_s[i, j] * c_f[i, j]
                    if "no_reduce" not in lab:
                        T.reduce_sum(a_f, rowk_f, dim=1, batch=_BATCH["ck_rows"])
                        T.copy(rowk_f, r3_s)
                    for i, j in T.Parallel(BT, K):
                        b_f[i, j] = b_f[i, j] * er_s[i]
                        a_f[i, j] = k_s[i, j] * b_f[i, j]
                        c_f[i, j] = c_f[i, j] + b_f[i, j]
                    if "no_reduce" not in lab:
                        T.reduce_sum(a_f, rowk_f, dim=1, batch=_BATCH["ck_rows"])
                        T.copy(rowk_f, z_s[BT : 2 * BT])
                    mm(p_s, q_s, c_f, transpose_A=True)
                    mm(m_s, k_s, c_f)
                    mm_wait()
                    if "no_store" not in lab:  # staged in U's tile (read by nothing after eR o U dS'^T)
                        T.copy(c_f, u_s)
                        store_rows(u_s, dk, t0, eos, i_h)
                    if prefetch and i_r + 1 < nt:  # once dq's store has read dO's tile: the next chunk's dO
                        if async_store:
                            T.tma_store_wait(1)  # (dk's may stay in flight)
                        T.sync_threads()
                        T.fence_proxy_async()
                        T.tma_copy(do[t0 - BT : t0, i_h, :], do_s, barrier=bar)
                        T.sync_threads()
                        T.barrier_arrive(bar)  # (after the last of the step's three issues)
                    # dS = eL dS' + Q^T Og + K^T Wn
                    for i, j in T.Parallel(K, V):
                        ds_f[i, j] = ds_f[i, j] * el
                    mm(q_s, vw_s, ds_f, transpose_A=True)
                    mm(k_s, du_s, ds_f, transpose_A=True)
                    mm_wait()
                    if prefetch_qkv and i_r + 1 < nt:  # q, k, v's last reads: the next chunk's
                        T.sync_threads()
                        T.fence_proxy_async()
                        T.tma_copy(q[t0 - BT : t0, i_hk, :], q_s, barrier=bar_qkv)
                        T.tma_copy(k[t0 - BT : t0, i_hk, :], k_s, barrier=bar_qkv)
                        T.tma_copy(v[t0 - BT : t0, i_h, :], vw_s, barrier=bar_qkv)
                        T.sync_threads()
                        T.barrier_arrive(bar_qkv)
                    # dG per row and its reverse cumsum (dg): one warp's reverse scan of [dG, r5, eL (S o dS') row
                    # sums], whose first BT entries are dG's suffix sums plus the last row's extra terms; then dbeta
                    if "no_dg" not in lab:
                        for r in T.Parallel(BT):
                            z_s[r] = r1_s[r] - c1_s[r] + r3_s[r] - z_s[BT + r]
                        T.cumsum(z_s, dim=0, reverse=True)
                    for r in T.Parallel(BT):
                        if t0 + r < eos:
                            if "no_dg" not in lab:
                                dg[t0 + r, i_h] = T.if_then_else(T.cast(graw[t0 + r, i_h], fp32) < floor, 0, z_s[r])
                            dbeta[t0 + r, i_h] = b1_s[r] + b2_s[r]

                settle()
                if fin[i_s] >= 0:
                    T.copy(ds_f, dh0[fin[i_s], i_h, 0:K, 0:V])

        return reverse_bwd

    return build()


def reverse_bwd_tilelang(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, gs: Tensor, beta: Tensor, ag: Tensor, h: Tensor, do: Tensor, *,
    scale: float, cu: Tensor, chunk_offsets: Tensor, ends: Tensor, final_idx: Tensor, num_seqs: int,
    lab: frozenset[str] = frozenset(),
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk per value head, dv, dg, dbeta, dh0) of GDN by one reverse walk per (range, value head) (module
    docstring). q, k `[B, T, Hk, K]`, v, do `[B, T, H, V]`, g (raw) and beta `[B, T, H]`, gs the in-chunk cumsum of
    the floored gate `[B, T, H]` fp32, ag the forward's Ag `[B, T, H, 64]`, h the chunk states `[NT, H, K, V]`;
    the ranges: token bounds cu `[NS + 1]` int32 over the flattened B * T tokens (chunk-aligned except at a sequence's
    end), their first chunk's index into h `chunk_offsets` `[NS]`, the fp32 gradient at each range's end `ends`
    `[NS, H, K, V]`, and final_idx `[NS]` (range n stores its entering gradient in dh0[final_idx[n]] when >= 0).
    dq and dk come per value head (grouped heads sum them after). Raises ValueError where `reverse_bwd_refusal`
    gives a reason. `lab`: `LAB_SWITCHES` keys, for timing only (the gradients are then wrong)."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BT = ag.shape[-1]
    why = tilelang_refusal_cached(_WHAT, K, V, BT, k.device)  # (once per device: this runs on every step)
    if why is not None:
        raise ValueError(why)
    build = (H, Hk, K, V, BT, float(scale), TL_DTYPES[k.dtype], TL_DTYPES[g.dtype], TL_DTYPES[beta.dtype],
             frozenset(lab))  # fmt: skip
    # (in `compile_ahead`'s dry run the walk builds beside the Triton compiles and does not launch)
    kern = None if build_beside(("reverse_bwd", *build), _build, *build) else _build(*build)
    flat = [x.reshape(B * T, *x.shape[2:]).contiguous() for x in (q, k, v, do, ag, gs, g, beta)]
    dq, dk = per_value_head(q, H), per_value_head(k, H)
    dv = torch.empty_like(v)
    dg, dbeta = (torch.empty(B, T, H, dtype=torch.float32, device=k.device) for _ in range(2))  # every row is written
    dh0 = torch.zeros(num_seqs, H, K, V, dtype=torch.float32, device=k.device)  # (a sequence without a range keeps 0)
    outs = [x.view(B * T, *x.shape[2:]) for x in (dq, dk, dv, dg, dbeta)]
    if kern is not None:
        kern(*flat, h.contiguous(), ends.contiguous(), cu.int(), chunk_offsets.int(), final_idx.int(), *outs, dh0)
    return dq, dk, dv, dg, dbeta, dh0


def chunk_gdn_bwd_reverse(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, ag: Tensor, gs: Tensor,
    kept: Mapping[str, Tensor] | None, lazy: LazyFactors, index: ChunkIndex, scale: float,
    initial_state: Tensor | None, dht: Tensor | None, launch: LaunchPlan, split_chunks: int | None,
    warm_report: dict[str, Tensor] | None, seg_states: Mapping[str, Any] | None,
    qk_sums: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """GDN's backward under the reverse walk (`kernels.ops.gdn.ag_bwd`: `bwd_grads="reverse"`, or "auto" for a long
    step): the chunk states and each range's end gradient as the reverse state pass makes them
    (`kernels.common.chunk_bwd.reverse_ends`, split like the forward; the states kept under "ag+states" (`kept`), else
    recomputed in the Ag form; w, u, aqk formed by `lazy` only where the warm windows read them; the windows' bound
    sums from the forward's q, k side `qk_sums` where it kept them, `kernels.common.warm_bwd.RevWarmInputs.qk_sums`),
    then one TileLang walk per (range, value head) forming every gradient (`reverse_bwd_tilelang`) from the forward's
    Ag and gate cumsum gs, on the walk's `kernel` (`REVERSE_KERNELS`). Returns (dq, dk, dv, dg, dbeta, dh0) as
    `kernels.common.chunk_bwd.chunk_bwd`."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[-1]
    h, _, layout, ends = reverse_ends(
        q, k, None, None, gs, None, do, index=index, gate_vector=False, scale=scale,
        h0=initial_state.float().contiguous() if initial_state is not None else None,
        dht=dht.float().contiguous() if dht is not None else None, launch=launch, split_chunks=split_chunks,
        states=True, kept=kept, seg_states=seg_states or None,
        warm=rev_warm(launch, "gdn", q, k, v, g, beta, warm_report, qk_sums=qk_sums), lazy=lazy,
    )  # fmt: skip
    assert h is not None
    N, NS, dev = index.num_seqs, layout.num_seqs, k.device
    NT = cdiv(T, index.chunk_size)
    cu = layout.cu_seqlens if layout.cu_seqlens is not None else torch.arange(0, (N + 1) * T, T, device=dev)
    co = layout.chunk_offsets if layout.chunk_offsets is not None else torch.arange(0, N * NT, NT, device=dev)
    fin = layout.final_idx if layout.final_idx is not None else torch.arange(NS, device=dev)
    if ends is None:
        ends = torch.zeros(NS, H, K, V, dtype=torch.float32, device=dev)
    dq, dk, dv, dg, dbeta, dh0 = reverse_bwd_tilelang(
        q, k, v, g, gs, beta, ag, h, do, scale=scale, cu=cu, chunk_offsets=co[:NS], ends=ends,  # (offsets: [NS + 1])
        final_idx=fin, num_seqs=N,
    )  # fmt: skip
    dq = group_sum(dq, Hk)
    dk = group_sum(dk, Hk)
    return dq, dk, dv, dg.to(g.dtype), dbeta.to(beta.dtype), dh0 if initial_state is not None else None
