"""The second half of the planned chunk-parallel KDA backward as one TileLang kernel per (chunk, value head) on Hopper:
from the state products (`kernels.ops.kda.state_grads_hopper`: dAqk, dAg, dqg, dke, dkd and dG_C's state term) and
what the forward keeps under "ag" (T, qg, ke, kd), KDA's dq, dk, dg and dbeta (`kernels/NOTES.md`, "Session 30"). The
step calls it under `LaunchPlan(bwd_grads="tilelang")` and "auto" (`kernels.ops.kda.ag_bwd.tilelang_grads`; session 32,
the H200: 17.88 ms at 1x64K's size on one warpgroup, 9.25 on two, the default since; session 33, an H100: 8.81 on
two, 8.08 with the finish's inputs loaded a block ahead and the column sums from registers, the form since).
Its CPU mirror is `kernels.ops.kda.reverse_bwd_torch.products_finish`, the same math in torch.

Per chunk of C = 64 rows (G the in-chunk cumsum of the floored per-key gate, formed here from g as the Ag pass does):

    dA = -StrictLower(T^T (dAg diag(beta)) T^T)          two 64 x 64 x 64 bf16 products (as `wy_bwd`'s)
    X = scale dAqk (with the diagonal), Y = diag(beta) dA   each split into bf16 hi and lo parts
    per 16-row block I, its four decayed products at their size, transposed ([128 keys, 16 rows]; as
    `kernels.ops.kda.decay_products_hopper`): Rq = R(X, k) and RA = R(dA, k) on one operand k o e^(r_I - G),
    Cq = C(X, q) and Ck = C(Y, k) on q o e^(G - r_I) and k o e^(G - r_I), three products each (hi, lo: fp32
    accuracy); then the block's rows finished in the products' layout:
        dq = Rq + scale e^G o dqg      dk = Cq + beta RA + Ck + e^G o dke + e^(G_C - G) o dkd
        dG = q o Rq - k o Cq + beta k o RA - k o Ck + qg o dqg + ke o dke - kd o dkd,   rowsum(k o RA) for dbeta
    (dG in shared memory) dg = the reverse cumsum of dG down the chunk with dG_C (the state term + colsum(kd o dkd),
    summed from the finish's registers) on its last row, 0 where the gate is below the floor (a thread a key); dbeta =
    colsum(dAg o T) (by all threads, before the products) + rowsum(k o RA). A block's six finish inputs (dqg, dke, dkd,
    qg, ke, kd) load into registers at the block's start, under its operands and products.

Fast chunks (every key's span across every block below FAST_SPAN) take the blocks' midpoints as references; else the
products skip the diagonal blocks, which are summed elementwise (every exponent <= 0). Sizes: K = V = 128, chunk 64,
bf16 q, k, sm_90, TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; refused in one line otherwise. Dense
rows (chunk c at 64 c..); grouped heads read their q, k head (session 31: no expanded copies). ~224 KB of shared memory (one
program an SM), two warpgroups (`_THREADS`). Tested on the GPU against the mirror (tests/kernels/ops/kda/test_bwd_products_hopper.py).
"""

import functools
from typing import Any

import torch
from torch import Tensor

from kernels.common.decay import GATE_FLOOR
from kernels.ops.gdn.tilelang_hopper import (
    check_lab,
    chunk_span,
    clear_rows,
    hopper_jit,
    masked_load,
    stand_in,
    tilelang_refusal,
)
from kernels.ops.kda.decay_products_hopper import BLOCK, decay_macros
from kernels.parallel_compile import build_beside

__all__ = ["EXACT_SWITCHES", "PRODUCTS_LAB_SWITCHES", "build_key", "bwd_products_hopper", "bwd_products_refusal"]

_WHAT = "KDA backward products"  # how the refusals name this kernel
# two warpgroups (session 32, the H200: 9.25 ms at 1x64K's size against one warpgroup's 17.88; ncu: one warp a
# scheduler issued an instruction every 12 cycles, half of them waiting on global loads; four warpgroups took 9.84,
# instruction-cache misses and more instructions, `results/decay_products_lab_s32_h200.md`)
_THREADS = 256


