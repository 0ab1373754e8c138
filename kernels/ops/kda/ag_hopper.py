"""KDA's Ag pass as one TileLang kernel per (chunk, value head) on Hopper: what the Triton pass
`kernels.ops.kda.wy_ag.wy_kda_ag` stores in its `gated` variant (Ag, Aqk and the gated keys `GatedKeys`: qg, ke, kd,
G_C; with `bnd` the forward's decay-bound summary), with one warpgroup's tensor-core products. Its CPU mirror is
`kernels.ops.kda.ag_torch.kda_ag_blocks` (the same decomposition in torch), which CI tests against the fp64 solve;
this kernel is tested against the mirror and the Triton pass on the GPU. Written in session 28 without a GPU.

Per chunk of C = 64 rows (module docstring of `ag_torch` for the math; G the in-chunk cumsum of the floored per-key
gate, r_I block I's reference per key):

    G      the [64, 128] gate tile loaded by all threads at once into shared memory, then one thread per key
           column: the running sum of its 64 gates (128 threads, K = 128 columns)
    fast   every key's span in every 16-row block < FAST_SPAN (a flag per chunk); r_I the block's midpoint, else
           the gate before it
    qg, ke, kd, G_C    elementwise from q, k, G (stored directly, rows below the sequence's end)
    per block I: R_I (hi, lo) [64, 128] and L_I (k; q hi, lo) [16, 128] in bf16 shared tiles, then four 64x16x128
           warpgroup products: A^T's columns of block I = R_hi Lk^T, Aqk^T's = R_hi Lq_hi^T + R_lo Lq_hi^T +
           R_hi Lq_lo^T (the lo parts keep Aqk at fp32 accuracy: bf16 operands alone doubled o's error)
    not fast: the diagonal blocks elementwise (each of 1024 entries by one thread over the 128 keys, every exponent
           <= 0), exact for any gate
    T = (I + A)^-1 by GDN's block solve (`kernels.ops.gdn.ag_hopper.ag_macros`), Ag = T diag(beta)

Lab build `chunk_ref` (session 33, exact; compiled for sm_90a, 166-167 registers, no spills, 106 KB of shared
memory: two programs an SM as the default's; not yet run): where every key's span across the whole chunk is under
FAST_SPAN (lb -1: ~32), one reference a key for the chunk (the midpoint of 0 and G's last row) and R formed once for
the four blocks, not once a block (session 30's lab: R's four tiles ~1.2 ms of the pass's 2.28 at 1x64K); the
blocks' L tiles and products unchanged. Its mirror: `kda_ag_blocks(chunk_ref=True)`.

Sizes: K = V = 128, chunk 64, bf16 (fp16 refused: the operands' factors reach e^50 in the fast case), sm_90,
TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; anything else is refused in one line. Plan:
`LaunchPlan.ag_pass` ("tilelang" for KDA too; "auto" takes it only when `KDA_AG_HOPPER_AUTO` is on).
"""

import functools
from typing import Any

import torch
from torch import Tensor

from kernels.common.decay import GATE_FLOOR
from kernels.common.index import ChunkIndex
from kernels.ops.gdn.ag_hopper import AG_LAB_SWITCHES, SOLVE_LAB_SWITCHES, ag_macros, dense_chunk_table
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
from kernels.ops.kda.ag_torch import FAST_SPAN
from kernels.parallel_compile import build_beside
from kernels.plan import LaunchPlan

__all__ = [
    "KDA_AG_EXACT_SWITCHES",
    "KDA_AG_HOPPER_AUTO",
    "KDA_AG_LAB_SWITCHES",
    "kda_ag_hopper",
    "kda_ag_hopper_refusal",
    "kda_ag_hopper_wanted",
]

