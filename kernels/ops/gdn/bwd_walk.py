"""GDN's backward reverse walk, warp-specialised (TileLang, Hopper): the products of `kernels.ops.gdn.reverse_bwd`'s
walk (the same per-chunk math, its module docstring; the same CPU mirror `kernels.common.reverse_bwd_torch`), split
over four warpgroups that run side by side instead of two that do every product in turn.

One program of 512 threads per (range, value head), walking the range's chunks last to first. Roles:

- S (threads 0-127) holds dS `[K, V]` fp32 in registers: forms Og = scale eG o dO, the decay's term eL <S, dS'>, and
  dS = eL dS' + Q^T Og + K^T Wn, then its bf16 copy for the next step; stores dh0.
- D (128-255), the chain dS' feeds: dU = eR o (K dS') + P^T dO, dv = Ag^T dU (stored), Wn = -eG o dv; then
  dk = eR o (U dS'^T) + Wn S^T + (scale dP o Gam)^T Q + (dB o Gam + (.)^T) K (stored) and its row sums of K o (.).
- A (256-383), the chunk's square side: P, B, M, W = V - eG o (K S), T = I - Ag M, U = Ag W, dP = Tril(dO U^T),
  dAg = dU W^T, dA = -StrictLower(T^T dT T^T), the symmetric dB o Gam term, dq = Og S^T + (scale dP o Gam) K
  (stored), and the row and column sums of dP o P + dB o B, dAg o T, dA o B, Q o Og S^T.
- The producer (384-511): one warp loads q, k, the gate cumsum and beta, one v and Ag, one dO and the state, each
  into its tile as soon as every role has read that tile's last chunk (TMA; a range's partial last chunk, the walk's
  first, row by row with zeros past the range); the fourth forms dG from the roles' sums, its reverse in-chunk
  cumsum, and writes dg and dbeta.

Each tile has a "full" barrier (its writer arrived: the loading warp with TMA's bytes, or a role after its fence) and
a "free" one (every reader arrived after its last read); a writer waits for the previous step's "free" before
writing again, so a role runs ahead while the others finish. dq, dk, dv go from registers to global memory (masked
below a range's end), which leaves shared memory to the operands (about 226 KB: one program per SM).
Sizes and refusals as the walk it replaces (`kernels.ops.gdn.tilelang_hopper`).
"""

import functools
from typing import Any

from kernels.common.decay import GATE_FLOOR

__all__ = ["BWD_WALK_NREG"]

_THREADS = 512
# Registers per thread of each role (`T.set_max_nreg`; multiples of 8, the four summing to at most 512): S holds
# dS (128 a thread), A up to four [64, 64] fp32 tiles at once, D one [64, 128] accumulator at a time. ptxas (sm_90a,
# session 26) spills 780 bytes a thread at these counts, 464 of them in the producer's row-by-row load of a partial
# chunk (once per range); S below 160 spills 2 KB
BWD_WALK_NREG = {"s": 160, "d": 128, "a": 184, "producer": 40}


