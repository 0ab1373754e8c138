"""GDN's Ag pass as one TileLang kernel per (chunk, value head) on Hopper: what the Triton pass
`kernels.ops.gdn.wy_ag.wy_gdn_ag` stores (Ag, the gate cumsum, the forward's and the backward's bound sums), with
one warpgroup's tensor-core products for the gram and the solve. Its CPU mirror is
`kernels.common.ag_torch.ag_block_solve` (the same decomposition in torch), which CI tests against the fp64 solve;
this kernel is tested against the mirror and the Triton pass on the GPU.

Per chunk of C = 64 rows (G the in-chunk cumsum of the floored gate, A = StrictLower(beta_i k_i.k_j e^(G_i - G_j))):

    D^-1 = the inverses of the four 16x16 diagonal blocks of I + A        (forward substitution, fp32, 64 threads)
    N    = D^-1 A without its diagonal blocks                             (block-nilpotent: N^4 = 0)
    T    = (I + A)^-1 = (I + N)^-1 D^-1 = (I - N + N^2 - N^3) D^-1        (three tf32 products after N's)
    Ag   = T diag(beta)

The products are 64x64x64 warpgroup products in tf32 from shared memory (each right operand stored transposed, the
K-major layout tf32 wants); the Triton pass takes its off-diagonal blocks in tf32 too (`kernels.common.wy._solve`).

Modes (build-time, `AG_HOPPER_SUMS`): "bnd" also reads v for ||v||^2 and stores the chunk's decay-bound summary
(L, W) as `wy.py`'s `_chunk_bound`; "rev" reads q for ||q||^2 and stores the backward's reverse sums' q, k side
(p per token, (L + margin A, A) per chunk) as `wy_ag.py`'s `_store_rev_bound`. Both take ||k||^2 from the gram's
diagonal (exact for 16-bit k). Sizes: K = V = 128, chunk 64, bf16 or fp16, sm_90, TileLang
`kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; anything else is refused in one line.
"""

import functools
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from kernels.common.decay import GATE_FLOOR
from kernels.common.index import ChunkIndex
from kernels.ops.gdn.tilelang_hopper import (
    TL_DTYPES,
    check_lab,
    hopper_jit,
    masked_load,
    stand_in,
    tilelang_chosen,
    tilelang_refusal,
    tilelang_refusal_cached,
)
from kernels.parallel_compile import build_beside
from kernels.plan import LaunchPlan

__all__ = ["AG_HOPPER_AUTO", "AG_HOPPER_SUMS", "AG_LAB_SWITCHES", "ag_hopper", "ag_hopper_refusal", "ag_hopper_wanted", "ag_macros",
           "dense_chunk_table"]  # fmt: skip

_WHAT = "Ag pass"  # how the refusals name this kernel
# the optional sums of one build (bits of its `sums` key): the forward's bound summary, the backward's reverse sums
AG_HOPPER_SUMS = {"bnd": 1, "rev": 2}
_THREADS = 128
# the lab's switches (`benchmarks/ag_pass_lab.py --builds free+no_subst,...`): each leaves one part of a program out,
# for timing only (Ag is then wrong): where the time of a (chunk, head) program goes. The solve's two are shared with
# KDA's pass (`ag_macros`), which has its own too (`kernels.ops.kda.ag_hopper.KDA_AG_LAB_SWITCHES`)
AG_LAB_SWITCHES = {
    "no_gate": "no gate loads, cumsum or gcum store (G from a cleared tile)",
    "no_gram": "no k k^T product (A from a cleared tile)",
    "no_exp": "A without its decay factors e^(G_i - G_j)",
    "no_subst": "no forward substitution of the diagonal blocks (D^-1 left cleared)",
    "no_products": "none of the solve's four tf32 products (N and T from cleared tiles)",
    "no_store": "no Ag store, nor its staging",
}
SOLVE_LAB_SWITCHES = frozenset({"no_subst", "no_products"})
# whether `LaunchPlan.ag_pass = "auto"` takes this kernel (in bf16 where nothing refuses it). Off: right on the H200
# (session 29, its GPU tests passed) but 2.1x the Triton pass's time: 0.415 ms against 0.200 at 1x64K, HV 16, for Ag
# alone (floor 0.098; FlashQLA's kkt_solve 0.223), 1.28x with both sums (0.545 / 0.427), every build alike
# (benchmarks/results/ag_pass_lab_s29_h200.md). 162-164 registers, 64.3 KiB of shared memory, three programs an SM
AG_HOPPER_AUTO = False