_WHAT = "KDA Ag pass"  # how the refusals name this kernel
_THREADS = 128
# the lab's switches (`benchmarks/ag_pass_lab.py --kda-builds`; as GDN's `AG_LAB_SWITCHES`, timing only): each leaves
# one part of a program out; the solve's two are GDN's
KDA_AG_LAB_SWITCHES = {
    "no_keys": "no qg, ke, kd stores",
    "no_blocks": "none of the four blocks' operands and products (A^T, Aqk from cleared tiles)",
    "no_block_operands": "the blocks' products on operand tiles not filled (no exps, casts or shared stores for them)",
    "no_block_gemms": "the blocks' operands without their products (the accumulators cleared)",
    "no_store": "no Ag, Aqk stores, nor their staging",
    **{s: AG_LAB_SWITCHES[s] for s in sorted(SOLVE_LAB_SWITCHES)},
    # (exact: the default's outputs up to rounding; `KDA_AG_EXACT_SWITCHES`)
    "chunk_ref": "one reference a key for the whole chunk where every key's span across it is under FAST_SPAN (the "
    "midpoint of 0 and G's last row): the R tile formed once for all four blocks, not once a block (session 33; "
    "compiled, not yet run)",
}
# the switches that change how, not what (their GPU test checks them against the mirror)
KDA_AG_EXACT_SWITCHES = frozenset({"chunk_ref"})
# whether `LaunchPlan.ag_pass = "auto"` takes this kernel for KDA. On since session 30: after the gate tile's load fix
# (session 29) it is right on the H200 and faster than the Triton gated pass, 2.28 vs 3.35 ms at 1x64K, HV 16
# (3.40 storing T), 4.51 vs 6.77 at 1x128K (benchmarks/results/ag_pass_lab_s30_h200.md)
KDA_AG_HOPPER_AUTO = True


def kda_ag_hopper_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


def kda_ag_hopper_wanted(k: Tensor, BT: int, launch: LaunchPlan | None, v: Tensor | None) -> bool:
    """Whether KDA's Ag pass runs on this kernel under the plan's `ag_pass`: "tilelang" always (a ValueError with the
    refusal's reason where it cannot run, fp16 included); "triton" never; "auto" when `KDA_AG_HOPPER_AUTO` is on, in
    bf16 where nothing refuses it."""
    mode = launch.ag_pass if launch is not None else "auto"
    if mode == "tilelang" and k.dtype != torch.bfloat16:
        raise ValueError(f"LaunchPlan(ag_pass='tilelang'): the TileLang {_WHAT} takes bf16 q, k, got {k.dtype}")
    return tilelang_chosen("ag_pass", mode, _WHAT, k.shape[-1], v.shape[-1] if v is not None else 128, BT, k.device,
                           auto=KDA_AG_HOPPER_AUTO and k.dtype == torch.bfloat16)  # fmt: skip


