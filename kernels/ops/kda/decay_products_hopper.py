"""KDA's per-key decayed products as one TileLang kernel per (chunk, head) on Hopper: the building block of the
chunk-parallel KDA backward planned in `kernels/NOTES.md` ("KDA's backward, the next kernel"), alone, to be checked
and timed before the kernel is built around it (a lab kernel: nothing in the step calls it). Its CPU mirror is
`kernels.ops.kda.reverse_bwd_torch.decayed_products_blocks`, the same decomposition in torch.

Per chunk of C = 64 rows, given X `[C, C]` (zero above the diagonal), a `[C, K]` and G `[C, K]` (the in-chunk cumsum
of the floored per-key gate), K = 128, with 16-row blocks and one reference per block and key:

    R_i  = sum_{j <= i} X_ij a_j e^(G_i - G_j)    block I: e^(G_I - r_I) o (X (a o e^(r_I - G) on the allowed rows))
    Cc_j = sum_{i >= j} X_ij a_i e^(G_i - G_j)    block J: e^(r_J - G_J) o (X^T (a o e^(G - r_J) on the allowed rows))

Fast chunk (every key's span across every block below FAST_SPAN): r is the block's midpoint and the products cover
the diagonal block; else r_I is G before block I, r_J G at block J's last row, the products cover the other blocks
(factors <= 1) and the diagonal blocks are summed elementwise (every exponent <= 0). Each block's product is formed
at its own size, transposed: [128 keys, 16 rows] = O^T Xb^T with O the scaled operand [64 rows, 128 keys] and Xb the
block's 16 rows of X (or of X^T), three warpgroup products over the chunk's 64 rows (M = 128 keys, N = 16, K = 64) on
bf16 hi and lo parts, O_hi Xb_hi + O_lo Xb_hi + O_hi Xb_lo (fp32 accuracy, as the KDA Ag pass's Aqk: the backward
keeps these products at fp32 because bf16 operands put dg at 1.1e-2, `kernels.common.chunk_bwd`'s VECTOR_GATE_DOT).
Each factor is formed once and the gate tile is read without bank conflicts (its rows padded). Session 29's form
(three 64 x 128 x 64 products a block over the whole chunk, 16 rows of each kept, each factor formed twice) took
6.05 ms on the H200 against 1.96 for the Triton tiles (1024 chunks x 16 heads, `results/decay_products_lab_s30_h200.md`).

Sizes: K = 128, chunk 64, sm_90, TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; refused in one line
otherwise. Tested on the GPU against the mirror (tests/kernels/ops/kda/test_decay_products_hopper.py).
"""

import functools
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from kernels.ops.gdn.tilelang_hopper import hopper_jit, tilelang_refusal
from kernels.ops.kda.ag_torch import FAST_SPAN

__all__ = ["decay_macros", "decay_products_hopper", "decay_products_refusal"]

_WHAT = "KDA decayed products"  # how the refusals name this kernel
_THREADS = 128
BLOCK = 16


def decay_products_refusal(K: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, 128, BT, device)