@functools.cache
def _build(H: int, Hk: int, scale: float, io: str, gdt: str, bdt: str) -> Any:
    """The compiled kernel for these heads, scale and dtypes (TileLang JIT, cached on disk by TileLang too)."""
    import tilelang
    import tilelang.language as T

    K = V = 128
    BT = 64
    G = H // Hk
    fp32 = "float32"
    nreg = BWD_WALK_NREG
    floor = float(GATE_FLOOR)
    ntok, nchunk, nseg, nseq = T.dynamic("ntok"), T.dynamic("nchunk"), T.dynamic("nseg"), T.dynamic("nseq")

    @tilelang.jit(
        target={"kind": "cuda", "arch": "sm_90a"},
        pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True},
    )
    def build() -> Any:
        # each role's loop is a macro (nesting roles, loops and branches in one function passes Python's limit of
        # statically nested blocks); `b` holds the barriers by name, `t` the shared tiles
        @T.macro
        def wait_prev(bar, i):  # fmt: skip
            """Wait for the previous step's phase of a "free" barrier (none before the first step)."""
            if i > 0:
                T.barrier_wait(bar, (i + 1) % 2)

        @T.macro
        def role_s(ds_f, red_f, sd_f, ends, dh0, fin, q_s, k_s, do_s, h_s, g_s, ds_s, og_s, wn_s, sd_s, b, i_s, i_h, nt):  # fmt: skip
            T.copy(ends[i_s, i_h, 0:K, 0:V], ds_f)
            T.copy(ds_f, ds_s)
            T.fence_proxy_async()
            T.barrier_arrive(b["ds_full"])
            for i in T.serial(nt):
                T.barrier_wait(b["qk_full"], i % 2)
                T.barrier_wait(b["do_full"], i % 2)
                wait_prev(b["og_free"], i)  # (A's Og S^T of the step before)
                for r, c in T.Parallel(BT, V):
                    og_s[r, c] = do_s[r, c] * T.exp(g_s[r]) * scale
                T.fence_proxy_async()
                T.barrier_arrive(b["og_full"])
                T.barrier_arrive(b["do_free"])
                # eL <S, dS'>: each thread sums its own elements of dS' (the [K, V] accumulator layout of one
                # warpgroup: row i, column j live in warp (i % 64) // 16, lane i % 8 * 4 + j % 8 // 2), each warp
                # sums its lanes' (no exchange between warps), and the finishing warp adds the four
                T.barrier_wait(b["h_full"], i % 2)
                T.clear(red_f)
                for r, c in T.Parallel(K, V):
                    red_f[r % 64 // 16, (r % 8 * 4 + c % 8 // 2) * 2 + c % 2] += ds_f[r, c] * h_s[r, c]
                T.barrier_arrive(b["h_free"])
                T.reduce_sum(red_f, sd_f, dim=1, clear=True)
                wait_prev(b["sum_free"], i)
                for w in T.Parallel(4):
                    sd_s[w] = sd_f[w] * T.exp(g_s[BT - 1])
                for r, c in T.Parallel(K, V):
                    ds_f[r, c] = ds_f[r, c] * T.exp(g_s[BT - 1])
                T.gemm(q_s, og_s, ds_f, transpose_A=True)
                T.barrier_wait(b["wn_full"], i % 2)
                T.gemm(k_s, wn_s, ds_f, transpose_A=True)
                T.barrier_arrive(b["wn_free"])
                T.barrier_arrive(b["qk_free"])
                T.barrier_arrive(b["sum_full"])
                T.barrier_wait(b["ds_free"], i % 2)  # (D's reads of this step's dS')
                T.copy(ds_f, ds_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["ds_full"])
            if fin[i_s] >= 0:
                T.copy(ds_f, dh0[fin[i_s], i_h, 0:K, 0:V])

        @T.macro
        def role_d(c_f, y_f, row_f, dv, dk, q_s, k_s, do_s, ag_s, h_s, g_s, ds_s, p_s, u_s, du_s, wn_s, sym_s, z_s, dgd_s, b, bos, eos, i_h, nt):  # fmt: skip
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                T.barrier_wait(b["qk_full"], i % 2)
                T.barrier_wait(b["ds_full"], i % 2)
                # dU = eR o (K dS') + P^T dO
                T.gemm(k_s, ds_s, c_f, clear_accum=True)
                for r, c in T.Parallel(BT, V):
                    c_f[r, c] = c_f[r, c] * T.exp(g_s[BT - 1] - g_s[r])
                T.barrier_wait(b["p_full"], i % 2)
                T.barrier_wait(b["do_full"], i % 2)
                T.gemm(p_s, do_s, c_f, transpose_A=True)
                T.barrier_arrive(b["p_free"])
                T.barrier_arrive(b["do_free"])
                wait_prev(b["du_free"], i)  # (A's dAg of the step before)
                T.copy(c_f, du_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["du_full"])
                # dv = Ag^T dU, stored; Wn = -eG o dv
                T.barrier_wait(b["va_full"], i % 2)
                T.gemm(ag_s, du_s, c_f, transpose_A=True, clear_accum=True)
                T.barrier_arrive(b["va_free"])
                for r, c in T.Parallel(BT, V):
                    if t0 + r < eos:
                        dv[t0 + r, i_h, c] = c_f[r, c]
                wait_prev(b["wn_free"], i)  # (S's K^T Wn of the step before)
                for r, c in T.Parallel(BT, V):
                    wn_s[r, c] = -T.exp(g_s[r]) * c_f[r, c]
                T.fence_proxy_async()
                T.barrier_arrive(b["wn_full"])
                # dk = eR o (U dS'^T) + Wn S^T + (scale dP o Gam)^T Q + (dB o Gam + (.)^T) K; the row sums of K o (.)
                # after its first term (r5) and after its second (r5 + r3's K part): dgD = r3's K part - r5
                T.barrier_wait(b["u_full"], i % 2)
                T.gemm(u_s, ds_s, y_f, transpose_B=True, clear_accum=True)
                T.barrier_arrive(b["u_free"])
                T.barrier_arrive(b["ds_free"])
                for r, c in T.Parallel(BT, K):
                    y_f[r, c] = y_f[r, c] * T.exp(g_s[BT - 1] - g_s[r])
                    c_f[r, c] = k_s[r, c] * y_f[r, c]
                T.reduce_sum(c_f, row_f, dim=1)
                wait_prev(b["sum_free"], i)
                T.copy(row_f, z_s[BT : 2 * BT])
                T.barrier_wait(b["h_full"], i % 2)
                T.gemm(wn_s, h_s, y_f, transpose_B=True)
                T.barrier_arrive(b["h_free"])
                for r, c in T.Parallel(BT, K):
                    c_f[r, c] = k_s[r, c] * y_f[r, c]
                T.reduce_sum(c_f, row_f, dim=1)
                for r in T.Parallel(BT):
                    dgd_s[r] = row_f[r] - 2.0 * z_s[BT + r]
                T.barrier_wait(b["dps_full"], i % 2)
                T.gemm(p_s, q_s, y_f, transpose_A=True)
                T.barrier_arrive(b["dps_free"])
                T.barrier_wait(b["sym_full"], i % 2)
                T.gemm(sym_s, k_s, y_f)
                T.barrier_arrive(b["sym_free"])
                T.barrier_arrive(b["qk_free"])
                T.barrier_arrive(b["sum_full"])
                for r, c in T.Parallel(BT, K):
                    if t0 + r < eos:
                        dk[t0 + r, i_h, c] = y_f[r, c]

        @T.macro
        def col_sums(x_f, tt_f, t2_s, row_f, out_f):  # fmt: skip
            """out_f = the column sums of x_f [BT, BT] fp32 (destroyed), in A's row layout: the row sums of x's
            transpose read back from t2's tile, once for bf16(x) and once for x - bf16(x) (fp32-accurate)."""
            T.copy(x_f, t2_s)
            for r, c in T.Parallel(BT, BT):
                tt_f[r, c] = t2_s[c, r]
                x_f[r, c] = x_f[r, c] - T.cast(T.cast(x_f[r, c], io), fp32)
            T.reduce_sum(tt_f, out_f, dim=1)
            T.copy(x_f, t2_s)
            for r, c in T.Parallel(BT, BT):
                tt_f[r, c] = t2_s[c, r]
            T.reduce_sum(tt_f, row_f, dim=1)
            for r in T.Parallel(BT):
                out_f[r] = out_f[r] + row_f[r]

        @T.macro
        def role_a(qk_f, kk_f, tt_f, x_f, da_f, w_f, y_f, row_f, ra_f, rb_f, rc_f, dq, q_s, k_s, v_s, do_s, ag_s, h_s, g_s, b_s, og_s, p_s, u_s, du_s, m_s, t2_s, z_s, dga_s, db_s, b, bos, eos, i_h, nt):  # fmt: skip
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                T.barrier_wait(b["qk_full"], i % 2)
                # P = scale Tril(Q K^T o Gam) (kept in fp32 for dP o P), B = K K^T o Gam, M = StrictLower(B)
                T.gemm(q_s, k_s, qk_f, transpose_B=True, clear_accum=True)
                T.gemm(k_s, k_s, kk_f, transpose_B=True, clear_accum=True)
                for r, c in T.Parallel(BT, BT):
                    qk_f[r, c] = T.if_then_else(r >= c, qk_f[r, c] * T.exp(g_s[r] - g_s[c]) * scale, 0)
                    kk_f[r, c] = T.if_then_else(r >= c, kk_f[r, c] * T.exp(g_s[r] - g_s[c]), 0)
                wait_prev(b["dps_free"], i)  # (D's read of the step before's scale dP o Gam in P's tile)
                T.copy(qk_f, p_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["p_full"])
                wait_prev(b["sym_free"], i)  # (D's read of the step before's symmetric term in M's tile)
                for r, c in T.Parallel(BT, BT):
                    m_s[r, c] = T.if_then_else(r > c, kk_f[r, c], 0)
                T.fence_proxy_async()
                # W = V - eG o (K S) (into v's tile), T = I - Ag M (into M's), U = Ag W
                T.barrier_wait(b["h_full"], i % 2)
                T.barrier_wait(b["va_full"], i % 2)
                T.gemm(k_s, h_s, w_f, clear_accum=True)
                for r, c in T.Parallel(BT, V):
                    w_f[r, c] = v_s[r, c] - T.exp(g_s[r]) * w_f[r, c]
                T.copy(w_f, v_s)
                T.fence_proxy_async()
                T.gemm(ag_s, m_s, tt_f, clear_accum=True)
                for r, c in T.Parallel(BT, BT):
                    tt_f[r, c] = T.if_then_else(r == c, 1.0, 0.0) - tt_f[r, c]
                T.copy(tt_f, m_s)
                T.fence_proxy_async()
                T.gemm(ag_s, v_s, w_f, clear_accum=True)
                wait_prev(b["u_free"], i)  # (D's U dS'^T of the step before)
                T.copy(w_f, u_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["u_full"])
                # dP = Tril(dO U^T): dP o P (kept for the row and column sums), scale dP o Gam (into P's tile once D
                # has read P)
                T.barrier_wait(b["do_full"], i % 2)
                T.gemm(do_s, u_s, x_f, transpose_B=True, clear_accum=True)
                T.barrier_arrive(b["do_free"])
                for r, c in T.Parallel(BT, BT):
                    x_f[r, c] = T.if_then_else(r >= c, x_f[r, c], 0)
                    qk_f[r, c] = x_f[r, c] * qk_f[r, c]
                    x_f[r, c] = x_f[r, c] * T.exp(g_s[r] - g_s[c]) * scale
                T.barrier_wait(b["p_free"], i % 2)
                T.copy(x_f, p_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["dps_full"])
                # dAg = dU W^T; dT = dAg diag(beta) (into t2's tile); colsum(dAg o T) (dbeta's first term)
                T.barrier_wait(b["du_full"], i % 2)
                T.gemm(du_s, v_s, da_f, transpose_B=True, clear_accum=True)
                T.barrier_arrive(b["du_free"])
                T.barrier_arrive(b["va_free"])
                for r, c in T.Parallel(BT, BT):
                    t2_s[r, c] = da_f[r, c] * b_s[c]
                    x_f[r, c] = da_f[r, c] * tt_f[r, c]  # (its column sums below)
                T.fence_proxy_async()
                # dA = -StrictLower(T^T dT T^T): T^T dT into t2's tile, then (.) T^T; rowsum(dA o B) (dbeta's second)
                T.gemm(m_s, t2_s, da_f, transpose_A=True, clear_accum=True)
                T.copy(da_f, t2_s)
                T.fence_proxy_async()
                T.gemm(t2_s, m_s, da_f, transpose_B=True, clear_accum=True)
                for r, c in T.Parallel(BT, BT):
                    da_f[r, c] = T.if_then_else(r > c, -da_f[r, c], 0)
                    tt_f[r, c] = da_f[r, c] * kk_f[r, c]
                T.reduce_sum(tt_f, row_f, dim=1)
                T.copy(row_f, rb_f)  # (dbeta's second term, added to its first below)
                # dP o P + dB o B: its row sums, and its column sums (into z's first half: the finishing warp
                # subtracts them), like colsum(dAg o T), as row sums of its transpose through t2's tile (a row of the
                # accumulator layout lives in one warp: no exchange between warps), in two bf16 passes, the value
                # and what bf16 left of it (their row sums cancel in dg's cumsum: one bf16 pass was off by 0.7)
                for r, c in T.Parallel(BT, BT):
                    qk_f[r, c] = qk_f[r, c] + tt_f[r, c] * b_s[r]
                    da_f[r, c] = da_f[r, c] * b_s[r] * T.exp(g_s[r] - g_s[c])
                T.reduce_sum(qk_f, row_f, dim=1)
                T.copy(row_f, ra_f)  # (added to rowsum(Q o Og S^T) below)
                col_sums(qk_f, tt_f, t2_s, row_f, rc_f)
                wait_prev(b["sum_free"], i)
                T.copy(rc_f, z_s[0:BT])
                col_sums(x_f, tt_f, t2_s, row_f, rc_f)
                for r in T.Parallel(BT):
                    db_s[r] = rc_f[r] + rb_f[r]
                # the symmetric dB o Gam + (.)^T into M's tile (T's last read was above), its transpose read from t2's
                T.copy(da_f, t2_s)
                for r, c in T.Parallel(BT, BT):
                    da_f[r, c] = da_f[r, c] + t2_s[c, r]
                T.copy(da_f, m_s)
                T.fence_proxy_async()
                T.barrier_arrive(b["sym_full"])
                # dq = Og S^T + (scale dP o Gam) K; rowsum(Q o Og S^T) (r3's Q part)
                T.barrier_wait(b["og_full"], i % 2)
                T.gemm(og_s, h_s, w_f, transpose_B=True, clear_accum=True)
                T.barrier_arrive(b["og_free"])
                T.barrier_arrive(b["h_free"])
                for r, c in T.Parallel(BT, K):
                    y_f[r, c] = q_s[r, c] * w_f[r, c]
                T.reduce_sum(y_f, row_f, dim=1)
                for r in T.Parallel(BT):
                    dga_s[r] = row_f[r] + ra_f[r]
                T.gemm(p_s, k_s, w_f)
                T.barrier_arrive(b["qk_free"])
                T.barrier_arrive(b["sum_full"])
                for r, c in T.Parallel(BT, K):
                    if t0 + r < eos:
                        dq[t0 + r, i_h, c] = w_f[r, c]

        @T.macro
        def load_qk(q, k, gs, beta, q_s, k_s, g_s, b_s, b, bos, eos, i_hk, i_h, nt):  # fmt: skip
            """q, k, the gate cumsum (rows past the range repeating its last: no decay there) and beta (0 past it)."""
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                wait_prev(b["qk_free"], i)
                if t0 + BT <= eos:
                    T.tma_copy(q[t0 : t0 + BT, i_hk, :], q_s, barrier=b["qk_full"])
                    T.tma_copy(k[t0 : t0 + BT, i_hk, :], k_s, barrier=b["qk_full"])
                else:  # the range's partial last chunk (the walk's first): zeros past the range
                    for r, c in T.Parallel(BT, K):
                        q_s[r, c] = T.if_then_else(t0 + r < eos, q[T.min(t0 + r, eos - 1), i_hk, c], 0)
                        k_s[r, c] = T.if_then_else(t0 + r < eos, k[T.min(t0 + r, eos - 1), i_hk, c], 0)
                    T.fence_proxy_async()
                for r in T.Parallel(BT):
                    g_s[r] = gs[T.min(t0 + r, eos - 1), i_h]
                    b_s[r] = T.if_then_else(t0 + r < eos, T.cast(beta[T.min(t0 + r, eos - 1), i_h], fp32), 0)
                T.barrier_arrive(b["qk_full"])

        @T.macro
        def load_va(v, ag, v_s, ag_s, b, bos, eos, i_h, nt):  # fmt: skip
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                wait_prev(b["va_free"], i)
                if t0 + BT <= eos:
                    T.tma_copy(v[t0 : t0 + BT, i_h, :], v_s, barrier=b["va_full"])
                    T.tma_copy(ag[t0 : t0 + BT, i_h, :], ag_s, barrier=b["va_full"])
                else:
                    for r, c in T.Parallel(BT, V):
                        v_s[r, c] = T.if_then_else(t0 + r < eos, v[T.min(t0 + r, eos - 1), i_h, c], 0)
                    for r, c in T.Parallel(BT, BT):
                        ag_s[r, c] = T.if_then_else(t0 + r < eos, ag[T.min(t0 + r, eos - 1), i_h, c], 0)
                    T.fence_proxy_async()
                T.barrier_arrive(b["va_full"])

        @T.macro
        def load_do_h(do, h, do_s, h_s, b, bos, eos, boc, i_h, nt):  # fmt: skip
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                wait_prev(b["do_free"], i)
                if t0 + BT <= eos:
                    T.tma_copy(do[t0 : t0 + BT, i_h, :], do_s, barrier=b["do_full"])
                else:
                    for r, c in T.Parallel(BT, V):
                        do_s[r, c] = T.if_then_else(t0 + r < eos, do[T.min(t0 + r, eos - 1), i_h, c], 0)
                    T.fence_proxy_async()
                T.barrier_arrive(b["do_full"])
                wait_prev(b["h_free"], i)
                T.tma_copy(h[boc + nt - 1 - i, i_h, :, :], h_s, barrier=b["h_full"])
                T.barrier_arrive(b["h_full"])

        @T.macro
        def finish_sums(dg, dbeta, graw, z_s, sd_s, dga_s, dgd_s, db_s, b, bos, eos, i_h, nt):  # fmt: skip
            """dG per row (the roles' sums), its reverse in-chunk cumsum over [dG, r5] plus eL <S, dS'> (dg; 0 where
            the raw gate is below the floor), and dbeta."""
            for i in T.serial(nt):
                t0 = bos + (nt - 1 - i) * BT
                T.barrier_wait(b["sum_full"], i % 2)
                for r in T.Parallel(BT):
                    z_s[r] = dga_s[r] - z_s[r] + dgd_s[r]
                T.cumsum(z_s, dim=0, reverse=True)
                for r in T.Parallel(BT):
                    if t0 + r < eos:
                        dg[t0 + r, i_h] = T.if_then_else(
                            T.cast(graw[t0 + r, i_h], fp32) < floor, 0, z_s[r] + sd_s[0] + sd_s[1] + sd_s[2] + sd_s[3]
                        )
                        dbeta[t0 + r, i_h] = db_s[r]
                T.barrier_arrive(b["sum_free"])

        @T.prim_func
        def bwd_walk(
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
                v_s = T.alloc_shared((BT, V), io)  # v, then W
                do_s = T.alloc_shared((BT, V), io)
                ag_s = T.alloc_shared((BT, BT), io)
                h_s = T.alloc_shared((K, V), io)
                ds_s = T.alloc_shared((K, V), io)  # dS' in bf16 (S writes it for the next step)
                og_s = T.alloc_shared((BT, V), io)
                u_s = T.alloc_shared((BT, V), io)
                du_s = T.alloc_shared((BT, V), io)
                wn_s = T.alloc_shared((BT, V), io)
                p_s = T.alloc_shared((BT, BT), io)  # P, then scale dP o Gam
                m_s = T.alloc_shared((BT, BT), io)  # M, then T, then dB o Gam + (.)^T
                t2_s = T.alloc_shared((BT, BT), io)  # dT, then T^T dT, then a transpose (A's own)
                g_s = T.alloc_shared((BT,), fp32)
                b_s = T.alloc_shared((BT,), fp32)
                # colsum(dP o P + dB o B), then dG per row; rowsum(K o eR o U dS'^T); their reverse cumsum
                z_s = T.alloc_shared((2 * BT,), fp32)
                dga_s = T.alloc_shared((BT,), fp32)  # rowsum(dP o P + dB o B + Q o Og S^T)
                dgd_s = T.alloc_shared((BT,), fp32)  # rowsum(K o Wn S^T) - rowsum(K o eR o U dS'^T)
                db_s = T.alloc_shared((BT,), fp32)  # dbeta: colsum(dAg o T) + rowsum(dA o B)
                sd_s = T.alloc_shared((4,), fp32)  # eL <S, dS'>, per warp of S
                T.annotate_layout({
                    x: tilelang.layout.make_swizzled_layout(x)
                    for x in (q_s, k_s, v_s, do_s, ag_s, h_s, ds_s, og_s, u_s, du_s, wn_s, p_s, m_s, t2_s)
                })  # fmt: skip

                ds_f = T.alloc_fragment((K, V), fp32)
                red_f = T.alloc_fragment((4, 64), fp32)
                sd_f = T.alloc_fragment((4,), fp32)
                c_f = T.alloc_fragment((BT, V), fp32)
                y_f = T.alloc_fragment((BT, K), fp32)
                drow_f = T.alloc_fragment((BT,), fp32)
                qk_f = T.alloc_fragment((BT, BT), fp32)
                kk_f = T.alloc_fragment((BT, BT), fp32)
                tt_f = T.alloc_fragment((BT, BT), fp32)
                x_f = T.alloc_fragment((BT, BT), fp32)
                da_f = T.alloc_fragment((BT, BT), fp32)
                w_f = T.alloc_fragment((BT, V), fp32)
                ay_f = T.alloc_fragment((BT, K), fp32)
                arow_f = T.alloc_fragment((BT,), fp32)
                ara_f = T.alloc_fragment((BT,), fp32)
                arb_f = T.alloc_fragment((BT,), fp32)
                arc_f = T.alloc_fragment((BT,), fp32)

                role = {"S": 128, "D": 128, "A": 128, "all": 384}
                b = {
                    "qk_full": T.alloc_barrier(arrive_count=32), "va_full": T.alloc_barrier(arrive_count=32),
                    "do_full": T.alloc_barrier(arrive_count=32), "h_full": T.alloc_barrier(arrive_count=32),
                    "qk_free": T.alloc_barrier(arrive_count=role["all"]),
                    "va_free": T.alloc_barrier(arrive_count=role["A"] + role["D"]),
                    "do_free": T.alloc_barrier(arrive_count=role["all"]),
                    "h_free": T.alloc_barrier(arrive_count=role["all"]),
                    "sum_full": T.alloc_barrier(arrive_count=role["all"]), "sum_free": T.alloc_barrier(arrive_count=32),
                }  # fmt: skip
                for name in ("ds", "og", "p", "dps", "u", "du", "wn", "sym"):
                    b[f"{name}_full"] = T.alloc_barrier(arrive_count=128)
                    b[f"{name}_free"] = T.alloc_barrier(arrive_count=128)

                tx = T.get_thread_binding()
                if tx < 128:
                    T.set_max_nreg(nreg["s"], int(nreg["s"] > 128))
                    role_s(ds_f, red_f, sd_f, ends, dh0, fin, q_s, k_s, do_s, h_s, g_s, ds_s, og_s, wn_s, sd_s, b,
                           i_s, i_h, nt)  # fmt: skip
                elif tx < 256:
                    T.set_max_nreg(nreg["d"], int(nreg["d"] > 128))
                    role_d(c_f, y_f, drow_f, dv, dk, q_s, k_s, do_s, ag_s, h_s, g_s, ds_s, p_s, u_s, du_s, wn_s, m_s,
                           z_s, dgd_s, b, bos, eos, i_h, nt)  # fmt: skip
                elif tx < 384:
                    T.set_max_nreg(nreg["a"], int(nreg["a"] > 128))
                    role_a(qk_f, kk_f, tt_f, x_f, da_f, w_f, ay_f, arow_f, ara_f, arb_f, arc_f, dq, q_s, k_s, v_s, do_s, ag_s, h_s,
                           g_s, b_s, og_s, p_s, u_s, du_s, m_s, t2_s, z_s, dga_s, db_s, b, bos, eos,
                           i_h, nt)  # fmt: skip
                else:
                    T.set_max_nreg(nreg["producer"], int(nreg["producer"] > 128))
                    if tx < 416:
                        load_qk(q, k, gs, beta, q_s, k_s, g_s, b_s, b, bos, eos, i_hk, i_h, nt)
                    elif tx < 448:
                        load_va(v, ag, v_s, ag_s, b, bos, eos, i_h, nt)
                    elif tx < 480:
                        load_do_h(do, h, do_s, h_s, b, bos, eos, boc, i_h, nt)
                    else:
                        finish_sums(dg, dbeta, graw, z_s, sd_s, dga_s, dgd_s, db_s, b, bos, eos, i_h,
                                    nt)  # fmt: skip

        return bwd_walk

    return build()