@functools.cache
def _build(H: int, Hk: int, scale: float, gdt: str, bdt: str, bound: bool, store_t: bool = False,
           lab: frozenset[str] = frozenset()) -> Any:  # fmt: skip
    """The compiled kernel for these heads, scale, gate and beta dtypes, with or without the bound summary and T's
    store (TileLang JIT, cached on disk by TileLang too); lab: `KDA_AG_LAB_SWITCHES` (timing only)."""
    import tilelang
    import tilelang.language as T

    check_lab(lab, KDA_AG_LAB_SWITCHES)

    K = V = 128
    C = 64
    G = H // Hk
    io = "bfloat16"
    fp32 = "float32"
    ntok, nseq, nchunk = T.dynamic("ntok"), T.dynamic("nseq"), T.dynamic("nchunk")
    nv, nb, ntt = T.dynamic("nv"), T.dynamic("nb"), T.dynamic("ntt")  # (without the bound, T: one-row stand-ins)
    floor = float(GATE_FLOOR)
    ninf = -float("inf")

    @hopper_jit()
    def build() -> Any:
        mac = ag_macros(T, lab=lab & SOLVE_LAB_SWITCHES)

        @T.macro
        def block_products(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f, pq_f, fastv, I,
                           form_r=True):  # fmt: skip
            """A^T's and Aqk's columns of block I (python int): R_I (unless form_r is False: `chunk_r`'s, formed
            once for all four blocks), L_I, four 64x16x128 products."""
            if "no_block_operands" not in lab:
                # each factor formed once (a let), then its bf16 hi and lo parts (session 29's build formed it twice:
                # twice the exps and the shared loads of the R tile)
                if form_r:
                    for r, c in T.Parallel(C, K):
                        x = T.if_then_else(r < 16 * I + 16 * fastv, T.cast(k_s[r, c], fp32) * T.exp(r_s[I, c] - gs_s[r, c]),
                                           0)  # fmt: skip
                        rh_f[r, c] = T.cast(x, io)
                        rl_f[r, c] = T.cast(x - T.cast(T.cast(x, io), fp32), io)
                for r, c in T.Parallel(16, K):
                    e = T.exp(gs_s[16 * I + r, c] - r_s[I, c])
                    xq = T.cast(q_s[16 * I + r, c], fp32) * e
                    lk_s[r, c] = T.cast(T.cast(k_s[16 * I + r, c], fp32) * e, io)
                    lqh_s[r, c] = T.cast(xq, io)
                    lql_s[r, c] = T.cast(xq - T.cast(T.cast(xq, io), fp32), io)
                T.fence_proxy_async()
            if "no_block_gemms" in lab:
                T.clear(pk_f)
                T.clear(pq_f)
            else:
                T.gemm(rh_f, lk_s, pk_f, transpose_B=True, clear_accum=True)
                T.gemm(rh_f, lqh_s, pq_f, transpose_B=True, clear_accum=True)
                T.gemm(rl_f, lqh_s, pq_f, transpose_B=True)
                T.gemm(rh_f, lql_s, pq_f, transpose_B=True)
            # A^T[j, i] = beta_i A_ij for j < i; Aqk[i, j] = scale (q-gram) for j <= i (i = 16 I + c, j = r)
            for r, c in T.Parallel(C, 16):
                at_s[r, 16 * I + c] = T.if_then_else(r < 16 * I + c, pk_f[r, c] * b_s[16 * I + c], 0)
                aq_s[16 * I + c, r] = T.cast(T.if_then_else(r <= 16 * I + c, pq_f[r, c] * scale, 0), io)

        @T.macro
        def chunk_r(k_s, gs_s, rc_s, rh_f, rl_f):
            """(chunk_ref) R = k o e^(rc - G) over all 64 rows, once for the four blocks of a chunk whose every key
            spans under FAST_SPAN (rc: the midpoint of 0 and G's last row; factors within e^(+-FAST_SPAN / 2), as a
            fast block's). Rows past a block's end enter its products too: their entries lie above A's diagonal
            (factors up to e^FAST_SPAN, inf possible in fp32), which the blocks never select."""
            for r, c in T.Parallel(C, K):
                x = T.cast(k_s[r, c], fp32) * T.exp(rc_s[c] - gs_s[r, c])
                rh_f[r, c] = T.cast(x, io)
                rl_f[r, c] = T.cast(x - T.cast(T.cast(x, io), fp32), io)

        @T.macro
        def diagonal_exact(q_s, k_s, gs_s, b_s, at_s, aq_s, tx):
            """The four diagonal blocks elementwise (the chunk is not fast): entry e = tx + 128 m of block e // 256,
            row i = e // 16 % 16, column j = e % 16, summed over the keys with every exponent <= 0."""
            ak = T.alloc_var(fp32)
            aq = T.alloc_var(fp32)
            for m in T.serial(8):
                ri = (tx + 128 * m) // 256 * 16 + (tx + 128 * m) // 16 % 16
                rj = (tx + 128 * m) // 256 * 16 + (tx + 128 * m) % 16
                ak = 0.0
                aq = 0.0
                for d in T.serial(K):
                    ak = ak + T.cast(k_s[ri, d], fp32) * T.cast(k_s[rj, d], fp32) * T.exp(
                        T.min(gs_s[ri, d] - gs_s[rj, d], 0.0))  # fmt: skip
                    aq = aq + T.cast(q_s[ri, d], fp32) * T.cast(k_s[rj, d], fp32) * T.exp(
                        T.min(gs_s[ri, d] - gs_s[rj, d], 0.0))  # fmt: skip
                at_s[rj, ri] = T.if_then_else(rj < ri, ak * b_s[ri], 0)
                aq_s[ri, rj] = T.cast(T.if_then_else(rj <= ri, aq * scale, 0), io)

        @T.macro
        def all_blocks(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f, pq_f, fastv, tx):  # fmt: skip
            """A^T and Aqk by the four blocks (`block_products`), the diagonal blocks exact where the chunk is not
            fast."""
            for I in range(4):
                block_products(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f, pq_f, fastv,
                               I)  # fmt: skip
            if fastv == 0:
                diagonal_exact(q_s, k_s, gs_s, b_s, at_s, aq_s, tx)

        @T.prim_func
        def kda_ag_pass(
            q: T.Tensor((ntok, Hk, K), io), k: T.Tensor((ntok, Hk, K), io), v: T.Tensor((nv, H, V), io),
            g: T.Tensor((ntok, H, K), gdt), beta: T.Tensor((ntok, H), bdt),
            cu: T.Tensor((nseq + 1,), "int32"), ci: T.Tensor((nchunk, 2), "int32"),
            ag: T.Tensor((ntok, H, C), io), aqk: T.Tensor((ntok, H, C), io),
            qg: T.Tensor((ntok, H, K), io), ke: T.Tensor((ntok, H, K), io), kd: T.Tensor((ntok, H, K), io),
            gc: T.Tensor((nchunk, H, K), fp32), bnd: T.Tensor((nb, H, 2), fp32), tt: T.Tensor((ntt, H, C), io),
        ):  # fmt: skip
            with T.Kernel(nchunk * H, threads=_THREADS) as (bid,):
                i_c = bid // H
                i_h = bid % H
                i_hk = i_h // G
                tx = T.get_thread_binding()
                t0 = T.alloc_var("int32")
                eos = T.alloc_var("int32")
                t0 = cu[ci[i_c, 0]] + ci[i_c, 1] * C
                eos = cu[ci[i_c, 0] + 1]

                q_s = T.alloc_shared((C, K), io)
                k_s = T.alloc_shared((C, K), io)
                # G, its rows padded by 8 words: the R tiles read it in the products' register layout (8 rows x 8
                # columns a warp), which on 128-word rows is an 8-way bank conflict and on 136-word rows none
                gs_s = T.alloc_shared((C, K + 8), fp32)
                r_s = T.alloc_shared((4, K), fp32)  # the blocks' references
                sp_s = T.alloc_shared((K,), fp32)  # each key's largest block span
                b_s = T.alloc_shared((C,), fp32)
                lk_s = T.alloc_shared((16, K), io)
                lqh_s = T.alloc_shared((16, K), io)
                lql_s = T.alloc_shared((16, K), io)
                at_s = T.alloc_shared((C, C), fp32)  # A^T; then the solve's
                aq_s = T.alloc_shared((C, C), io)  # Aqk staged for its store
                dinv_s = T.alloc_shared((C, C), fp32)
                dinvt_s = T.alloc_shared((C, C), fp32)
                n_s = T.alloc_shared((C, C), fp32)
                ag_s = T.alloc_shared((C, C), io)
                # q, k swizzled (TMA writes them so): the R tiles' reads of k, 8 rows a warp, then spread over the banks
                T.annotate_layout({x: tilelang.layout.make_swizzled_layout(x) for x in (q_s, k_s)})
                rh_f = T.alloc_fragment((C, K), io)  # R_I's hi and lo parts: the products' register operands
                rl_f = T.alloc_fragment((C, K), io)
                pk_f = T.alloc_fragment((C, 16), fp32)
                pq_f = T.alloc_fragment((C, 16), fp32)
                n_f = T.alloc_fragment((C, C), fp32)
                n2_f = T.alloc_fragment((C, C), fp32)
                n3_f = T.alloc_fragment((C, C), fp32)
                t_f = T.alloc_fragment((C, C), fp32)
                t_l = T.alloc_local((16,), fp32)
                acc = T.alloc_var(fp32)
                fastv = T.alloc_var("int32")
                if "chunk_ref" in lab:
                    fastc = T.alloc_var("int32")  # 1: every key's span across the chunk under FAST_SPAN
                    rc_s = T.alloc_shared((K,), fp32)  # the chunk's reference a key
                    spc_s = T.alloc_shared((K,), fp32)  # each key's span across the chunk

                # q, k by TMA under the gate's cumsum; a partial chunk's rows past the sequence load the next one's (or
                # zeros past the tensor): finite, and cut where they could reach a kept value (gate 0 and beta 0
                # there: G repeats the last row's, A's rows are zero, the rows' outputs are not stored)
                loaded = T.alloc_barrier(arrive_count=_THREADS)
                T.tma_copy(q[t0 : t0 + C, i_hk, :], q_s, barrier=loaded)
                T.tma_copy(k[t0 : t0 + C, i_hk, :], k_s, barrier=loaded)
                T.barrier_arrive(loaded)
                for r in T.Parallel(C):
                    b_s[r] = masked_load(T, t0 + r < eos, beta, (T.min(t0 + r, eos - 1), i_h), fp32)
                # G: the chunk's gates loaded by every thread at once, then thread tx sums key column tx down the
                # chunk in shared memory. (Session 28's thread summed its column straight from memory: 64 loads in a
                # dependent chain, the likely cause of the 2.1 ms of 4.0 at 1x64K that none of the lab's switches
                # took away on the H200, `benchmarks/results/ag_pass_lab_parts_s29_h200.md`)
                for r, c in T.Parallel(C, K):
                    gs_s[r, c] = T.cast(g[T.min(t0 + r, eos - 1), i_h, c], fp32)
                T.sync_threads()
                acc = 0.0
                for r in T.unroll(C):
                    acc = acc + T.if_then_else(t0 + r < eos, T.max(gs_s[r, tx], floor), 0.0)
                    gs_s[r, tx] = acc
                sp_s[tx] = T.max(T.max(0.0 - gs_s[15, tx], gs_s[15, tx] - gs_s[31, tx]),
                                 T.max(gs_s[31, tx] - gs_s[47, tx], gs_s[47, tx] - gs_s[63, tx]))  # fmt: skip
                if "chunk_ref" in lab:  # (G is non-increasing down the chunk from 0: its span is -G's last row)
                    spc_s[tx] = 0.0 - gs_s[C - 1, tx]
                    rc_s[tx] = 0.5 * gs_s[C - 1, tx]
                T.sync_threads()
                fastv = 1
                for c in T.serial(K):
                    if sp_s[c] >= FAST_SPAN:
                        fastv = 0
                if "chunk_ref" in lab:
                    fastc = 1
                    for c in T.serial(K):
                        if spc_s[c] >= FAST_SPAN:
                            fastc = 0
                r_s[0, tx] = T.if_then_else(fastv == 1, 0.5 * gs_s[15, tx], 0.0)
                r_s[1, tx] = T.if_then_else(fastv == 1, 0.5 * (gs_s[15, tx] + gs_s[31, tx]), gs_s[15, tx])
                r_s[2, tx] = T.if_then_else(fastv == 1, 0.5 * (gs_s[31, tx] + gs_s[47, tx]), gs_s[31, tx])
                r_s[3, tx] = T.if_then_else(fastv == 1, 0.5 * (gs_s[47, tx] + gs_s[63, tx]), gs_s[47, tx])
                # (chunk_ref) the blocks' L tiles then take the chunk's reference too (a build-time test, a run-time one)
                if "chunk_ref" in lab:  # noqa: SIM102
                    if fastc == 1:
                        for I in T.unroll(4):
                            r_s[I, tx] = rc_s[tx]
                gc[i_c, i_h, tx] = gs_s[C - 1, tx]

                # the gated keys (every factor e^(<= 0))
                T.barrier_wait(loaded, 0)
                for r, c in T.Parallel(C, K):
                    if t0 + r < eos and "no_keys" not in lab:
                        qg[t0 + r, i_h, c] = T.cast(scale * T.cast(q_s[r, c], fp32) * T.exp(gs_s[r, c]), io)
                        ke[t0 + r, i_h, c] = T.cast(T.cast(k_s[r, c], fp32) * T.exp(gs_s[r, c]), io)
                        kd[t0 + r, i_h, c] = T.cast(T.cast(k_s[r, c], fp32) * T.exp(gs_s[C - 1, c] - gs_s[r, c]), io)

                if bound:
                    # the decay-bound summary: x = each token's largest floored gate over the keys (0 past the end)
                    xf = T.alloc_fragment((C, 32), fp32)
                    x_s = T.alloc_shared((C,), fp32)
                    kk_s = T.alloc_shared((C,), fp32)
                    vv_s = T.alloc_shared((C,), fp32)
                    l_s = T.alloc_shared((C,), fp32)
                    cl_s = T.alloc_shared((C,), fp32)
                    al_s = T.alloc_shared((C,), fp32)
                    e_s = T.alloc_shared((C,), fp32)
                    em_s = T.alloc_shared((C,), fp32)
                    # (each of the two reads every column block's loads at once into one fragment, then reduces
                    # once: a reduction per block put a barrier between the blocks' loads, four global latencies in
                    # a row, twice)
                    T.fill(xf, ninf)
                    for i_b in T.unroll(K // 32):
                        for r, c in T.Parallel(C, 32):
                            xf[r, c] = T.max(xf[r, c], T.if_then_else(t0 + r < eos, T.max(
                                T.cast(g[T.min(t0 + r, eos - 1), i_h, i_b * 32 + c], fp32), floor), 0.0))  # fmt: skip
                    T.reduce_max(xf, x_s, dim=1)
                    mac.row_squares(k_s, xf, kk_s)
                    mac.bound_logs(x_s, b_s, kk_s, l_s, cl_s, al_s)
                    T.clear(xf)
                    for i_b in T.unroll(V // 32):  # ||v||^2 straight from v (0 past the end: beta is 0 there)
                        for r, c in T.Parallel(C, 32):
                            xv = T.if_then_else(t0 + r < eos, T.cast(v[T.min(t0 + r, eos - 1), i_h, i_b * 32 + c], fp32),
                                                0.0)  # fmt: skip
                            xf[r, c] = xf[r, c] + xv * xv
                    T.reduce_sum(xf, vv_s, dim=1)
                    mac.chunk_bound(b_s, kk_s, vv_s, e_s, em_s, cl_s, al_s, bnd, i_c, i_h, tx)

                if "no_blocks" in lab:
                    T.clear(at_s)
                    T.clear(aq_s)
                elif "chunk_ref" in lab:
                    if fastc == 1:
                        chunk_r(k_s, gs_s, rc_s, rh_f, rl_f)
                        for I in range(4):
                            block_products(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f,
                                           pq_f, fastv, I, False)  # fmt: skip
                    else:
                        all_blocks(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f, pq_f,
                                   fastv, tx)  # fmt: skip
                else:
                    all_blocks(q_s, k_s, gs_s, r_s, rh_f, rl_f, lk_s, lqh_s, lql_s, b_s, at_s, aq_s, pk_f, pq_f, fastv,
                               tx)  # fmt: skip
                T.sync_threads()

                mac.block_solve(at_s, dinv_s, dinvt_s, n_s, t_l, n_f, n2_f, n3_f, t_f, tx)
                # Ag = T diag(beta) (zeros above the diagonal) and Aqk, staged: every thread's writes fenced and synced
                # before either store reads them (`kernels.ops.gdn.reverse_bwd`'s lesson of session 24)
                if "no_store" not in lab:
                    for r, c in T.Parallel(C, C):
                        ag_s[r, c] = T.cast(T.if_then_else(r >= c, t_f[r, c] * b_s[c], 0), io)
                    T.fence_proxy_async()
                    T.sync_threads()
                    mac.store_rows(ag_s, ag, t0, eos, i_h)
                    mac.store_rows(aq_s, aqk, t0, eos, i_h)
                if store_t:  # T itself for the backward (`kernels.ops.kda.ag_bwd`: no `wy_inverse` there)
                    tt_s = T.alloc_shared((C, C), io)
                    for r, c in T.Parallel(C, C):
                        tt_s[r, c] = T.cast(T.if_then_else(r >= c, t_f[r, c], 0), io)
                    T.fence_proxy_async()
                    T.sync_threads()
                    mac.store_rows(tt_s, tt, t0, eos, i_h)

        return kda_ag_pass

    return build()


def kda_ag_hopper(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex, bnd: Tensor | None = None,
    v: Tensor | None = None, store_t: bool = False, lab: frozenset[str] = frozenset(),
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]]:  # fmt: skip
    """`wy_kda_ag`'s gated outputs (its arguments, checked there) on this kernel: (ag, aqk `[B, T, HV, 64]` bf16,
    (qg, ke, kd `[B, T, HV, K]` bf16, gc `[NT, HV, K]` fp32, T = (I + A)^-1 `[B, T, HV, 64]` bf16 with store_t, else
    None)), bnd filled where given (it needs v). Raises ValueError where `kda_ag_hopper_refusal` gives a reason or q,
    k are not bf16. lab: `_build`'s (timing only)."""
    B, T, Hk, K = k.shape
    HV = g.shape[2]
    BT = index.chunk_size
    why = tilelang_refusal_cached(_WHAT, K, v.shape[-1] if v is not None else 128, BT, k.device)
    if why is not None:
        raise ValueError(why)
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or (v is not None and v.dtype != torch.bfloat16):
        raise ValueError(f"the TileLang {_WHAT} takes q, k (and v) in bf16, got q {q.dtype}, k {k.dtype}")
    dev = k.device
    build = (HV, Hk, float(scale), TL_DTYPES[g.dtype], TL_DTYPES[beta.dtype], bnd is not None, store_t, lab)
    kern = None if build_beside(("kda_ag_hopper", *build), _build, *build) else _build(*build)
    if index.is_varlen:
        cu, ci = index.cu_seqlens.int(), index.chunk_indices.int()
    else:
        cu, ci = dense_chunk_table(B, T, dev)
    N = B * T
    ag = torch.empty(B, T, HV, BT, dtype=k.dtype, device=dev)
    aqk = torch.empty_like(ag)
    qg, ke, kd = (k.new_empty(B, T, HV, K) for _ in range(3))
    gc = torch.empty(index.num_chunks, HV, K, dtype=torch.float32, device=dev)
    tt = torch.empty_like(ag) if store_t else None
    v_in = v if v is not None else stand_in(dev, k.dtype, 1, HV, 128)  # (stand-ins: what this build leaves unread)
    args = [q.reshape(N, Hk, K), k.reshape(N, Hk, K), v_in.reshape(-1, HV, 128),
            g.reshape(N, HV, K), beta.reshape(N, HV), cu, ci, ag.view(N, HV, BT), aqk.view(N, HV, BT),
            qg.view(N, HV, K), ke.view(N, HV, K), kd.view(N, HV, K), gc,
            bnd if bnd is not None else stand_in(dev, torch.float32, 1, HV, 2),
            tt.view(N, HV, BT) if tt is not None else stand_in(dev, k.dtype, 1, HV, BT)]  # fmt: skip
    if kern is not None and N and ci.shape[0]:
        kern(*args)
    return ag, aqk, (qg, ke, kd, gc, tt)