def decay_macros(T: Any, sync_mma: bool = False, lab: frozenset[str] = frozenset()) -> Any:
    """The TileLang macros (`T`: `tilelang.language` of the build) of the per-key decayed products by 16-row blocks,
    chunk 64 and 128 keys, shared by this kernel and `kernels.ops.kda.bwd_products_hopper`:

        split(x, hi_s, lo_s, r, c)          x's bf16 hi and lo parts into hi_s[r, c], lo_s[r, c]
        references(g_s, sp_s, rref_s, cref_s, fast_l, tx)   after G is in g_s: each key's largest span across a
                                            block (thread tx: key tx), fast_l[0] (a local int32 [1]: 1 where every
                                            span is below FAST_SPAN; a macro cannot assign a kernel's var) and the
                                            blocks' references: the midpoints (fast), else G before the block (rows)
                                            and at its last row (columns)
        operand(a_s, g_s, ref_s, oh_s, ol_s, I, lo_row, hi_row, sign)   a o e^(sign (r_I - G)) on rows
                                            lo_row <= r < hi_row (zero elsewhere), formed once, in hi and lo parts
        products(oh_s, ol_s, xbh_s, xbl_s, p_f)   p_f [K, 16] = O^T Xb^T over the chunk's rows: three products
        rows_of(xh_s, xl_s, xbh_s, xbl_s, I)   block I's rows of X into Xb (hi, lo)
        row_finish(p_f, xh_s, xl_s, a_s, g_s, rref_s, I, fastv)   R's block I: the rows' factor e^(G_i - r_I), and
                                            on a slow chunk the diagonal block elementwise (exponents <= 0)
        col_block(a_s, g_s, cref_s, xh_s, xl_s, oh_s, ol_s, xbh_s, xbl_s, p_f, I, fastv)   Cc's block I whole: its
                                            operand a o e^(G - r_I), X's columns, the products, the columns'
                                            factor e^(r_I - G_j), the diagonal block on a slow chunk"""
    K, C = 128, 64
    fp32, io = "float32", "bfloat16"
    NB = C // BLOCK
    span = float(FAST_SPAN)

    @T.macro
    def split(x, hi_s, lo_s, r, c):
        hi_s[r, c] = T.cast(x, io)
        lo_s[r, c] = T.cast(x - T.cast(T.cast(x, io), fp32), io)

    @T.macro
    def references(g_s, sp_s, rref_s, cref_s, fast_l, tx):
        T.sync_threads()
        if tx < K:  # (a thread a key: a build of more than K threads leaves the rest idle here)
            sp_s[tx] = T.max(T.max(0.0 - g_s[15, tx], g_s[15, tx] - g_s[31, tx]),
                             T.max(g_s[31, tx] - g_s[47, tx], g_s[47, tx] - g_s[63, tx]))  # fmt: skip
        T.sync_threads()
        fast_l[0] = 1
        for c in T.serial(K):
            if sp_s[c] >= span:
                fast_l[0] = 0
        if tx < K:
            for I in T.unroll(NB):
                before = T.if_then_else(I == 0, 0.0, g_s[T.max(BLOCK * I - 1, 0), tx])
                last = g_s[BLOCK * I + BLOCK - 1, tx]
                rref_s[I, tx] = T.if_then_else(fast_l[0] == 1, 0.5 * (before + last), before)
                cref_s[I, tx] = T.if_then_else(fast_l[0] == 1, 0.5 * (before + last), last)
        T.sync_threads()

    @T.macro
    def operand(a_s, g_s, ref_s, oh_s, ol_s, I, lo_row, hi_row, sign):
        for r, c in T.Parallel(C, K):
            x = T.if_then_else((r >= lo_row) & (r < hi_row),
                               T.cast(a_s[r, c], fp32) * T.exp(sign * (ref_s[I, c] - g_s[r, c])), 0)  # fmt: skip
            split(x, oh_s, ol_s, r, c)

    @T.macro
    def products(oh_s, ol_s, xbh_s, xbl_s, p_f, wait=True):
        # (session 31) the three issued back to back and waited for once (with wait; without, a later `products`
        # or `T.wait_wgmma(0)` waits): each `T.gemm` waited for itself, and K2, one program an SM, ran 147 us a
        # program on the H100 (18.3 ms at 1x64K) on such chains; sync_mma keeps the old form for the lab
        T.fence_proxy_async()
        if sync_mma:
            T.gemm(oh_s, xbh_s, p_f, transpose_A=True, transpose_B=True, clear_accum=True)
            T.gemm(ol_s, xbh_s, p_f, transpose_A=True, transpose_B=True)
            T.gemm(oh_s, xbl_s, p_f, transpose_A=True, transpose_B=True)
        else:
            T.wgmma_gemm(oh_s, xbh_s, p_f, transpose_A=True, transpose_B=True, clear_accum=True)
            T.wgmma_gemm(ol_s, xbh_s, p_f, transpose_A=True, transpose_B=True)
            T.wgmma_gemm(oh_s, xbl_s, p_f, transpose_A=True, transpose_B=True)
            if wait:
                T.wait_wgmma(0)

    @T.macro
    def rows_of(xh_s, xl_s, xbh_s, xbl_s, I):
        for r, c in T.Parallel(BLOCK, C):
            xbh_s[r, c] = xh_s[BLOCK * I + r, c]
            xbl_s[r, c] = xl_s[BLOCK * I + r, c]

    @T.macro
    def row_finish(p_f, xh_s, xl_s, a_s, g_s, rref_s, I, fastv):
        for c, r in T.Parallel(K, BLOCK):
            p_f[c, r] = p_f[c, r] * T.exp(g_s[BLOCK * I + r, c] - rref_s[I, c])
        if fastv == 0:  # R_i += sum_{j in block I, j <= i}
            for jj in T.serial(BLOCK):
                for c, r in T.Parallel(K, BLOCK):
                    p_f[c, r] += T.if_then_else(
                        jj <= r,
                        (T.cast(xh_s[BLOCK * I + r, BLOCK * I + jj], fp32) + T.cast(xl_s[BLOCK * I + r, BLOCK * I + jj], fp32))
                        * T.cast(a_s[BLOCK * I + jj, c], fp32)
                        * T.exp(T.min(g_s[BLOCK * I + r, c] - g_s[BLOCK * I + jj, c], 0.0)), 0.0)  # fmt: skip

    @T.macro
    def col_block(a_s, g_s, cref_s, xh_s, xl_s, oh_s, ol_s, xbh_s, xbl_s, p_f, I, fastv):
        if "no_operands" not in lab:
            operand(a_s, g_s, cref_s, oh_s, ol_s, I, BLOCK * I + BLOCK * (1 - fastv), C, -1.0)
        for r, c in T.Parallel(BLOCK, C):  # Xb[jj, i] = X[i, 16 I + jj]
            xbh_s[r, c] = xh_s[c, BLOCK * I + r]
            xbl_s[r, c] = xl_s[c, BLOCK * I + r]
        if "no_products" in lab:
            T.clear(p_f)
        else:
            products(oh_s, ol_s, xbh_s, xbl_s, p_f)
        for c, r in T.Parallel(K, BLOCK):
            p_f[c, r] = p_f[c, r] * T.exp(cref_s[I, c] - g_s[BLOCK * I + r, c])
        if fastv == 0:  # Cc_j += sum_{i in block I, i >= j}
            for ii in T.serial(BLOCK):
                for c, r in T.Parallel(K, BLOCK):
                    p_f[c, r] += T.if_then_else(
                        ii >= r,
                        (T.cast(xh_s[BLOCK * I + ii, BLOCK * I + r], fp32) + T.cast(xl_s[BLOCK * I + ii, BLOCK * I + r], fp32))
                        * T.cast(a_s[BLOCK * I + ii, c], fp32)
                        * T.exp(T.min(g_s[BLOCK * I + ii, c] - g_s[BLOCK * I + r, c], 0.0)), 0.0)  # fmt: skip

    return SimpleNamespace(split=split, references=references, operand=operand, products=products, rows_of=rows_of,
                           row_finish=row_finish, col_block=col_block)  # fmt: skip


