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
(factors <= 1) and the diagonal blocks are summed elementwise (every exponent <= 0). Each block is three 64x128x64
warpgroup products over the whole chunk, of which the block's 16 rows are kept: X and the scaled operand each split
into bf16 hi and lo parts, X_hi O_hi + X_lo O_hi + X_hi O_lo (fp32 accuracy, as the KDA Ag pass's Aqk: the backward
keeps these products at fp32 because bf16 operands put dg at 1.1e-2, `kernels.common.chunk_bwd`'s VECTOR_GATE_DOT),
four blocks a side; the tensor cores' cost is small at this size.

Sizes: K = 128, chunk 64, sm_90, TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; refused in one line
otherwise. Tested on the GPU against the mirror (tests/kernels/ops/kda/test_decay_products_hopper.py).
"""

import functools
from typing import Any

import torch
from torch import Tensor

from kernels.ops.gdn.tilelang_hopper import hopper_jit, tilelang_refusal
from kernels.ops.kda.ag_torch import FAST_SPAN

__all__ = ["decay_products_hopper", "decay_products_refusal"]

_WHAT = "KDA decayed products"  # how the refusals name this kernel
_THREADS = 128
BLOCK = 16


def decay_products_refusal(K: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, 128, BT, device)


@functools.cache
def _build(H: int) -> Any:
    """The compiled kernel for H heads (TileLang JIT, cached on disk by TileLang too)."""
    import tilelang.language as T

    K = 128
    C = 64
    NB = C // BLOCK
    fp32, io = "float32", "bfloat16"
    nchunk = T.dynamic("nchunk")
    span = float(FAST_SPAN)

    @hopper_jit()
    def build() -> Any:
        @T.macro
        def rows_product(xh_s, xl_s, a_s, g_s, ref_s, oh_s, ol_s, p_f, out_f, I, fastv):
            """Block I of R into out_f's rows of block I: the operand a o e^(r_I - G) on the rows up to block I's
            end (fast) or before it, in hi and lo parts, three products, then the rows' factor e^(G_i - r_I)."""
            for r, c in T.Parallel(C, K):
                oh_s[r, c] = T.cast(T.if_then_else(r < BLOCK * I + BLOCK * fastv,
                                                   T.cast(a_s[r, c], fp32) * T.exp(ref_s[I, c] - g_s[r, c]), 0), io)  # fmt: skip
                ol_s[r, c] = T.cast(T.if_then_else(r < BLOCK * I + BLOCK * fastv,
                                                   T.cast(a_s[r, c], fp32) * T.exp(ref_s[I, c] - g_s[r, c])
                                                   - T.cast(oh_s[r, c], fp32), 0), io)  # fmt: skip
            T.fence_proxy_async()
            T.gemm(xh_s, oh_s, p_f, clear_accum=True)
            T.gemm(xl_s, oh_s, p_f)
            T.gemm(xh_s, ol_s, p_f)
            for r, c in T.Parallel(C, K):
                if r // BLOCK == I:
                    out_f[r, c] = p_f[r, c] * T.exp(g_s[r, c] - ref_s[I, c])

        @T.macro
        def cols_product(xh_s, xl_s, a_s, g_s, ref_s, oh_s, ol_s, p_f, out_f, I, fastv):
            """Block I of Cc into out_f's rows of block I: the operand a o e^(G - r_I) on the rows from block I's
            start (fast) or after it, in hi and lo parts, three products with X^T, then the columns' factor
            e^(r_I - G_j)."""
            for r, c in T.Parallel(C, K):
                oh_s[r, c] = T.cast(T.if_then_else(r >= BLOCK * I + BLOCK * (1 - fastv),
                                                   T.cast(a_s[r, c], fp32) * T.exp(g_s[r, c] - ref_s[I, c]), 0), io)  # fmt: skip
                ol_s[r, c] = T.cast(T.if_then_else(r >= BLOCK * I + BLOCK * (1 - fastv),
                                                   T.cast(a_s[r, c], fp32) * T.exp(g_s[r, c] - ref_s[I, c])
                                                   - T.cast(oh_s[r, c], fp32), 0), io)  # fmt: skip
            T.fence_proxy_async()
            T.gemm(xh_s, oh_s, p_f, transpose_A=True, clear_accum=True)
            T.gemm(xl_s, oh_s, p_f, transpose_A=True)
            T.gemm(xh_s, ol_s, p_f, transpose_A=True)
            for r, c in T.Parallel(C, K):
                if r // BLOCK == I:
                    out_f[r, c] = p_f[r, c] * T.exp(ref_s[I, c] - g_s[r, c])

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
                xh_s = T.alloc_shared((C, C), io)  # X's bf16 hi and lo parts
                xl_s = T.alloc_shared((C, C), io)
                a_s = T.alloc_shared((C, K), io)
                g_s = T.alloc_shared((C, K), fp32)
                oh_s = T.alloc_shared((C, K), io)  # the scaled operand's hi and lo parts
                ol_s = T.alloc_shared((C, K), io)
                rref_s = T.alloc_shared((NB, K), fp32)  # the row products' references
                cref_s = T.alloc_shared((NB, K), fp32)  # the column products'
                sp_s = T.alloc_shared((K,), fp32)
                p_f = T.alloc_fragment((C, K), fp32)
                out_f = T.alloc_fragment((C, K), fp32)
                for r, c in T.Parallel(C, C):
                    xh_s[r, c] = T.cast(x[i_c, i_h, r, c], io)
                    xl_s[r, c] = T.cast(x[i_c, i_h, r, c] - T.cast(T.cast(x[i_c, i_h, r, c], io), fp32), io)
                for r, c in T.Parallel(C, K):
                    a_s[r, c] = a[t0 + r, i_h, c]
                    g_s[r, c] = g[t0 + r, i_h, c]
                T.sync_threads()
                # each key's largest span across a block (thread tx: key tx), and the references
                sp_s[tx] = T.max(T.max(0.0 - g_s[15, tx], g_s[15, tx] - g_s[31, tx]),
                                 T.max(g_s[31, tx] - g_s[47, tx], g_s[47, tx] - g_s[63, tx]))  # fmt: skip
                T.sync_threads()
                fastv = 1
                for c in T.serial(K):
                    if sp_s[c] >= span:
                        fastv = 0
                for I in T.unroll(NB):
                    rref_s[I, tx] = T.if_then_else(
                        fastv == 1, 0.5 * (T.if_then_else(I == 0, 0.0, g_s[T.max(BLOCK * I - 1, 0), tx])
                                           + g_s[BLOCK * I + BLOCK - 1, tx]),
                        T.if_then_else(I == 0, 0.0, g_s[T.max(BLOCK * I - 1, 0), tx]))  # fmt: skip
                    cref_s[I, tx] = T.if_then_else(
                        fastv == 1, 0.5 * (T.if_then_else(I == 0, 0.0, g_s[T.max(BLOCK * I - 1, 0), tx])
                                           + g_s[BLOCK * I + BLOCK - 1, tx]),
                        g_s[BLOCK * I + BLOCK - 1, tx])  # fmt: skip
                T.sync_threads()

                for I in T.unroll(NB):
                    rows_product(xh_s, xl_s, a_s, g_s, rref_s, oh_s, ol_s, p_f, out_f, I, fastv)
                if fastv == 0:  # the diagonal blocks elementwise: R_i += sum_{j in i's block, j <= i} (exponents <= 0)
                    for jj in T.serial(BLOCK):
                        for r, c in T.Parallel(C, K):
                            out_f[r, c] += T.if_then_else(
                                (r // BLOCK) * BLOCK + jj <= r,
                                (T.cast(xh_s[r, (r // BLOCK) * BLOCK + jj], fp32) + T.cast(xl_s[r, (r // BLOCK) * BLOCK + jj], fp32))
                                * T.cast(a_s[(r // BLOCK) * BLOCK + jj, c], fp32)
                                * T.exp(T.min(g_s[r, c] - g_s[(r // BLOCK) * BLOCK + jj, c], 0.0)), 0.0)  # fmt: skip
                for r, c in T.Parallel(C, K):
                    rr[t0 + r, i_h, c] = out_f[r, c]

                for I in T.unroll(NB):
                    cols_product(xh_s, xl_s, a_s, g_s, cref_s, oh_s, ol_s, p_f, out_f, I, fastv)
                if fastv == 0:  # Cc_j += sum_{i in j's block, i >= j}
                    for ii in T.serial(BLOCK):
                        for r, c in T.Parallel(C, K):
                            out_f[r, c] += T.if_then_else(
                                (r // BLOCK) * BLOCK + ii >= r,
                                (T.cast(xh_s[(r // BLOCK) * BLOCK + ii, r], fp32) + T.cast(xl_s[(r // BLOCK) * BLOCK + ii, r], fp32))
                                * T.cast(a_s[(r // BLOCK) * BLOCK + ii, c], fp32)
                                * T.exp(T.min(g_s[(r // BLOCK) * BLOCK + ii, c] - g_s[r, c], 0.0)), 0.0)  # fmt: skip
                for r, c in T.Parallel(C, K):
                    cc[t0 + r, i_h, c] = out_f[r, c]

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
