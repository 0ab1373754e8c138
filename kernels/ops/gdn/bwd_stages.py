"""GDN's backward reverse walk in lockstep stages (TileLang, Hopper): the products of `kernels.ops.gdn.reverse_bwd`'s
walk (the same per-chunk math, its module docstring; the same CPU mirror `kernels.common.reverse_bwd_torch`), spread
over three consumer warpgroups that meet at 16 barriers a step, and a producer warpgroup (FlashQLA's schedule of its
fused backward, `kernels/NOTES.md` "Session 27"; our barriers, tiles and math). Opt-in, not yet run on a GPU:
`reverse_bwd_tilelang(kernel="stages")`.

One program of 512 threads per (range, value head), walking the range's chunks last to first. Each step the three
consumer roles pass the barriers 0..15 in order (every consumer thread arrives at each and waits for it), and between
two barriers each does its part of that stage:

| stage | S (dS in registers) | K (the dS' chain, dk) | A (the chunk's square side, dq) |
|---|---|---|---|
| 0 | | | Q K^T, K K^T |
| 1 | dS *= eL | K dS' (x eR) | P = scale Q K^T o Gam (kept), M = StrictLower(K K^T o Gam) |
| 2 | | dU = (.) + P^T dO | T = I - Ag M (kept) |
| 3 | | dU into a tile | K S |
| 4 | | dv = Ag^T dU (stored) | K S into a tile; W = V - eG o K S into a tile |
| 5 | eL <S, dS'> (per warp) | Wn = -eG o dv; dG = rowsum(Wn o K S) | dAg = dU W^T; U = Ag W into dU's tile |
| 6 | | K into a tile (k's next load can start) | dP = dO U^T |
| 7 | | dk = eR o (U dS'^T) | dP o P (kept); scale dP o Gam; dT = dAg diag(beta); colsum(dAg o T) |
| 8 | | dG -= rowsum(K o dk); their sum | dq = dO S^T |
| 9 | | dk += Wn S^T | dq *= scale eG; dG += rowsum(Q o dq); Q into U's tile |
| 10 | | | dq += (scale dP o Gam) K (stored) |
| 11 | dS += K^T Wn | | X = T^T dT into Ag's tile |
| 12 | | dk += (scale dP o Gam)^T Q | dA = -StrictLower(X T^T); B again; dbeta, dG's sums; dB o Gam + (.)^T |
| 13 | Og = scale eG o dO into Wn's tile | | |
| 14 | dS += Q^T Og | | |
| 15 | dS' = dS into its tile | dk += (dB o Gam + (.)^T) K (stored) | |

The producer: one warp loads the next chunk's g (after stage 12, its last read), v (after 4), k (after 6), q (after 9)
and arrives at barrier 0 with TMA's bytes; one loads h (after 9), Ag and dO (after 13) and beta (after 14) and arrives
at barrier 2; one forms dG's reverse in-chunk cumsum after barrier 15 and writes dg (0 where the raw gate is below the
floor) and dbeta, arriving at barrier 5 once it has read them (the roles write those sums from stage 5 on). The range's
last chunk (the walk's first, possibly partial) is loaded row by row by every thread before the roles part, zeros past
the range. dq, dk, dv go from registers to global memory below the range's end. Shared memory about 210 KB (one
program per SM). Sizes and refusals as the walk it may replace (`kernels.ops.gdn.tilelang_hopper`).
"""

import functools
from typing import Any

from kernels.common.decay import GATE_FLOOR
from kernels.ops.gdn.tilelang_hopper import hopper_jit, masked_chunk_loads

__all__ = ["BWD_STAGES_NREG", "N_STAGES"]