def ag_hopper_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


def ag_hopper_wanted(k: Tensor, BT: int, launch: LaunchPlan | None, v: Tensor | None) -> bool:
    """Whether GDN's Ag pass runs on this kernel under the plan's `ag_pass`: "tilelang" always (a ValueError with the
    refusal's reason where it cannot run); "triton" and "auto" never: `AG_HOPPER_AUTO` is off until the kernel has
    been checked and timed on an H200."""
    return tilelang_chosen("ag_pass", launch.ag_pass if launch is not None else "auto", _WHAT, k.shape[-1],
                           v.shape[-1] if v is not None else 128, BT, k.device,
                           auto=AG_HOPPER_AUTO and k.dtype == torch.bfloat16)  # fmt: skip


def ag_macros(T: Any, quad: bool = False, lab: frozenset[str] = frozenset()) -> Any:
    """The TileLang macros (`T`: `tilelang.language` of the build) an Ag pass of chunk 64 and head dim 128 shares
    (GDN's here, KDA's `kernels.ops.kda.ag_hopper`): `row_squares`, the forward's decay-bound summary (`bound_logs`,
    `chunk_bound`: `wy.py`'s `_chunk_bound` from x (the token's gate), beta, ||k||^2, ||v||^2), a staged tile's
    store (`store_rows`) and the block solve
    of A^T in fp32 shared memory to T = (I + A)^-1 in a fragment (`block_solve`, or with `quad` `block_solve_quad`:
    module docstring). lab: `SOLVE_LAB_SWITCHES` (timing only)."""
    from kernels.common.wy import BOUND_MARGIN  # (the Triton pass's rounding; wy.py imports Triton: here, not above)

    K, C = 128, 64
    fp32 = "float32"
    margin = float(BOUND_MARGIN.value)
    ninf = -float("inf")

    @T.macro
    def row_squares(x_s, sq_f, nn_s):
        """||x_r||^2 of the chunk's rows of the shared tile x_s [C, 128] into nn_s [C], by column blocks of 32
        (sq_f [C, 32])."""
        T.clear(nn_s)
        for i_b in T.serial(K // 32):
            for r, c in T.Parallel(C, 32):
                sq_f[r, c] = T.cast(x_s[r, i_b * 32 + c], fp32) * T.cast(x_s[r, i_b * 32 + c], fp32)
            T.reduce_sum(sq_f, nn_s, dim=1, clear=False)

    @T.macro
    def bound_logs(x_s, b_s, kk_s, l_s, cl_s, al_s):
        """l = x + log max(1, |1 - beta ||k||^2|) per token, its inclusive cumsum and the cumsum of |l|."""
        for r in T.Parallel(C):
            l_s[r] = x_s[r] + T.log(T.max(T.abs(1.0 - b_s[r] * kk_s[r]), 1.0))
            al_s[r] = T.abs(x_s[r] + T.log(T.max(T.abs(1.0 - b_s[r] * kk_s[r]), 1.0)))
        T.cumsum(l_s, cl_s, dim=0)
        T.cumsum(al_s, al_s, dim=0)

    @T.macro
    def chunk_bound(b_s, kk_s, vv_s, e_s, em_s, cl_s, al_s, bnd, i_c, i_h, tx):
        """The chunk's (L, W) into bnd[i_c, i_h] from `bound_logs`' cumsums and ||v||^2 in vv_s (overwritten)."""
        # the exponent of token t: log u_t + (L - the cumsum of l to t); W = log sum_t e^(exponent)
        for r in T.Parallel(C):
            e_s[r] = (T.log(T.abs(b_s[r])) + 0.5 * T.log(kk_s[r]) + 0.5 * T.log(vv_s[r])
                      + (cl_s[C - 1] - cl_s[r]))  # fmt: skip
        T.cummax(e_s, em_s, dim=0)
        for r in T.Parallel(C):
            vv_s[r] = T.exp(e_s[r] - T.if_then_else(em_s[C - 1] == ninf, 0.0, em_s[C - 1]))
        T.cumsum(vv_s, vv_s, dim=0)
        lw = T.alloc_var(fp32)
        if tx == 0:
            lw = T.if_then_else(em_s[C - 1] == ninf, 0.0, em_s[C - 1]) + T.log(vv_s[C - 1])
            bnd[i_c, i_h, 0] = cl_s[C - 1] + margin * al_s[C - 1]
            bnd[i_c, i_h, 1] = T.if_then_else(lw > ninf, lw + margin * (al_s[C - 1] + T.abs(lw) + 1.0), lw)

    @T.macro
    def store_rows(x_s, out, t0, eos, i_h):
        """A staged [C, C] tile into out's rows t0.. of head i_h: one copy for a full chunk, row by row below the
        sequence's end for a partial one (the tile's writes fenced and synced before: both branches read it)."""
        if t0 + C <= eos:
            T.copy(x_s, out[t0 : t0 + C, i_h, :])
        else:
            for r, c in T.Parallel(C, C):
                if t0 + r < eos:
                    out[t0 + r, i_h, c] = x_s[r, c]

    @T.macro
    def inverse_and_n(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, tx):
        """D^-1 (and its transpose) from A^T, then N = D^-1 A off its diagonal blocks into n_f, n_s and at_s (as N^T)."""
        T.clear(dinv_s)  # (after the gram: these may take k's bytes)
        T.clear(dinvt_s)
        # D^-1: column j of the inverse of diagonal block d by forward substitution (one thread each)
        if tx < C and "no_subst" not in lab:
            d = tx // 16
            j = tx % 16
            for i in T.unroll(16):
                t_l[i] = T.if_then_else(i == j, 1.0, 0.0)
                for m in T.unroll(i):
                    t_l[i] = t_l[i] - at_s[d * 16 + m, d * 16 + i] * t_l[m]
            for i in T.unroll(16):
                dinv_s[d * 16 + i, d * 16 + j] = t_l[i]
                dinvt_s[d * 16 + j, d * 16 + i] = t_l[i]
        T.fence_proxy_async()

        # N = D^-1 A off its diagonal blocks, N^2, N^3 (tf32); T = (I - N + N^2 - N^3) D^-1
        if "no_products" in lab:
            T.clear(n_f)
        else:
            T.gemm(dinv_s, at_s, n_f, transpose_B=True, clear_accum=True)
        for r, c in T.Parallel(C, C):
            n_f[r, c] = T.if_then_else(r // 16 > c // 16, n_f[r, c], 0)
        for r, c in T.Parallel(C, C):
            n_s[r, c] = n_f[r, c]
            at_s[c, r] = n_f[r, c]
        T.fence_proxy_async()

    @T.macro
    def block_solve(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, n2_f, n3_f, t_f, tx):
        """T = (I + A)^-1 into t_f from A^T (strictly upper, fp32) in at_s: N^2 and N^3 by dense products."""
        inverse_and_n(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, tx)
        if "no_products" in lab:
            T.clear(n2_f)
        else:
            T.gemm(n_s, at_s, n2_f, transpose_B=True, clear_accum=True)
        for r, c in T.Parallel(C, C):
            dinv_s[c, r] = n2_f[r, c]
        T.fence_proxy_async()
        if "no_products" in lab:
            T.clear(n3_f)
        else:
            T.gemm(n_s, dinv_s, n3_f, transpose_B=True, clear_accum=True)
        for r, c in T.Parallel(C, C):
            at_s[r, c] = T.if_then_else(r == c, 1.0, 0.0) - n_f[r, c] + n2_f[r, c] - n3_f[r, c]
        T.fence_proxy_async()
        if "no_products" in lab:
            T.copy(at_s, t_f)
        else:
            T.gemm(at_s, dinvt_s, t_f, transpose_B=True, clear_accum=True)

    @T.macro
    def block_solve_quad(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, q_f, n2_s, n3_f, n3_s, t_f, tx):
        """`block_solve` with N^2, N^3 from their nonzero blocks alone."""
        inverse_and_n(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, tx)
        # N^2 is zero but for its lower left quadrant (block rows 2-3 x columns 0-1: N[32:, 16:48] N[16:48, :32]),
        # N^3 but for its block (3, 0) (N[48:, 32:48] N^2[32:48, :16], on the CUDA cores)
        T.gemm(n_s[32:C, 16:48], at_s[0:32, 16:48], q_f, transpose_B=True, clear_accum=True)
        T.copy(q_f, n2_s)
        T.clear(n3_f)
        for m in T.serial(16):
            for r, c in T.Parallel(16, 16):
                n3_f[r, c] += n_s[48 + r, 32 + m] * n2_s[m, c]
        T.copy(n3_f, n3_s)
        for r, c in T.Parallel(C, C):
            at_s[r, c] = (
                T.if_then_else(r == c, 1.0, 0.0)
                - n_f[r, c]
                + T.if_then_else(r >= 32 and c < 32, n2_s[T.max(r - 32, 0), T.min(c, 31)], 0)
                - T.if_then_else(r >= 48 and c < 16, n3_s[T.max(r - 48, 0), T.min(c, 15)], 0)
            )
        T.fence_proxy_async()
        T.gemm(at_s, dinvt_s, t_f, transpose_B=True, clear_accum=True)

    return SimpleNamespace(row_squares=row_squares, bound_logs=bound_logs, chunk_bound=chunk_bound,
                           store_rows=store_rows, block_solve=block_solve, block_solve_quad=block_solve_quad)  # fmt: skip


@functools.cache
def _build(H: int, Hk: int, io: str, gdt: str, bdt: str, sums: int, blocks: int = 0, quad: bool = False,
           lab: frozenset[str] = frozenset()) -> Any:  # fmt: skip
    """The compiled kernel for these heads, dtypes (inputs, gate, beta) and sums (TileLang JIT, cached on disk by
    TileLang too); blocks > 0: ask ptxas for that many programs an SM (`__launch_bounds__`' second argument, a
    register cap of 65536 / (128 blocks)), `benchmarks/ag_pass_lab.py --blocks`; quad: N^2 and N^3 from their nonzero
    blocks alone (a 32x32x32 product and a 16x16x16 one on the CUDA cores instead of two 64x64x64: half the tf32 work),
    `ag_pass_lab.py --quad`; lab: `AG_LAB_SWITCHES` (timing only)."""
    import tilelang.language as T

    check_lab(lab, AG_LAB_SWITCHES)

    K = V = 128
    C = 64
    G = H // Hk
    fp32 = "float32"
    HAS_BND = bool(sums & AG_HOPPER_SUMS["bnd"])
    HAS_REV = bool(sums & AG_HOPPER_SUMS["rev"])
    ntok, nseq, nchunk = T.dynamic("ntok"), T.dynamic("nseq"), T.dynamic("nchunk")
    # the optional inputs' and outputs' rows (a build without them binds one-row stand-ins)
    nv, nb, nrp, nrc = T.dynamic("nv"), T.dynamic("nb"), T.dynamic("nrp"), T.dynamic("nrc")
    floor = float(GATE_FLOOR)
    from kernels.common.wy import BOUND_MARGIN  # (the Triton pass's rounding; wy.py imports Triton: here, not above)

    margin = float(BOUND_MARGIN.value)
    ninf = -float("inf")

    @hopper_jit()
    def build() -> Any:
        mac = ag_macros(T, quad, lab & SOLVE_LAB_SWITCHES)

        @T.prim_func
        def ag_pass(
            q: T.Tensor((ntok, Hk, K), io), k: T.Tensor((ntok, Hk, K), io), v: T.Tensor((nv, H, V), io),
            g: T.Tensor((ntok, H), gdt), beta: T.Tensor((ntok, H), bdt),
            cu: T.Tensor((nseq + 1,), "int32"), ci: T.Tensor((nchunk, 2), "int32"),
            ag: T.Tensor((ntok, H, C), io), gcum: T.Tensor((ntok, H), fp32),
            bnd: T.Tensor((nb, H, 2), fp32), rp: T.Tensor((nrp, H), fp32), rc: T.Tensor((nrc, H, 2), fp32),
        ):  # fmt: skip
            with T.Kernel(nchunk * H, threads=_THREADS) as (bid,):
                if blocks:
                    T.annotate_min_blocks_per_sm(blocks)
                i_c = bid // H
                i_h = bid % H
                i_hk = i_h // G
                tx = T.get_thread_binding()
                t0 = T.alloc_var("int32")
                eos = T.alloc_var("int32")
                t0 = cu[ci[i_c, 0]] + ci[i_c, 1] * C
                eos = cu[ci[i_c, 0] + 1]

                k_s = T.alloc_shared((C, K), io)
                if HAS_BND:
                    v_s = T.alloc_shared((C, V), io)
                if HAS_REV:
                    q_s = T.alloc_shared((C, K), io)
                at_s = T.alloc_shared((C, C), fp32)  # A^T; then N^T; then P
                dinv_s = T.alloc_shared((C, C), fp32)  # D^-1; then (N^2)^T
                dinvt_s = T.alloc_shared((C, C), fp32)  # (D^-1)^T
                n_s = T.alloc_shared((C, C), fp32)  # N
                ag_s = T.alloc_shared((C, C), io)  # Ag staged for its store
                x_s = T.alloc_shared((C,), fp32)  # the floored gate
                gc_s = T.alloc_shared((C,), fp32)  # its in-chunk cumsum G
                b_s = T.alloc_shared((C,), fp32)
                kk_s = T.alloc_shared((C,), fp32)
                a_f = T.alloc_fragment((C, C), fp32)
                n_f = T.alloc_fragment((C, C), fp32)
                n2_f = T.alloc_fragment((C, C), fp32)
                if quad:
                    q_f = T.alloc_fragment((32, 32), fp32)
                    n2_s = T.alloc_shared((32, 32), fp32)  # N^2's lower left quadrant
                    n3_f = T.alloc_fragment((16, 16), fp32)
                    n3_s = T.alloc_shared((16, 16), fp32)  # N^3's block (3, 0)
                else:
                    n3_f = T.alloc_fragment((C, C), fp32)
                t_f = T.alloc_fragment((C, C), fp32)
                t_l = T.alloc_local((16,), fp32)

                # k (and v, q) by TMA under the gate's loads; a partial chunk's rows past the sequence load the next
                # one's (or zeros past the tensor): finite, and cut where they could reach a kept value (beta = 0
                # there: A's rows are zero, so are their bound terms; their Ag, gcum and p rows are not stored)
                loaded = T.alloc_barrier(arrive_count=_THREADS)
                T.tma_copy(k[t0 : t0 + C, i_hk, :], k_s, barrier=loaded)
                if HAS_BND:
                    T.tma_copy(v[t0 : t0 + C, i_h, :], v_s, barrier=loaded)
                if HAS_REV:
                    T.tma_copy(q[t0 : t0 + C, i_hk, :], q_s, barrier=loaded)
                T.barrier_arrive(loaded)
                if "no_gate" in lab:
                    for r in T.Parallel(C):
                        b_s[r] = masked_load(T, t0 + r < eos, beta, (T.min(t0 + r, eos - 1), i_h), fp32)
                    T.clear(x_s)
                    T.clear(gc_s)
                else:
                    for r in T.Parallel(C):
                        # (the max outside the masked load: 0 past the end as before, floor < 0)
                        x_s[r] = T.max(masked_load(T, t0 + r < eos, g, (T.min(t0 + r, eos - 1), i_h), fp32), floor)
                        b_s[r] = masked_load(T, t0 + r < eos, beta, (T.min(t0 + r, eos - 1), i_h), fp32)
                    T.cumsum(x_s, gc_s, dim=0)
                    for r in T.Parallel(C):
                        if t0 + r < eos:
                            gcum[t0 + r, i_h] = gc_s[r]

                # A = StrictLower(beta_i k_i.k_j e^(G_i - G_j)), stored transposed; ||k||^2 from the gram's diagonal
                T.barrier_wait(loaded, 0)
                if "no_gram" in lab:
                    T.clear(a_f)
                else:
                    T.gemm(k_s, k_s, a_f, transpose_B=True, clear_accum=True)
                if HAS_BND or HAS_REV:
                    for r, c in T.Parallel(C, C):
                        if r == c:
                            kk_s[r] = a_f[r, c]
                    # the bound sums here, before the solve: their buffers free before its tiles take k's bytes
                    sq_f = T.alloc_fragment((C, 32), fp32)
                    l_s = T.alloc_shared((C,), fp32)
                    cl_s = T.alloc_shared((C,), fp32)
                    al_s = T.alloc_shared((C,), fp32)
                    mac.bound_logs(x_s, b_s, kk_s, l_s, cl_s, al_s)
                    if HAS_BND:
                        vv_s = T.alloc_shared((C,), fp32)
                        e_s = T.alloc_shared((C,), fp32)
                        em_s = T.alloc_shared((C,), fp32)
                        mac.row_squares(v_s, sq_f, vv_s)
                        mac.chunk_bound(b_s, kk_s, vv_s, e_s, em_s, cl_s, al_s, bnd, i_c, i_h, tx)
                    if HAS_REV:
                        qq_s = T.alloc_shared((C,), fp32)
                        mac.row_squares(q_s, sq_f, qq_s)
                        for r in T.Parallel(C):
                            if t0 + r < eos:
                                rp[t0 + r, i_h] = T.if_then_else(
                                    qq_s[r] > 0, 0.5 * T.log(T.max(qq_s[r], 1e-38)) + cl_s[r], ninf
                                )
                        if tx == 0:
                            rc[i_c, i_h, 0] = cl_s[C - 1] + margin * al_s[C - 1]
                            rc[i_c, i_h, 1] = al_s[C - 1]

                if "no_exp" in lab:
                    for r, c in T.Parallel(C, C):
                        at_s[c, r] = T.if_then_else(r > c, a_f[r, c] * b_s[r], 0)
                else:
                    for r, c in T.Parallel(C, C):
                        at_s[c, r] = T.if_then_else(r > c, a_f[r, c] * b_s[r] * T.exp(gc_s[r] - gc_s[c]), 0)

                if quad:
                    mac.block_solve_quad(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, q_f, n2_s, n3_f, n3_s, t_f, tx)
                else:
                    mac.block_solve(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, n2_f, n3_f, t_f, tx)
                # Ag = T diag(beta) (zeros above the diagonal), staged in shared memory: one copy of a full chunk, row
                # by row below the sequence's end for a partial one (every thread's writes fenced and synced before
                # either branch reads the tile: `kernels.ops.gdn.reverse_bwd`'s lesson of session 24)
                if "no_store" not in lab:
                    for r, c in T.Parallel(C, C):
                        ag_s[r, c] = T.cast(T.if_then_else(r >= c, t_f[r, c] * b_s[c], 0), io)
                    T.fence_proxy_async()
                    T.sync_threads()
                    mac.store_rows(ag_s, ag, t0, eos, i_h)

        return ag_pass

    return build()


@functools.cache
def dense_chunk_table(N: int, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(cu, the chunk table (sequence, chunk in it)) int32 of N dense sequences of T tokens, in the Triton pass's
    global chunk order (sequence-major)."""
    nt = -(-T // 64)
    cu = torch.arange(0, (N + 1) * T, T, dtype=torch.int32, device=device)
    seq = torch.arange(N, dtype=torch.int32, device=device).repeat_interleave(nt)
    chunk = torch.arange(nt, dtype=torch.int32, device=device).repeat(N)
    return cu, torch.stack([seq, chunk], 1).contiguous()


def ag_hopper(
    k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, bnd: Tensor | None = None, v: Tensor | None = None,
    rev: tuple[Tensor, Tensor] | None = None, q: Tensor | None = None, blocks: int = 0, quad: bool = False,
    lab: frozenset[str] = frozenset(),
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`wy_gdn_ag`'s outputs and sums (its arguments, checked there) on this kernel: (ag `[B, T, HV, 64]` in k's
    dtype, gcum fp32 `[B, T, HV]`), bnd and rev filled where given. Raises ValueError where `ag_hopper_refusal`
    gives a reason. blocks, quad, lab: `_build`'s (lab knobs; the defaults: ptxas free, the dense products, the
    whole pass)."""
    B, T, Hk, K = k.shape
    HV = g.shape[2]
    BT = index.chunk_size
    why = tilelang_refusal_cached(_WHAT, K, v.shape[-1] if v is not None else 128, BT, k.device)
    if why is not None:
        raise ValueError(why)
    if k.dtype not in (torch.bfloat16, torch.float16) or any(x is not None and x.dtype != k.dtype for x in (q, v)):
        raise ValueError(f"the TileLang Ag pass takes k (and q, v) in one of bf16, fp16, got k {k.dtype}")
    dev = k.device
    sums = (AG_HOPPER_SUMS["bnd"] if bnd is not None else 0) | (AG_HOPPER_SUMS["rev"] if rev is not None else 0)
    build = (HV, Hk, TL_DTYPES[k.dtype], TL_DTYPES[g.dtype], TL_DTYPES[beta.dtype], sums, blocks, quad, lab)
    kern = None if build_beside(("ag_hopper", *build), _build, *build) else _build(*build)
    if index.is_varlen:
        cu, ci = index.cu_seqlens.int(), index.chunk_indices.int()
    else:
        cu, ci = dense_chunk_table(B, T, dev)
    N = B * T
    ag = torch.empty(B, T, HV, BT, dtype=k.dtype, device=dev)
    gcum = torch.empty(B, T, HV, dtype=torch.float32, device=dev)
    chunk_scratch = stand_in(dev, torch.float32, 1, HV, 2)  # (for the sums a build leaves unwritten)
    rp, rc = rev if rev is not None else (stand_in(dev, torch.float32, 1, HV), chunk_scratch)
    args = [
        (q if q is not None else k).reshape(N, Hk, K), k.reshape(N, Hk, K),
        (v if v is not None else stand_in(dev, k.dtype, 1, HV, 128)).reshape(-1, HV, 128),
        g.reshape(N, HV), beta.reshape(N, HV), cu, ci, ag.view(N, HV, BT), gcum.view(N, HV),
        bnd if bnd is not None else chunk_scratch, rp.view(-1, HV), rc,
    ]  # fmt: skip
    if kern is not None and N and ci.shape[0]:
        kern(*args)
    return ag, gcum