@functools.cache
def _build(H: int) -> Any:
    """The compiled kernel for H heads (TileLang JIT, cached on disk by TileLang too)."""
    import tilelang.language as T

    K = 128
    C = 64
    NB = C // BLOCK
    fp32, io = "float32", "bfloat16"
    nchunk = T.dynamic("nchunk")

    @hopper_jit()
    def build() -> Any:
        mac = decay_macros(T)

        @T.prim_func
        def decay_products(
            x: T.Tensor((nchunk, H, C, C), fp32), a: T.Tensor((nchunk * C, H, K), io),
            g: T.Tensor((nchunk * C, H, K), fp32), rr: T.Tensor((nchunk * C, H, K), fp32),
            cc: T.Tensor((nchunk * C, H, K), fp32),
        ):  # fmt: skip
            with T.Kernel(nchunk * H, threads=_THREADS) as (bid,):
                i_c = bid // H
                i_h = bid % H
                tx = T.get_thread_binding()
                t0 = i_c * C
                xh_s = T.alloc_shared((C, C + 2), io)  # X's bf16 hi and lo parts (rows padded: read down columns too)
                xl_s = T.alloc_shared((C, C + 2), io)
                a_s = T.alloc_shared((C, K), io)
                # G, rows padded to 136 words: read in the products' accumulator layout without bank conflicts
                g_s = T.alloc_shared((C, K + 8), fp32)
                oh_s = T.alloc_shared((C, K), io)  # a block's operand, hi and lo parts
                ol_s = T.alloc_shared((C, K), io)
                xbh_s = T.alloc_shared((BLOCK, C), io)  # the block's rows of X (R) or of X^T (Cc), hi and lo
                xbl_s = T.alloc_shared((BLOCK, C), io)
                rref_s = T.alloc_shared((NB, K), fp32)  # the row products' references
                cref_s = T.alloc_shared((NB, K), fp32)  # the column products'
                sp_s = T.alloc_shared((K,), fp32)
                p_f = T.alloc_fragment((K, BLOCK), fp32)  # a block's product, transposed: [key, row of the block]
                fast_l = T.alloc_local((1,), "int32")
                for r, c in T.Parallel(C, C):
                    mac.split(x[i_c, i_h, r, c], xh_s, xl_s, r, c)
                for r, c in T.Parallel(C, K):
                    a_s[r, c] = a[t0 + r, i_h, c]
                    g_s[r, c] = g[t0 + r, i_h, c]
                mac.references(g_s, sp_s, rref_s, cref_s, fast_l, tx)
                fastv = fast_l[0]

                # R, block I: R_I^T = (a o e^(r_I - G))^T X_I^T over the rows up to block I's end (fast) or before it
                for I in T.unroll(NB):
                    mac.operand(a_s, g_s, rref_s, oh_s, ol_s, I, 0, BLOCK * I + BLOCK * fastv, 1.0)
                    mac.rows_of(xh_s, xl_s, xbh_s, xbl_s, I)
                    mac.products(oh_s, ol_s, xbh_s, xbl_s, p_f)
                    mac.row_finish(p_f, xh_s, xl_s, a_s, g_s, rref_s, I, fastv)
                    for c, r in T.Parallel(K, BLOCK):
                        rr[t0 + BLOCK * I + r, i_h, c] = p_f[c, r]
                # Cc, block J: Cc_J^T = (a o e^(G - r_J))^T X[:, J] over the rows from block J's start (fast) or after it
                for J in T.unroll(NB):
                    mac.col_block(a_s, g_s, cref_s, xh_s, xl_s, oh_s, ol_s, xbh_s, xbl_s, p_f, J, fastv)
                    for c, r in T.Parallel(K, BLOCK):
                        cc[t0 + BLOCK * J + r, i_h, c] = p_f[c, r]

        return decay_products

    return build()