def bwd_products_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


# Switches that leave a part out or swap it, only to time the rest (`benchmarks/decay_products_lab.py --finish-labs`);
# a build with one that leaves a part out gives wrong gradients (session 31: the kernel took 18.3 ms at 1x64K on the
# H100, ~18x its floor)
PRODUCTS_LAB_SWITCHES = {
    "sync_mma": "each of a product's three tensor-core products waited for at once (the form before session 31)",
    "no_operands": "no block operands formed (the products read whatever their tiles hold)",
    "no_products": "no decayed products (their fragments cleared instead)",
    "no_finish": "no block finish (dq, dk unwritten, dG zero)",
    # (exact: the kernel's outputs as the default's; their GPU tests check them, `EXACT_SWITCHES`)
    "wg1": "one warpgroup (128 threads), the form before session 32: exact",
    "wg4": "four warpgroups (512 threads): exact",
}


# the switches that change how, not what: a build with them gives the default's gradients (checked on the GPU)
EXACT_SWITCHES = frozenset({"sync_mma", "wg1", "wg4"})


@functools.cache
def _build(H: int, Hk: int, scale: float, varlen: bool = False, lab: frozenset[str] = frozenset(),
           bf16_out: bool = False, bf16_grads: bool = False, bf16_gate: bool = False) -> Any:  # fmt: skip
    """The compiled kernel for H value heads over Hk q, k heads (value head h reads q, k head h // (H / Hk)) and this
    scale (TileLang JIT, cached on disk by TileLang too); varlen: chunk i_c at the rows its (sequence, chunk) pair
    names (`cu`, `ci`), the rows past its sequence's end read as zeros and not written; else chunk c at rows 64 c.
    bf16_out: dq, dk written in bf16 (rounded once from fp32, as a cast after would), else fp32; bf16_grads: dqg,
    dke, dkd read in bf16 (`state_grads_hopper`'s grads_dtype), else fp32; bf16_gate: g read and dg written in bf16
    (the model's gate dtype: no fp32 copy of g before and no cast of dg after, session 33), else fp32."""
    import tilelang
    import tilelang.language as T

    check_lab(lab, PRODUCTS_LAB_SWITCHES)

    K = 128
    C = 64
    NB = C // BLOCK
    G = H // Hk
    fp32, io = "float32", "bfloat16"
    odt = io if bf16_out else fp32  # dq's and dk's
    gdt = io if bf16_grads else fp32  # dqg's, dke's, dkd's
    gat = io if bf16_gate else fp32  # g's and dg's
    nchunk, nseq = T.dynamic("nchunk"), T.dynamic("nseq")
    # the rows: any count under varlen; dense, 64 a chunk (then TileLang checks no row bound: the dense build's code
    # is the one before varlen came)
    ntok = T.dynamic("ntok") if varlen else nchunk * C
    floor = float(GATE_FLOOR)

    @hopper_jit()
    def build() -> Any:
        mac = decay_macros(T, sync_mma="sync_mma" in lab, lab=lab)
        span, clear = chunk_span(T, C, varlen), clear_rows(T)

        def finish_inputs(srcs, t0, n, i_h, row, c):  # type: ignore[no-untyped-def]
            """The finish's inputs at (row, key c) of the chunk at t0 (dqg, dke, dkd, qg, ke, kd in fp32; 0 past its
            n rows), loaded a block ahead of the finish that reads them."""
            return [masked_load(T, row < n, x, (t0 + row, i_h, c), fp32) for x in srcs]

        @T.prim_func
        def bwd_products(
            q: T.Tensor((ntok, Hk, K), io), k: T.Tensor((ntok, Hk, K), io),
            g: T.Tensor((ntok, H, K), gat), beta: T.Tensor((ntok, H), fp32),
            tt: T.Tensor((ntok, H, C), io), qg: T.Tensor((ntok, H, K), io),
            ke: T.Tensor((ntok, H, K), io), kd: T.Tensor((ntok, H, K), io),
            daqk: T.Tensor((ntok, H, C), fp32), dag: T.Tensor((ntok, H, C), fp32),
            dqg: T.Tensor((ntok, H, K), gdt), dke: T.Tensor((ntok, H, K), gdt),
            dkd: T.Tensor((ntok, H, K), gdt), dgc: T.Tensor((nchunk, H, K), fp32),
            cu: T.Tensor((nseq + 1,), "int32"), ci: T.Tensor((nchunk, 2), "int32"),
            dq: T.Tensor((ntok, H, K), odt), dk: T.Tensor((ntok, H, K), odt),
            dg: T.Tensor((ntok, H, K), gat), dbeta: T.Tensor((ntok, H), fp32),
        ):  # fmt: skip
            with T.Kernel(nchunk * H, threads=512 if "wg4" in lab else 128 if "wg1" in lab else _THREADS) as (bid,):
                i_c = bid // H
                i_h = bid % H
                tx = T.get_thread_binding()
                span_l = T.alloc_local((2,), "int32")
                span(cu, ci, i_c, span_l)
                t0 = span_l[0]
                n = span_l[1]  # the chunk's rows in its sequence (C but for a varlen sequence's last)
                q_s = T.alloc_shared((C, K), io)
                k_s = T.alloc_shared((C, K), io)
                g_s = T.alloc_shared((C, K + 8), fp32)  # G (rows padded: read in the products' layout)
                t_s = T.alloc_shared((C, C), io)  # T
                m_s = T.alloc_shared((C, C), io)  # dAg diag(beta), then (dAg diag(beta)) T^T
                # X = scale dAqk, dA and Y = diag(beta) dA, hi and lo: read by elements (never a product's operand),
                # down their columns too (`col_block`'s transposed copy): rows padded to 66 (33 words), so a column's
                # 32 rows fall in 32 banks (at 64, in one)
                xh_s = T.alloc_shared((C, C + 2), io)
                xl_s = T.alloc_shared((C, C + 2), io)
                ah_s = T.alloc_shared((C, C + 2), io)
                al_s = T.alloc_shared((C, C + 2), io)
                yh_s = T.alloc_shared((C, C + 2), io)
                yl_s = T.alloc_shared((C, C + 2), io)
                oh_s = T.alloc_shared((C, K), io)  # a block's operand, hi and lo
                ol_s = T.alloc_shared((C, K), io)
                xbh_s = T.alloc_shared((BLOCK, C), io)  # a block's rows of X, X^T or Y^T, hi and lo
                xbl_s = T.alloc_shared((BLOCK, C), io)
                abh_s = T.alloc_shared((BLOCK, C), io)  # the block's rows of dA, hi and lo
                abl_s = T.alloc_shared((BLOCK, C), io)
                kra_s = T.alloc_shared((BLOCK, K), fp32)  # k o RA of the block's rows (dbeta's row sums)
                rs_s = T.alloc_shared((BLOCK,), fp32)
                dgs_s = T.alloc_shared((C, K + 8), fp32)  # dG, then summed down the chunk
                dbr_s = T.alloc_shared((C,), fp32)
                fl_s = T.alloc_shared((C, K), "uint8")  # 1 where the gate is below the floor (dg 0 there)
                dbt_s = T.alloc_shared((C,), fp32)  # colsum(dAg o T), dbeta's other term
                kc_l = T.alloc_local((1,), fp32)  # colsum(kd o dkd) of key tx, summed block by block
                b_s = T.alloc_shared((C,), fp32)
                ref_s = T.alloc_shared((NB, K), fp32)  # the rows' references (R)
                cref_s = T.alloc_shared((NB, K), fp32)  # the columns' (Cc)
                sp_s = T.alloc_shared((K,), fp32)
                c_f = T.alloc_fragment((C, C), fp32)
                rq_f = T.alloc_fragment((K, BLOCK), fp32)
                ra_f = T.alloc_fragment((K, BLOCK), fp32)
                cq_f = T.alloc_fragment((K, BLOCK), fp32)
                ck_f = T.alloc_fragment((K, BLOCK), fp32)
                kr_f = T.alloc_fragment((BLOCK, K), fp32)
                # the block's finish inputs, in the products' layout (the finish loop's rq_f's)
                pre = [T.alloc_fragment((K, BLOCK), fp32) for _ in range(6)]
                acc = T.alloc_var(fp32)
                fast_l = T.alloc_local((1,), "int32")
                T.annotate_layout({x: tilelang.layout.make_swizzled_layout(x) for x in (q_s, k_s)})

                T.copy(q[t0 : t0 + C, i_h // G, :], q_s)
                T.copy(k[t0 : t0 + C, i_h // G, :], k_s)
                T.copy(tt[t0 : t0 + C, i_h, :], t_s)
                if varlen:  # a chunk's rows past its sequence (the next sequence's) read as zeros everywhere below
                    clear(q_s, n)
                    clear(k_s, n)
                    clear(t_s, n)
                for r in T.Parallel(C):
                    b_s[r] = T.if_then_else(r < n, beta[t0 + r, i_h], 0.0)
                # G: the tile loaded by every thread, then key column tx summed down the chunk. dA's inputs are read
                # in the same phase (beta from memory, not b_s: no barrier between the two groups of loads), so the
                # program waits on one global latency for both
                for r, c in T.Parallel(C, K):  # (a gate of 0 past the end: G repeats its last row, as the Ag pass's)
                    gv = masked_load(T, r < n, g, (t0 + r, i_h, c), fp32)
                    g_s[r, c] = T.max(gv, floor)
                    fl_s[r, c] = T.if_then_else(gv < floor, T.cast(1, "uint8"), T.cast(0, "uint8"))
                for r, c in T.Parallel(C, C):
                    # (each select around its load alone, the products after, as `masked_load`'s: a product inside
                    # the select nests the load's bound check as a cast does)
                    dv = T.if_then_else((r < n) & (c < n), dag[t0 + r, i_h, c], 0.0)
                    m_s[r, c] = T.cast(dv * T.if_then_else(c < n, beta[t0 + c, i_h], 0.0), io)
                    xv = T.if_then_else(r < n, daqk[t0 + r, i_h, c], 0.0) * scale
                    mac.split(xv, xh_s, xl_s, r, c)
                T.sync_threads()
                if tx < K:  # (a thread a key)
                    acc = 0.0
                    for r in T.unroll(C):
                        acc = acc + g_s[r, tx]
                        g_s[r, tx] = acc
                mac.references(g_s, sp_s, ref_s, cref_s, fast_l, tx)
                fastv = fast_l[0]
                # dbeta's colsum(dAg o T) here, by all threads (dAg read again: a cached line), not by a thread a row
                # reading 64 rows of dAg one after another at the end (session 33: 0.49 ms less at 1x64K's size on the
                # H100, with the column sums below); c_f as [col, row]
                for c, r in T.Parallel(C, C):
                    c_f[c, r] = T.if_then_else((r < n) & (c < n), dag[t0 + r, i_h, c], 0.0) * T.cast(t_s[r, c], fp32)
                T.reduce_sum(c_f, dbt_s, dim=1)
                kc_l[0] = 0.0
                # dA = -StrictLower(T^T (dAg diag(beta)) T^T) (its M = dAg diag(beta) formed above)
                T.fence_proxy_async()
                T.gemm(m_s, t_s, c_f, transpose_B=True, clear_accum=True)
                T.copy(c_f, m_s)
                T.fence_proxy_async()
                T.gemm(t_s, m_s, c_f, transpose_A=True, clear_accum=True)
                for r, c in T.Parallel(C, C):
                    av = T.if_then_else(r > c, 0.0 - c_f[r, c], 0.0)
                    yv = av * b_s[r]
                    mac.split(av, ah_s, al_s, r, c)
                    mac.split(yv, yh_s, yl_s, r, c)
                T.sync_threads()

                for I in T.unroll(NB):
                    # the finish's inputs, issued now and first read in the finish below: their global latency
                    # passes under the operands and products (session 33, the H100: 8.08 ms with the column sums
                    # from registers, 8.32 without this, 8.81 with neither)
                    for c, r in T.Parallel(K, BLOCK):
                        ins = finish_inputs((dqg, dke, dkd, qg, ke, kd), t0, n, i_h, BLOCK * I + r, c)
                        # (one store a line: `range` in a prim_func is a TIR loop, and a Python loop binding the
                        # buffers renamed them in the generated code)
                        pre[0][c, r], pre[1][c, r], pre[2][c, r] = ins[0], ins[1], ins[2]
                        pre[3][c, r], pre[4][c, r], pre[5][c, r] = ins[3], ins[4], ins[5]
                    # Rq and RA: one operand k o e^(r_I - G) on the rows up to block I's end (fast) or before it; their
                    # six tensor-core products issued back to back, one wait
                    if "no_operands" not in lab:
                        mac.operand(k_s, g_s, ref_s, oh_s, ol_s, I, 0, BLOCK * I + BLOCK * fastv, 1.0)
                    mac.rows_of(xh_s, xl_s, xbh_s, xbl_s, I)
                    mac.rows_of(ah_s, al_s, abh_s, abl_s, I)
                    if "no_products" in lab:
                        T.clear(rq_f)
                        T.clear(ra_f)
                    else:
                        mac.products(oh_s, ol_s, xbh_s, xbl_s, rq_f, False)
                        mac.products(oh_s, ol_s, abh_s, abl_s, ra_f)
                    mac.row_finish(rq_f, xh_s, xl_s, k_s, g_s, ref_s, I, fastv)
                    mac.row_finish(ra_f, ah_s, al_s, k_s, g_s, ref_s, I, fastv)
                    # Cq = C(X, q), Ck = C(Y, k): operands scaled by e^(G - r_I) on the rows from block I's start (fast)
                    # or after it, against X's and Y's columns
                    mac.col_block(q_s, g_s, cref_s, xh_s, xl_s, oh_s, ol_s, xbh_s, xbl_s, cq_f, I, fastv)
                    mac.col_block(k_s, g_s, cref_s, yh_s, yl_s, oh_s, ol_s, xbh_s, xbl_s, ck_f, I, fastv)
                    # the block's rows finished in the products' layout; dG to dg (summed down the chunk below). dG and
                    # k o RA go to cq_f, ck_f in place (each element read before it is written, by its own thread), and
                    # to shared memory in a loop of their own: a shared store in the loop of shared reads made TileLang
                    # put a barrier in each of its 16 unrolled steps, so every step's global loads waited on the last's
                    if "no_finish" not in lab:
                        for c, r in T.Parallel(K, BLOCK):
                            row = BLOCK * I + r
                            eg = T.exp(g_s[row, c])
                            qv = T.cast(q_s[row, c], fp32)
                            kv = T.cast(k_s[row, c], fp32)
                            a_dqg, a_dke, a_dkd, a_qg, a_ke, a_kd = [x[c, r] for x in pre]
                            if row < n:
                                dq[t0 + row, i_h, c] = T.cast(rq_f[c, r] + scale * eg * a_dqg, odt)
                                dk[t0 + row, i_h, c] = T.cast(cq_f[c, r] + b_s[row] * ra_f[c, r] + ck_f[c, r]
                                                              + eg * a_dke
                                                              + T.exp(g_s[C - 1, c] - g_s[row, c]) * a_dkd, odt)  # fmt: skip
                            dgv = (qv * rq_f[c, r] - kv * cq_f[c, r] + b_s[row] * kv * ra_f[c, r] - kv * ck_f[c, r]
                                   + a_qg * a_dqg + a_ke * a_dke - a_kd * a_dkd)  # fmt: skip
                            cq_f[c, r] = dgv
                            ck_f[c, r] = kv * ra_f[c, r]
                            rq_f[c, r] = a_kd * a_dkd  # (dG_C's colsum(kd o dkd), from the loads above)
                    for c, r in T.Parallel(K, BLOCK):
                        dgs_s[BLOCK * I + r, c] = cq_f[c, r]
                        kra_s[r, c] = ck_f[c, r]
                    T.copy(kra_s, kr_f)
                    T.reduce_sum(kr_f, rs_s, dim=1)
                    for r in T.Parallel(BLOCK):
                        dbr_s[BLOCK * I + r] = rs_s[r]
                    # the block's kd o dkd through kra_s, summed down by a thread a key
                    for c, r in T.Parallel(K, BLOCK):
                        kra_s[r, c] = rq_f[c, r]
                    if tx < K:
                        for r in T.unroll(BLOCK):
                            kc_l[0] = kc_l[0] + kra_s[r, tx]
                T.sync_threads()

                # dg: dG summed down the chunk from its end, dG_C (the state term + colsum(kd o dkd), summed above
                # from registers) on the last row, 0 where the gate is below the floor (its flag in shared memory)
                if tx < K:  # (a thread a key)
                    acc = dgc[i_c, i_h, tx] + kc_l[0]
                    for r in T.unroll(C):
                        acc = acc + dgs_s[C - 1 - r, tx]
                        if C - 1 - r < n:
                            dg[t0 + C - 1 - r, i_h, tx] = T.cast(T.if_then_else(fl_s[C - 1 - r, tx] == 1, 0.0, acc), gat)
                # dbeta = colsum(dAg o T) + rowsum(k o RA)
                if tx < n:
                    dbeta[t0 + tx, i_h] = dbr_s[tx] + dbt_s[tx]

        return bwd_products

    return build()


def bwd_products_hopper(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, tt: Tensor, kept: dict[str, Tensor], grads: dict[str, Tensor], *,
    scale: float, varlen: tuple[Tensor, Tensor] | None = None, lab: frozenset[str] = frozenset(),
    out_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dg `[N, HV, K]`, dbeta `[N, HV]`: fp32, dq and dk in out_dtype, fp32 or bf16, dg in bf16 where g is)
    of `reverse_bwd_torch.products_finish` on this kernel: q, k `[N, Hk, K]` (value head h reads head h // (HV / Hk):
    grouped heads; dq, dk come per value head, for the caller to sum per group), g (raw; bf16 read as it is, any other
    dtype as fp32) `[N, HV, K]`, beta `[N, HV]`, T `[N, HV, 64]`, kept {"qg", "ke", "kd"} `[N, HV, K]`
    (bf16, the forward's under "ag") and grads `state_grads_hopper`'s outputs {"dAqk", "dAg" `[N, HV, 64]`, "dqg",
    "dke", "dkd" `[N, HV, K]`, "dGC" `[NT, HV, K]`}: chunk c at rows 64 c (N = 64 NT), or with varlen (cu_seqlens,
    chunk_indices `[NT, 2]`: `kernels.common.index.ChunkIndex`'s, int32 on the device) at the rows of its (sequence,
    chunk) pair. lab: `PRODUCTS_LAB_SWITCHES` (timing only). Raises ValueError where `bwd_products_refusal` gives a
    reason."""
    N, Hk, K = k.shape
    HV = g.shape[1] if g.dim() == 3 else Hk
    why = bwd_products_refusal(K, 128, 64, k.device)
    if why is not None:
        raise ValueError(why)
    NT = grads["dGC"].shape[0] if varlen is not None else N // 64
    rows, chunks = (N, HV, K), (NT, HV, K)
    want = {"q": (N, Hk, K), "g": rows, "beta": (N, HV), "T": (N, HV, 64), "qg": rows, "ke": rows, "kd": rows,
            "dAqk": (N, HV, 64), "dAg": (N, HV, 64), "dqg": rows, "dke": rows, "dkd": rows, "dGC": chunks}  # fmt: skip
    given = {"q": q, "g": g, "beta": beta, "T": tt, **{n: kept[n] for n in ("qg", "ke", "kd")},
             **{n: grads[n] for n in ("dAqk", "dAg", "dqg", "dke", "dkd", "dGC")}}  # fmt: skip
    if varlen is not None:
        want["chunk_indices"], given["chunk_indices"] = (NT, 2), varlen[1]
    bad = [f"{n} {tuple(x.shape)}" for n, x in given.items() if tuple(x.shape) != want[n]]
    dense_rows = varlen is None and N % 64
    if dense_rows or HV % Hk or bad:  # (the kernel takes its chunk count from dGC: a wrong one would read past the rest)
        raise ValueError(f"bwd_products_hopper: with k [N, Hk, 128] = {tuple(k.shape)} and g's HV = {HV}, got "
                         f"{', '.join(bad) or ('N % 64 (dense rows)' if dense_rows else 'HV % Hk')}")  # fmt: skip
    key = build_key(k, g, grads, scale=scale, varlen=varlen is not None, lab=lab, out_dtype=out_dtype)
    *_, bf16_grads, bf16_gate = key
    bf = [x.to(torch.bfloat16).contiguous() for x in (q, k)]
    f32 = [g.contiguous() if bf16_gate else g.float().contiguous(), beta.float().contiguous()]
    kk = [x.to(torch.bfloat16).contiguous() for x in (tt, kept["qg"], kept["ke"], kept["kd"])]
    gg = [grads[n].to(torch.bfloat16 if bf16_grads and n in ("dqg", "dke", "dkd") else torch.float32).contiguous()
          for n in ("dAqk", "dAg", "dqg", "dke", "dkd", "dGC")]  # fmt: skip
    bounds = varlen if varlen is not None else (stand_in(k.device, torch.int32, 2), stand_in(k.device, torch.int32, NT, 2))
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"bwd_products_hopper: out_dtype is fp32 or bf16, got {out_dtype}")
    dq, dk = (torch.empty(N, HV, K, dtype=out_dtype, device=k.device) for _ in range(2))
    dg = torch.empty(N, HV, K, dtype=g.dtype if bf16_gate else torch.float32, device=k.device)
    dbeta = torch.empty(N, HV, dtype=torch.float32, device=k.device)
    # (in `compile_ahead`'s dry run the kernel builds beside the Triton compiles and does not launch)
    if NT and not build_beside(("kda_bwd_products", *key), _build, *key):
        _build(*key)(*bf, *f32, *kk, *gg, *(b.int().contiguous() for b in bounds), dq, dk, dg, dbeta)
    return dq, dk, dg, dbeta


def build_key(k: Tensor, g: Tensor, grads: dict[str, Tensor], *, scale: float, varlen: bool,
              lab: frozenset[str] = frozenset(), out_dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:  # fmt: skip
    """`_build`'s arguments for a launch on these inputs (`bwd_products_hopper`'s; `decay_products_lab` builds them
    ahead in other processes with it): (HV, Hk, scale, varlen, lab, bf16 dq/dk, bf16 dqg/dke/dkd, bf16 g/dg). dqg, dke, dkd are read
    in bf16 where `state_grads_hopper` wrote them so, all three alike (else fp32); g in bf16 where it is (the model's
    gate dtype: read as it is, dg written so; else fp32)."""
    bf16_grads = all(grads[n].dtype == torch.bfloat16 for n in ("dqg", "dke", "dkd"))
    HV = g.shape[1] if g.dim() == 3 else k.shape[1]
    return (HV, k.shape[1], float(scale), varlen, frozenset(lab), out_dtype == torch.bfloat16, bf16_grads,
            g.dtype == torch.bfloat16)  # fmt: skip