_THREADS = 512
N_STAGES = 16  # barriers a step
# Registers per thread of each role (`T.set_max_nreg`; multiples of 8, the four summing to at most 512): S holds dS
# (128 a thread: below 160 it spills 1.9 KB); K two [64, 128] accumulators at stages 5 and 8; A a [64, 128] one and
# two [64, 64] ones. ptxas (sm_90a, the CPU host, session 27): 304 bytes a thread spilled at these counts, 476 at
# 160 / 152 / 176 / 24, 460 at FlashQLA's 160 / 144 / 184 / 24
BWD_STAGES_NREG = {"s": 160, "k": 160, "a": 168, "producer": 24}


@functools.cache
def _build(H: int, Hk: int, scale: float, io: str, gdt: str, bdt: str) -> Any:
    """The compiled kernel for these heads, scale and dtypes (TileLang JIT, cached on disk by TileLang too); its
    arguments are `reverse_bwd._build`'s kernel's."""
    import tilelang
    import tilelang.language as T

    K = V = 128
    BT = 64
    G = H // Hk
    fp32 = "float32"
    nreg = BWD_STAGES_NREG
    floor = float(GATE_FLOOR)
    consumers = 384
    ntok, nchunk, nseg, nseq = T.dynamic("ntok"), T.dynamic("nchunk"), T.dynamic("nseg"), T.dynamic("nseq")

    @hopper_jit()
    def build() -> Any:
        load_chunk = masked_chunk_loads(T, BT, K, V)

        @T.macro
        def sync(bars, s, i):  # fmt: skip
            """Stage s of step i: arrive at its barrier and wait for every participant."""
            T.barrier_arrive(bars[s])
            T.barrier_wait(bars[s], i % 2)

        def gam(g_s: Any, r: Any, c: Any) -> Any:
            """Gam_rc = e^(G_r - G_c) on and below the diagonal, 0 above (an expression)."""
            return T.if_then_else(r >= c, T.exp(g_s[r] - g_s[c]), 0)

        @T.macro
        def role_s(ds_f, red_f, sd_f, ends, dh0, fin, do_s, h_s, g_s, ds_s, s21, s22, s23, sd_s, bars, i_s, i_h, nt):  # fmt: skip
            """dS: scaled by eL, the decay's term eL <S, dS'>, += K^T Wn and Q^T Og; its bf16 copy for the next step."""
            T.copy(ends[i_s, i_h, 0:K, 0:V], ds_f)
            T.copy(ds_f, ds_s)
            T.fence_proxy_async()
            for i in T.serial(nt):
                sync(bars, 0, i)
                sync(bars, 1, i)
                for r, c in T.Parallel(K, V):
                    ds_f[r, c] = ds_f[r, c] * T.exp(g_s[BT - 1])
                sync(bars, 2, i)
                sync(bars, 3, i)
                sync(bars, 4, i)
                sync(bars, 5, i)
                # eL <S, dS'> (dS' scaled above): each thread sums its own elements into its row of red_f (a [K, V]
                # accumulator of one warpgroup: row r, column c live in thread r % 64 // 16 * 32 + r % 8 * 4 + c % 8
                # // 2), then one reduction over the role
                T.clear(red_f)
                for r, c in T.Parallel(K, V):
                    red_f[r % 64 // 16 * 32 + r % 8 * 4 + c % 8 // 2, c % 2] += ds_f[r, c] * h_s[r, c]
                T.reduce_sum(T.reshape(red_f, (256,)), sd_f, dim=0, clear=True)
                for w in T.Parallel(1):
                    sd_s[w] = sd_f[w]
                for s in (6, 7, 8, 9, 10, 11):
                    sync(bars, s, i)
                T.gemm(s22, s23, ds_f, transpose_A=True)  # K^T Wn
                sync(bars, 12, i)
                sync(bars, 13, i)
                for r, c in T.Parallel(BT, V):
                    s23[r, c] = do_s[r, c] * T.exp(g_s[r]) * scale  # Og (Wn's last reads were at 9 and 11)
                T.fence_proxy_async()
                sync(bars, 14, i)
                T.gemm(s21, s23, ds_f, transpose_A=True)  # Q^T Og
                sync(bars, 15, i)
                T.copy(ds_f, ds_s)
                T.fence_proxy_async()
            if fin[i_s] >= 0:
                T.copy(ds_f, dh0[fin[i_s], i_h, 0:K, 0:V])

        @T.macro
        def role_k(c_f, dk_f, rk_f, dv, dk, k_s, do_s, ag_s, h_s, g_s, ds_s, s11, s12, s21, s22, s23, dg_s, kr_s, bars, bos, eos, i_h, nt):  # fmt: skip
            """dU = eR o (K dS') + P^T dO, dv = Ag^T dU, Wn = -eG o dv; dk and the dG terms of K o (.)."""
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                sync(bars, 0, i)
                sync(bars, 1, i)
                T.gemm(k_s, ds_s, c_f, clear_accum=True)
                for r, c in T.Parallel(BT, V):
                    c_f[r, c] = c_f[r, c] * T.exp(g_s[BT - 1] - g_s[r])
                sync(bars, 2, i)
                T.gemm(s11, do_s, c_f, transpose_A=True)  # + P^T dO: dU
                sync(bars, 3, i)
                T.copy(c_f, s21)
                T.fence_proxy_async()
                sync(bars, 4, i)
                T.gemm(ag_s, s21, c_f, transpose_A=True, clear_accum=True)  # dv
                for r, c in T.Parallel(BT, V):
                    if t0 + r < eos:
                        dv[t0 + r, i_h, c] = c_f[r, c]
                sync(bars, 5, i)
                for r, c in T.Parallel(BT, V):
                    c_f[r, c] = -T.exp(g_s[r]) * c_f[r, c]  # Wn
                    dk_f[r, c] = c_f[r, c] * s23[r, c]  # Wn o K S (dk_f as scratch)
                T.reduce_sum(dk_f, rk_f, dim=1, clear=True)
                T.copy(rk_f, dg_s)  # dG's rows start from rowsum(K o Wn S^T) = rowsum(Wn o K S)
                T.copy(c_f, s23)
                T.fence_proxy_async()
                sync(bars, 6, i)
                T.copy(k_s, s22)  # (W's last reads were at 5)
                T.fence_proxy_async()
                sync(bars, 7, i)
                T.gemm(s21, ds_s, dk_f, transpose_B=True, clear_accum=True)  # U dS'^T
                for r, c in T.Parallel(BT, K):
                    dk_f[r, c] = dk_f[r, c] * T.exp(g_s[BT - 1] - g_s[r])
                sync(bars, 8, i)
                for r, c in T.Parallel(BT, K):
                    c_f[r, c] = s22[r, c] * dk_f[r, c]
                T.reduce_sum(c_f, rk_f, dim=1, clear=True)
                for r in T.Parallel(BT):
                    dg_s[r] = dg_s[r] - rk_f[r]
                    kr_s[r] = rk_f[r]  # (their sum joins the last row's dG: the finishing warp adds it)
                sync(bars, 9, i)
                T.gemm(s23, h_s, dk_f, transpose_B=True)  # + Wn S^T
                sync(bars, 10, i)
                sync(bars, 11, i)
                sync(bars, 12, i)
                T.gemm(s11, s21, dk_f, transpose_A=True)  # + (scale dP o Gam)^T Q
                sync(bars, 13, i)
                sync(bars, 14, i)
                sync(bars, 15, i)
                T.gemm(s12, s22, dk_f)  # + (dB o Gam + (.)^T) K
                for r, c in T.Parallel(BT, K):
                    if t0 + r < eos:
                        dk[t0 + r, i_h, c] = dk_f[r, c]

        @T.macro
        def col_sums(x_f, ct_f, f32_s, col_f):  # fmt: skip
            """col_f = the column sums of x_f [C, C] fp32: the row sums of its transpose read from an fp32 tile (a row
            of the accumulator layout lives in one warp: no exchange between warps)."""
            T.copy(x_f, f32_s)
            for r, c in T.Parallel(BT, BT):
                ct_f[r, c] = f32_s[c, r]
            T.reduce_sum(ct_f, col_f, dim=1, clear=True)

        @T.macro
        def role_a(qk_f, x_f, tt_f, dp_f, da_f, u_f, dq_f, row_f, col_f, qr_f, f32_s, dq, q_s, k_s, v_s, do_s, ag_s, h_s, g_s, b_s, s11, s12, s13, s21, s22, s23, dg_s, db_s, bars, bos, eos, i_h, nt):  # fmt: skip
            """P, M, T, K S, W, U, dAg, dP, dq, dA and the [C, C] sums (dbeta and dG's)."""
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                sync(bars, 0, i)
                T.gemm(q_s, k_s, qk_f, transpose_B=True, clear_accum=True)
                T.gemm(k_s, k_s, x_f, transpose_B=True, clear_accum=True)
                sync(bars, 1, i)
                for r, c in T.Parallel(BT, BT):
                    qk_f[r, c] = qk_f[r, c] * gam(g_s, r, c) * scale  # P
                    s13[r, c] = T.if_then_else(r > c, x_f[r, c] * gam(g_s, r, c), 0)  # M
                T.copy(qk_f, s11)
                T.fence_proxy_async()
                sync(bars, 2, i)
                T.gemm(ag_s, s13, tt_f, clear_accum=True)
                for r, c in T.Parallel(BT, BT):
                    tt_f[r, c] = T.if_then_else(r == c, 1.0, 0.0) - tt_f[r, c]  # T
                T.copy(tt_f, s12)
                T.fence_proxy_async()
                sync(bars, 3, i)
                T.gemm(k_s, h_s, u_f, clear_accum=True)  # K S
                sync(bars, 4, i)
                T.copy(u_f, s23)
                for r, c in T.Parallel(BT, V):
                    u_f[r, c] = v_s[r, c] - T.exp(g_s[r]) * u_f[r, c]  # W
                T.copy(u_f, s22)
                T.fence_proxy_async()
                sync(bars, 5, i)
                T.gemm(s21, s22, x_f, transpose_B=True, clear_accum=True)  # dAg = dU W^T
                T.gemm(ag_s, s22, u_f, clear_accum=True)  # U = Ag W
                T.copy(u_f, s21)  # (dU's last reads: K's dv at 4, dAg just above)
                T.fence_proxy_async()
                sync(bars, 6, i)
                T.gemm(do_s, s21, dp_f, transpose_B=True, clear_accum=True)  # dO U^T
                sync(bars, 7, i)
                for r, c in T.Parallel(BT, BT):
                    dp_f[r, c] = T.if_then_else(r >= c, dp_f[r, c], 0)  # dP
                    qk_f[r, c] = dp_f[r, c] * s11[r, c]  # dP o P (P read back in bf16, as FlashQLA does)
                    s11[r, c] = dp_f[r, c] * gam(g_s, r, c) * scale  # (P's last read: K's P^T dO at 2)
                    s13[r, c] = x_f[r, c] * b_s[c]  # dT = dAg diag(beta) (M's last read at 2)
                    x_f[r, c] = x_f[r, c] * s12[r, c]  # dAg o T (T in bf16, as FlashQLA's inverse)
                col_sums(x_f, dp_f, f32_s, col_f)  # (dp_f free: its last read just above)
                T.copy(col_f, db_s)  # dbeta's colsum(dAg o T)
                T.fence_proxy_async()
                sync(bars, 8, i)
                T.gemm(do_s, h_s, dq_f, transpose_B=True, clear_accum=True)  # dO S^T
                sync(bars, 9, i)
                for r, c in T.Parallel(BT, K):
                    dq_f[r, c] = dq_f[r, c] * T.exp(g_s[r]) * scale  # Og S^T
                    u_f[r, c] = q_s[r, c] * dq_f[r, c]
                T.reduce_sum(u_f, qr_f, dim=1, clear=True)
                for r in T.Parallel(BT):
                    dg_s[r] = dg_s[r] + qr_f[r]
                T.copy(q_s, s21)  # (U's last reads: K's U dS'^T at 7, dO U^T at 6)
                T.fence_proxy_async()
                sync(bars, 10, i)
                T.gemm(s11, s22, dq_f)  # + (scale dP o Gam) K
                for r, c in T.Parallel(BT, K):
                    if t0 + r < eos:
                        dq[t0 + r, i_h, c] = dq_f[r, c]
                sync(bars, 11, i)
                T.gemm(s12, s13, x_f, transpose_A=True, clear_accum=True)  # X = T^T dT
                T.copy(x_f, ag_s)  # (Ag's last reads at 5)
                T.fence_proxy_async()
                sync(bars, 12, i)
                T.gemm(ag_s, s12, da_f, transpose_B=True, clear_accum=True)  # X T^T
                T.gemm(s22, s22, x_f, transpose_B=True, clear_accum=True)  # K K^T again
                for r, c in T.Parallel(BT, BT):
                    da_f[r, c] = T.if_then_else(r > c, -da_f[r, c], 0)  # dA
                    x_f[r, c] = da_f[r, c] * x_f[r, c] * gam(g_s, r, c)  # dA o B
                T.reduce_sum(x_f, row_f, dim=1, clear=True)
                for r, c in T.Parallel(BT, BT):
                    qk_f[r, c] = qk_f[r, c] + x_f[r, c] * b_s[r]  # dP o P + dB o B
                    da_f[r, c] = da_f[r, c] * b_s[r] * gam(g_s, r, c)  # dB o Gam
                for r in T.Parallel(BT):
                    db_s[r] = db_s[r] + row_f[r]  # dbeta's rowsum(dA o B)
                T.reduce_sum(qk_f, row_f, dim=1, clear=True)
                col_sums(qk_f, dp_f, f32_s, col_f)
                for r in T.Parallel(BT):
                    dg_s[r] = dg_s[r] + row_f[r] - col_f[r]
                T.copy(da_f, s12)  # (T's last read just above)
                for r, c in T.Parallel(BT, BT):
                    da_f[r, c] = da_f[r, c] + s12[c, r]
                T.copy(da_f, s12)  # dB o Gam + (.)^T
                T.fence_proxy_async()
                sync(bars, 13, i)
                sync(bars, 14, i)
                sync(bars, 15, i)

        @T.macro
        def load_gvkq(gs, v, k, q, g_s, v_s, k_s, q_s, bars, bos, i_hk, i_h, nt):  # fmt: skip
            """The next chunk's g, v, k, q (full chunks: the range's last, the walk's first, was loaded before)."""
            for i in T.serial(nt - 1):
                t1 = bos + (nt - 2 - i) * BT
                sync(bars, 0, i)
                T.barrier_wait(bars[5], i % 2)  # (v's last read: W at 4)
                T.tma_copy(v[t1 : t1 + BT, i_h, :], v_s, barrier=bars[0])
                T.barrier_wait(bars[7], i % 2)  # (k's: its copy at 6)
                T.tma_copy(k[t1 : t1 + BT, i_hk, :], k_s, barrier=bars[0])
                T.barrier_wait(bars[10], i % 2)  # (q's: its copy at 9)
                T.tma_copy(q[t1 : t1 + BT, i_hk, :], q_s, barrier=bars[0])
                T.barrier_wait(bars[14], i % 2)  # (g's: Og at 13)
                for r in T.Parallel(BT):
                    g_s[r] = gs[t1 + r, i_h]
            if nt > 0:
                T.barrier_arrive(bars[0])

        @T.macro
        def load_hadb(h, ag, do, beta, h_s, ag_s, do_s, b_s, bars, bos, boc, i_h, nt):  # fmt: skip
            """The next chunk's state, Ag, dO and beta."""
            for i in T.serial(nt - 1):
                t1 = bos + (nt - 2 - i) * BT
                sync(bars, 2, i)
                T.barrier_wait(bars[10], i % 2)  # (the state's last read: Wn S^T at 9)
                T.tma_copy(h[boc + nt - 2 - i, i_h, :, :], h_s, barrier=bars[2])
                T.barrier_wait(bars[13], i % 2)  # (Ag's tile's: X T^T at 12)
                T.tma_copy(ag[t1 : t1 + BT, i_h, :], ag_s, barrier=bars[2])
                T.barrier_wait(bars[14], i % 2)  # (dO's: Og at 13)
                T.tma_copy(do[t1 : t1 + BT, i_h, :], do_s, barrier=bars[2])
                for r in T.Parallel(BT):
                    b_s[r] = T.cast(beta[t1 + r, i_h], fp32)
            if nt > 0:
                T.barrier_arrive(bars[2])

        @T.macro
        def finish(dg, dbeta, graw, dg_s, db_s, kr_s, sd_s, acc_l, bars, bos, eos, i_h, nt):  # fmt: skip
            """dG's reverse in-chunk cumsum, its last row with the chunk's sums (eL <S, dS'>, sum K o eR o U dS'^T),
            into dg (0 where the raw gate is below the floor), and dbeta; one thread, then its warp's stores."""
            tx = T.get_thread_binding()
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                sync(bars, 5, i)
                T.barrier_wait(bars[15], i % 2)
                if tx % 32 == 0:
                    acc_l[0] = sd_s[0]
                    for r in T.serial(BT):
                        acc_l[0] = acc_l[0] + kr_s[r]
                    for r in T.serial(BT):
                        acc_l[0] = acc_l[0] + dg_s[BT - 1 - r]
                        dg_s[BT - 1 - r] = acc_l[0]
                T.sync_warp()
                for r in T.serial(BT // 32):
                    if t0 + r * 32 + tx % 32 < eos:
                        dg[t0 + r * 32 + tx % 32, i_h] = T.if_then_else(
                            T.cast(graw[t0 + r * 32 + tx % 32, i_h], fp32) < floor, 0, dg_s[r * 32 + tx % 32]
                        )
                        dbeta[t0 + r * 32 + tx % 32, i_h] = db_s[r * 32 + tx % 32]

        @T.prim_func
        def bwd_stages(
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
                v_s = T.alloc_shared((BT, V), io)
                do_s = T.alloc_shared((BT, V), io)
                ag_s = T.alloc_shared((BT, BT), io)  # Ag, then X = T^T dT
                h_s = T.alloc_shared((K, V), io)
                ds_s = T.alloc_shared((K, V), io)  # dS' (S's copy for K's products)
                s11 = T.alloc_shared((BT, BT), io)  # P (scaled, gated), then scale dP o Gam
                s12 = T.alloc_shared((BT, BT), io)  # T, then dB o Gam + (.)^T
                s13 = T.alloc_shared((BT, BT), io)  # M, then dT
                s21 = T.alloc_shared((BT, V), io)  # dU, then U, then Q
                s22 = T.alloc_shared((BT, V), io)  # W, then K
                s23 = T.alloc_shared((BT, V), io)  # K S, then Wn, then Og
                g_s = T.alloc_shared((BT,), fp32)
                b_s = T.alloc_shared((BT,), fp32)
                dg_s = T.alloc_shared((BT,), fp32)  # dG per row
                db_s = T.alloc_shared((BT,), fp32)  # dbeta
                kr_s = T.alloc_shared((BT,), fp32)  # rowsum(K o eR o U dS'^T): its sum joins the last row
                sd_s = T.alloc_shared((1,), fp32)  # eL <S, dS'>
                f32_s = T.alloc_shared((BT, BT), fp32)  # A's column sums: a [C, C] tile read transposed
                T.annotate_layout({
                    x: tilelang.layout.make_swizzled_layout(x)
                    for x in (q_s, k_s, v_s, do_s, ag_s, h_s, ds_s, s11, s12, s13, s21, s22, s23)
                })  # fmt: skip

                ds_f = T.alloc_fragment((K, V), fp32)
                red_f = T.alloc_fragment((128, 2), fp32)
                sd_f = T.alloc_fragment((1,), fp32)
                c_f = T.alloc_fragment((BT, V), fp32)
                dk_f = T.alloc_fragment((BT, K), fp32)
                rk_f = T.alloc_fragment((BT,), fp32)
                qk_f = T.alloc_fragment((BT, BT), fp32)
                x_f = T.alloc_fragment((BT, BT), fp32)
                tt_f = T.alloc_fragment((BT, BT), fp32)
                dp_f = T.alloc_fragment((BT, BT), fp32)
                da_f = T.alloc_fragment((BT, BT), fp32)
                u_f = T.alloc_fragment((BT, V), fp32)
                dq_f = T.alloc_fragment((BT, K), fp32)
                row_f = T.alloc_fragment((BT,), fp32)
                col_f = T.alloc_fragment((BT,), fp32)
                qr_f = T.alloc_fragment((BT,), fp32)
                acc_l = T.alloc_local((1,), fp32)

                # stage barriers: every consumer thread; 0 also the warp loading g, v, k, q (and TMA's bytes), 2 the
                # one loading h, Ag, dO, beta (and TMA's bytes), 5 the finishing warp
                counts = [consumers] * N_STAGES
                counts[0] = counts[2] = counts[5] = consumers + 32
                bars = [T.alloc_barrier(arrive_count=n) for n in counts]

                # the range's last chunk (the walk's first, maybe partial): every thread, zeros past the range (its
                # gate repeating the last row's cumsum: no decay there)
                t0 = bos + (nt - 1) * BT
                if nt > 0:
                    load_chunk(q, k, v, do, ag, h, gs, beta, q_s, k_s, v_s, do_s, ag_s, h_s, g_s, b_s, t0, eos,
                               boc + nt - 1, i_hk, i_h)  # fmt: skip
                T.fence_proxy_async()
                T.sync_threads()

                tx = T.get_thread_binding()
                if tx < 128:
                    T.set_max_nreg(nreg["s"], 1)
                    role_s(ds_f, red_f, sd_f, ends, dh0, fin, do_s, h_s, g_s, ds_s, s21, s22, s23, sd_s, bars,
                           i_s, i_h, nt)  # fmt: skip
                elif tx < 256:
                    T.set_max_nreg(nreg["k"], 1)
                    role_k(c_f, dk_f, rk_f, dv, dk, k_s, do_s, ag_s, h_s, g_s, ds_s, s11, s12, s21, s22, s23,
                           dg_s, kr_s, bars, bos, eos, i_h, nt)  # fmt: skip
                elif tx < 384:
                    T.set_max_nreg(nreg["a"], 1)
                    role_a(qk_f, x_f, tt_f, dp_f, da_f, u_f, dq_f, row_f, col_f, qr_f, f32_s, dq, q_s, k_s, v_s, do_s, ag_s,
                           h_s, g_s, b_s, s11, s12, s13, s21, s22, s23, dg_s, db_s, bars, bos, eos, i_h,
                           nt)  # fmt: skip
                else:
                    T.set_max_nreg(nreg["producer"], 0)
                    if tx < 416:
                        load_gvkq(gs, v, k, q, g_s, v_s, k_s, q_s, bars, bos, i_hk, i_h, nt)
                    elif tx < 448:
                        load_hadb(h, ag, do, beta, h_s, ag_s, do_s, b_s, bars, bos, boc, i_h, nt)
                    elif tx < 480:
                        finish(dg, dbeta, graw, dg_s, db_s, kr_s, sd_s, acc_l, bars, bos, eos, i_h, nt)

        return bwd_stages

    return build()