def decay_products_hopper(X: Tensor, a: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    """(R, Cc) fp32 `[NT * 64, H, K]` of `decayed_products_blocks` on this kernel: X fp32 `[NT, H, 64, 64]` (zero above
    the diagonal), a bf16 and G fp32 `[NT * 64, H, K]` (chunk c's rows at 64 c..; a the chunk's k or q, G its in-chunk
    gate cumsum, K = 128).
    Raises ValueError where `decay_products_refusal` gives a reason."""
    NT, H, C = X.shape[:3]
    K = a.shape[-1]
    why = decay_products_refusal(K, C, X.device)
    if why is not None:
        raise ValueError(why)
    if a.shape != (NT * C, H, K) or G.shape != a.shape or X.shape != (NT, H, C, C):
        raise ValueError(f"decay_products_hopper: X [NT, H, 64, 64] and a, G [NT * 64, H, 128], got X {tuple(X.shape)}, "
                         f"a {tuple(a.shape)}, G {tuple(G.shape)}")  # fmt: skip
    x, a, G = X.float().contiguous(), a.to(torch.bfloat16).contiguous(), G.float().contiguous()
    R, Cc = torch.empty_like(G), torch.empty_like(G)
    if NT:
        _build(H)(x, a, G, R, Cc)
    return R, Cc
