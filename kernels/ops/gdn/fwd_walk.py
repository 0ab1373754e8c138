"""GDN's forward state+output pass as one warp-specialised TileLang walk per (range, value head, value block)
(Hopper): the same decomposition as the Triton pass `kernels.ops.gdn.fused` (FlashQLA's two-kernel forward), with
the chunk loop split over four warpgroups that run side by side; and KDA's in the gated form (the build's gate
"vector", below). Its CPU mirror is `kernels.common.fwd_walk_torch` (the kernel's arguments and per-chunk steps, in
torch), which CI tests against the per-token references; this kernel is tested against that mirror and the Triton
pass on the GPU.

Per chunk of C = 64 rows (G the in-chunk gate cumsum, eG = e^G, gl = e^(G_last), eR = e^(G_last - G); S `[K, BV]`
fp32, the state entering the chunk, in the S warpgroup's registers):

    U  = K S,   W = V - eG o U,   Vd = Ag W               (the V warpgroup)
    O  = scale (eG o (Q S) + (Q K^T o Gam, i >= j) Vd)    (the O warpgroup; OUTPUT)
    S' = gl S + K^T (eR o Vd)                             (the S warpgroup)

Roles (512 threads): S (threads 0-127) holds the state, writes its bf16 copy for U and Q S (and STORE_H's store),
scales and updates it; V (128-255) forms eG, eR, W, Vd and eR o Vd; O (256-383) forms P and the output; the producer
(384-511): one warp loads q and k by TMA, one v and Ag, one the gate cumsum, into two buffers (the next chunk's load
runs under this chunk's products), and one stores o and the chunk states by TMA. Registers per role by
`T.set_max_nreg`. Each step starts when every role has finished the one before (one barrier), then the roles wait
only on what they read: the state copy, Vd, eR o Vd, the staged o.

A range's last chunk may be partial: its loads run past the range by TMA (the next range's rows, or zeros past the
tensor), and the rows past it are cut where they could reach a kept value: W's rows and eR are zero there (no term
of the state update), the gate cumsum repeats the last row's, and o is stored row by row below the range's end.
Ag is zero above its diagonal (`kernels.ops.gdn.wy_ag`), so the rows of a chunk never read the rows after them.

KDA (gate "vector", session 28; not yet run on a GPU): the Ag pass's gated form (`kernels.ops.kda.wy_ag.GatedKeys`:
qg = scale Q e^G, ke = K e^G, kd = K e^(G_C - G) `[B, T, HV, K]` at the value heads, G_C `[NT, HV, K]` fp32 at the
chunk's last row in the range, and Aqk, scale included, written on and below its diagonal) makes every per-key decay
a dot or one diagonal:

    W  = V - ke S,   Vd = Ag W  (0 past the range)        (V)
    O  = qg S + Tril(Aqk) Vd                              (O; OUTPUT)
    S' = diag(e^(G_C)) S + kd^T Vd                        (S)

The gate warp loads e^(G_C) `[K]` per chunk; the q, k warp also kd, the v, Ag warp also Aqk (OUTPUT); O reads Aqk
into registers, cut to j <= i by a select (nothing above the diagonal is written), the A operand of P Vd. Vd's rows
past the range are zeroed in its tile itself (o's kept rows read only Vd's rows at or above theirs), so S reads it
directly: no eR o Vd tile, no eG, eR, P tiles, and h_rdy waits for S alone. Shared memory at BV 128: q, k, kd, v in
two buffers (4 x 32 KiB), Ag and Aqk in two (2 x 16 KiB), the state's copy 32 KiB, Vd and the staged o 16 KiB each,
e^(G_C) 1 KiB: 230400 bytes of the 231424 the launch can have beside its static barriers (GDN's: 205824).

Modes (run-time bits of one build, `FWD_WALK_MODES`, so the forward and the backward's state recompute share it):
OUTPUT (o), STORE_H (the state entering every chunk into h `[NT, H, K, V]` in k's dtype: the backward's state
recompute, as `kernels.common.chunk_state.chunk_state_ag_fwd`), H0 (each program's entering state `[P, H, K, V]` fp32);
each program's leaving state goes to ht[final_idx[p]] where that is >= 0. Sizes: K = V = 128, chunk 64, BV 128
(`DEFAULT_BV`) or 64, sm_90, TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; anything else is refused in
one line. In `kernels.parallel_compile.compile_ahead`'s dry run the kernel builds beside the Triton compiles.
"""

import functools
from typing import Any

import torch
from torch import Tensor

from kernels.common.chunk_state import SeqLayout
from kernels.common.index import ChunkIndex
from kernels.common.seqsplit import SPLIT_MIN_SEG_CHUNKS
from kernels.configs import cdiv
from kernels.ops.gdn.tilelang_hopper import (
    TL_DTYPES,
    hopper_jit,
    stand_in,
    tilelang_chosen,
    tilelang_refusal,
    tilelang_refusal_cached,
)
from kernels.parallel_compile import build_beside
from kernels.plan import LaunchPlan

__all__ = [
    "DEFAULT_BV",
    "FWD_WALK_BV",
    "FWD_WALK_GATES",
    "FWD_WALK_MODES",
    "KDA_WALK_AUTO",
    "WAVE_MIN_FILL",
    "wave_seg_chunks",
    "fwd_walk_refusal",
    "fwd_walk_tilelang",
    "fwd_walk_wanted",
]

FWD_WALK_BV = (64, 128)
# H200, session 26 (benchmarks/results/fwd_walk_lab_s26_h200.md): with the spill-free register counts below, value
# blocks of 128 (one program per (range, head)) beat 64 at every shape timed: the output pass 0.53 -> 0.39 ms, the
# state pass 0.38 -> 0.32 at 1x64K and 8x8K (session 25's 128, at counts that spilled, was the slower one)
DEFAULT_BV = 128
# the run-time modes (bits of the kernel's `modes` argument): one build serves the forward and the state recompute
FWD_WALK_MODES = {"output": 1, "store_h": 2, "h0": 4}
# the builds' gate forms: GDN's scalar gate; KDA's per-key gate in the Ag pass's gated form (module docstring)
FWD_WALK_GATES = ("scalar", "vector")
# `LaunchPlan.fwd_pass` "auto" for KDA: the walk's gated build, since session 29 (H200, GPU tests passed,
# benchmarks/results/kda_fused_lab_s29_h200.md): the state+output launch 0.86 ms at 1x128K, HV 16, against the Triton
# gated pass's 2.20 (1.75 with TMA; floor 0.77), 0.43 against 1.13 at 8x8K; o's error unchanged (3.0e-3)
KDA_WALK_AUTO = True
_THREADS = 512
_WHAT = "forward walk"  # how the refusals name this kernel
# The walk's split (`wave_seg_chunks`): one long-lived program per (range, head) holds a whole SM, so the split aims at
# one wave: as many segments per sequence as fit the SMs once, every program walking about as many chunks (H200,
# session 25, benchmarks/results/fwd_walk_lab_s25_h200.md: 272 programs on 132 SMs left a third wave nearly empty);
# below WAVE_MIN_FILL x SMs programs of the plain pass, and not where a sequence would get fewer than two segments.
WAVE_MIN_FILL = 0.7
# Registers per thread of each role by value block (`T.set_max_nreg`; multiples of 8, the four summing to at most
# 65536 / 128 = 512; a role above the launch's 128 asks for more, one below gives back). ptxas compiles each role's
# code at its role's count: the state [K, BV] fp32 is 64 (BV 64) or 128 (BV 128) of the S role's, V's W and Vd tile
# 32 or 64. At BV 128 the V role at 120 spilled 276 bytes a thread (`ptxas -v` on the generated source, session 25),
# which made BV 128's step 2.6x BV 64's in `fwd_walk_lab_s25_h200.md`; these counts spill none and made it 0.75x
# (session 26). BV 64 keeps the counts the H200 ran (8 bytes of spills, from the producer's 40; 160 / 120 / 168 / 56
# spill none on the CPU host's ptxas, not timed). KDA's gated form (session 28, ptxas on the CPU host): BV 128's counts
# spill none (S 152 spills 1240 bytes, V 152 192; O 128 none); at BV 64 the producer's 40 spills 4, so it takes
# 160 / 120 / 168 / 56 (none)
_NREG = {
    "scalar": {
        64: {"s": 168, "v": 120, "o": 168, "producer": 40},
        128: {"s": 160, "v": 160, "o": 144, "producer": 48},
    },
    "vector": {
        64: {"s": 160, "v": 120, "o": 168, "producer": 56},
        128: {"s": 160, "v": 160, "o": 144, "producer": 48},
    },
}


def fwd_walk_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


def fwd_walk_wanted(k: Tensor, v: Tensor, BT: int, launch: LaunchPlan, *, gated: bool = False) -> bool:
    """Whether GDN's forward pass (and the reverse walk's state recompute), or with `gated` KDA's in the gated form,
    runs on this walk under the plan's `fwd_pass`: "triton" never; "tilelang" always (a ValueError with
    `fwd_walk_refusal`'s reason where it cannot run); "auto" in bf16 (the dtype it was timed in) where nothing refuses
    it (KDA's while `KDA_WALK_AUTO` is on)."""
    return tilelang_chosen("fwd_pass", launch.fwd_pass, _WHAT, k.shape[-1], v.shape[-1], BT, k.device,
                           auto=k.dtype == v.dtype == torch.bfloat16 and (KDA_WALK_AUTO or not gated))  # fmt: skip


def wave_seg_chunks(index: ChunkIndex, *, H: int, sms: int) -> int | None:
    """Segment length (chunks) of the walk's one-wave split (`WAVE_MIN_FILL`): floor(sms / (N x H)) segments per
    sequence of the mean length, at least `kernels.common.seqsplit.SPLIT_MIN_SEG_CHUNKS` chunks; None: the plain pass.
    Shapes only."""
    rows = index.num_seqs * H
    per_seq = sms // rows
    if rows >= WAVE_MIN_FILL * sms or per_seq < 2:
        return None
    seg = max(SPLIT_MIN_SEG_CHUNKS, -(-index.num_chunks // (per_seq * index.num_seqs)))
    return None if seg >= index.max_chunks else seg


@functools.cache
def _build(H: int, Hk: int, BV: int, scale: float, io: str, gate: str = "scalar") -> Any:
    """The compiled kernel for these sizes, dtype and gate (TileLang JIT, cached on disk by TileLang too); its modes
    are run-time (`FWD_WALK_MODES`). gate "scalar": GDN's kernel; "vector": KDA's gated form (`FWD_WALK_GATES`; q, k
    then qg, ke at the value heads, Hk = H; scale unused: qg and Aqk carry it)."""
    if BV not in FWD_WALK_BV:
        raise ValueError(f"fwd walk: BV {BV}, not one of {FWD_WALK_BV}")
    if gate not in FWD_WALK_GATES or (gate == "vector" and Hk != H):
        raise ValueError(f"fwd walk: gate {gate!r} with {Hk} key heads for {H}; gates {FWD_WALK_GATES} (vector: Hk = H)")
    import tilelang.language as T

    K = V = 128
    BT = 64
    G = H // Hk
    NV = V // BV
    fp32 = "float32"
    M_OUT, M_H, M_H0 = FWD_WALK_MODES["output"], FWD_WALK_MODES["store_h"], FWD_WALK_MODES["h0"]
    # KDA's gated form: the state decays by diag(e^(G_C)) and takes kd^T Vd, P is the Ag pass's Aqk (each builder
    # branch on it is static: GDN's build generates the code it did before the flag)
    VEC = gate == "vector"
    nreg = _NREG[gate][BV]
    ntok, nrange, nprog = T.dynamic("ntok"), T.dynamic("nrange"), T.dynamic("nprog")
    nh0, nstate, nchunk = T.dynamic("nh0"), T.dynamic("nstate"), T.dynamic("nchunk")
    ngate = T.dynamic("ngate")  # (vector: G_C's chunks; h's, nchunk, may be a one-state stand-in)

    @hopper_jit()
    def build() -> Any:
        # each role's loop is a macro (the kernel's nesting of roles, loops and branches passes Python's limit of
        # statically nested blocks as one function)
        @T.macro
        def role_s(s_f, h_s, k_s, g_s, vn_s, gl, ready, free, top, h_rdy, vn_rdy, h0, ht, fin, i_p, i_h, c0, nt, modes):  # fmt: skip
            """The state: its copy for the step's products, S = gl S + K^T (eR o Vd) (vector: k_s holds kd, g_s
            e^(G_C), vn_s Vd: S = diag(e^(G_C)) S + kd^T Vd); the program's final state."""
            if modes // M_H0 % 2 == 1:
                T.copy(h0[i_p, i_h, 0:K, c0 : c0 + BV], s_f)
            else:
                T.clear(s_f)
            for i in T.serial(nt):
                T.barrier_arrive(top)
                T.barrier_wait(top, i % 2)
                T.copy(s_f, h_s)
                T.fence_proxy_async()
                T.barrier_arrive(h_rdy)
                T.barrier_wait(ready[i % 2], (i // 2) % 2)
                if VEC:
                    for r, c in T.Parallel(K, BV):
                        s_f[r, c] = s_f[r, c] * g_s[i % 2, r]
                else:
                    gl = T.exp(g_s[i % 2, BT - 1])
                    for r, c in T.Parallel(K, BV):
                        s_f[r, c] = s_f[r, c] * gl
                T.barrier_wait(vn_rdy, i % 2)
                T.gemm(k_s[i % 2, :, :], vn_s, s_f, transpose_A=True)
                T.barrier_arrive(free[i % 2])
            if fin[i_p] >= 0:
                T.copy(s_f, ht[fin[i_p], i_h, 0:K, c0 : c0 + BV])

        @T.macro
        def role_v(u_f, v_s, k_s, a_s, g_s, h_s, vd_s, vn_s, eg_s, er_s, ready, free, top, h_rdy, vd_rdy, vn_rdy, bos, eos, nt):  # fmt: skip
            """eG, eR (0 past the range), W = V - eG o (K S) (0 past the range), Vd = Ag W, eR o Vd (vector: k_s
            holds ke, W = V - ke S, Vd's rows past the range 0, no eG, eR, eR o Vd)."""
            for i in T.serial(nt):
                T.barrier_arrive(top)
                T.barrier_wait(top, i % 2)
                T.barrier_wait(ready[i % 2], (i // 2) % 2)
                if not VEC:
                    for r in T.Parallel(BT):
                        eg_s[r] = T.exp(g_s[i % 2, r])
                        er_s[r] = T.if_then_else(bos + i * BT + r < eos, T.exp(g_s[i % 2, BT - 1] - g_s[i % 2, r]), 0)
                    T.barrier_arrive(h_rdy)
                T.barrier_wait(h_rdy, i % 2)
                T.gemm(k_s[i % 2, :, :], h_s, u_f, clear_accum=True)
                if VEC:
                    for r, c in T.Parallel(BT, BV):
                        u_f[r, c] = T.if_then_else(bos + i * BT + r < eos, v_s[i % 2, r, c] - u_f[r, c], 0)
                else:
                    for r, c in T.Parallel(BT, BV):
                        u_f[r, c] = T.if_then_else(bos + i * BT + r < eos, v_s[i % 2, r, c] - eg_s[r] * u_f[r, c], 0)
                T.copy(u_f, v_s[i % 2, :, :])
                T.fence_proxy_async()
                T.gemm(a_s[i % 2, :, :], v_s[i % 2, :, :], u_f, clear_accum=True)
                if VEC:  # (o's kept rows read only the Vd rows at or above theirs: Aqk is masked above its diagonal)
                    for r, c in T.Parallel(BT, BV):
                        u_f[r, c] = T.if_then_else(bos + i * BT + r < eos, u_f[r, c], 0)
                T.copy(u_f, vd_s)
                T.fence_proxy_async()
                T.barrier_arrive(vd_rdy)
                if not VEC:
                    for r, c in T.Parallel(BT, BV):
                        u_f[r, c] = u_f[r, c] * er_s[r]
                    T.copy(u_f, vn_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(vn_rdy)
                T.barrier_arrive(free[i % 2])

        @T.macro
        def role_o(p_f, o_f, q_s, k_s, g_s, h_s, p_s, vd_s, o_s, eg_s, ready, free, top, h_rdy, vd_rdy, o_rdy, nt, modes):  # fmt: skip
            """P = scale Tril(Q K^T o Gam), o = scale eG o (Q S) + P Vd, staged for the storing warp (OUTPUT) (vector:
            q_s holds qg, k_s Aqk: P = Tril(Aqk) in the registers of p_f, o = qg S + P Vd)."""
            for i in T.serial(nt):
                T.barrier_arrive(top)
                T.barrier_wait(top, i % 2)
                if modes % 2 == M_OUT:
                    T.barrier_wait(ready[i % 2], (i // 2) % 2)
                    if VEC:
                        T.copy(k_s[i % 2, :, :], p_f)
                        for r, c in T.Parallel(BT, BT):
                            p_f[r, c] = T.if_then_else(r >= c, p_f[r, c], 0)
                    else:
                        T.gemm(q_s[i % 2, :, :], k_s[i % 2, :, :], p_f, transpose_B=True, clear_accum=True)
                        for r, c in T.Parallel(BT, BT):
                            p_f[r, c] = T.if_then_else(r >= c, p_f[r, c] * T.exp(g_s[i % 2, r] - g_s[i % 2, c]) * scale, 0)
                        T.copy(p_f, p_s)
                        T.fence_proxy_async()
                    T.barrier_wait(h_rdy, i % 2)
                    T.gemm(q_s[i % 2, :, :], h_s, o_f, clear_accum=True)
                    if not VEC:
                        for r, c in T.Parallel(BT, BV):
                            o_f[r, c] = o_f[r, c] * eg_s[r] * scale
                    T.barrier_wait(vd_rdy, i % 2)
                    T.gemm(p_f if VEC else p_s, vd_s, o_f)
                    T.copy(o_f, o_s)
                    T.fence_proxy_async()
                    T.barrier_arrive(o_rdy)
                T.barrier_arrive(free[i % 2])

        @T.macro
        def load_qk(q, k, kd, q_s, k_s, kd_s, ready, free, bos, i_hk, nt, modes):  # fmt: skip
            """q, k (vector: qg, ke and kd)."""
            for i in T.serial(nt):
                T.barrier_wait(free[i % 2], (i // 2 + 1) % 2)
                if modes % 2 == M_OUT:
                    T.tma_copy(q[bos + i * BT : bos + i * BT + BT, i_hk, :], q_s[i % 2, :, :], barrier=ready[i % 2])
                T.tma_copy(k[bos + i * BT : bos + i * BT + BT, i_hk, :], k_s[i % 2, :, :], barrier=ready[i % 2])
                if VEC:
                    T.tma_copy(kd[bos + i * BT : bos + i * BT + BT, i_hk, :], kd_s[i % 2, :, :], barrier=ready[i % 2])
                T.barrier_arrive(ready[i % 2])

        @T.macro
        def load_va(v, ag, aqk, v_s, a_s, aqk_s, ready, free, bos, i_h, c0, nt, modes):  # fmt: skip
            """v, Ag (vector: and Aqk, OUTPUT)."""
            for i in T.serial(nt):
                T.barrier_wait(free[i % 2], (i // 2 + 1) % 2)
                T.tma_copy(v[bos + i * BT : bos + i * BT + BT, i_h, c0 : c0 + BV], v_s[i % 2, :, :], barrier=ready[i % 2])
                T.tma_copy(ag[bos + i * BT : bos + i * BT + BT, i_h, :], a_s[i % 2, :, :], barrier=ready[i % 2])
                if VEC and modes % 2 == M_OUT:  # (static, then at run time)
                    T.tma_copy(aqk[bos + i * BT : bos + i * BT + BT, i_h, :], aqk_s[i % 2, :, :], barrier=ready[i % 2])
                T.barrier_arrive(ready[i % 2])

        @T.macro
        def load_g(gs, g_s, ready, free, bos, eos, boc, i_h, nt):  # fmt: skip
            """The gate cumsum, its rows past the range repeating the range's last (no decay there) (vector: e^(G_C)
            of the chunk, `[K]`, G_C at its last row in the range)."""
            for i in T.serial(nt):
                T.barrier_wait(free[i % 2], (i // 2 + 1) % 2)
                if VEC:
                    for r in T.Parallel(K):
                        g_s[i % 2, r] = T.exp(gs[boc + i, i_h, r])
                else:
                    for r in T.Parallel(BT):
                        g_s[i % 2, r] = gs[T.min(bos + i * BT + r, eos - 1), i_h]
                T.barrier_arrive(ready[i % 2])

        @T.macro
        def store_o_h(o, hs, o_s, h_s, top, h_rdy, o_rdy, bos, eos, boc, i_h, c0, nt, modes):  # fmt: skip
            """The chunk's entering state (STORE_H) and its o (OUTPUT; row by row below the range's end for a partial
            chunk: the rows past it are the next range's), each read before the step ends."""
            for i in T.serial(nt):
                T.barrier_arrive(top)
                T.barrier_wait(top, i % 2)
                if modes // M_H % 2 == 1:
                    T.barrier_wait(h_rdy, i % 2)
                    T.tma_copy(h_s, hs[boc + i, i_h, 0:K, c0 : c0 + BV])
                if modes % 2 == M_OUT:
                    T.barrier_wait(o_rdy, i % 2)
                    if bos + i * BT + BT <= eos:
                        T.tma_copy(o_s, o[bos + i * BT : bos + i * BT + BT, i_h, c0 : c0 + BV])
                    else:
                        for r, c in T.Parallel(BT, BV):
                            if bos + i * BT + r < eos:
                                o[bos + i * BT + r, i_h, c0 + c] = o_s[r, c]
                T.tma_store_wait()

        @T.macro
        def walk(q, k, kd, v, ag, aqk, gs, h0, cu, co, pmap, fin, o, ht, hs, modes):  # fmt: skip
            """The kernel's body (kd, aqk: None in the scalar build)."""
            with T.Kernel(nprog * H * NV, threads=_THREADS) as (bid,):
                i_v = bid % NV
                i_h = (bid // NV) % H
                i_p = bid // (NV * H)
                i_hk = i_h // G
                c0 = i_v * BV
                bos = T.alloc_var("int32")
                eos = T.alloc_var("int32")
                boc = T.alloc_var("int32")
                nt = T.alloc_var("int32")
                bos = cu[pmap[i_p]]
                eos = cu[pmap[i_p] + 1]
                boc = co[pmap[i_p]]
                nt = T.ceildiv(eos - bos, BT)

                # two buffers of each input (the producer fills one while the roles read the other)
                q_s = T.alloc_shared((2, BT, K), io)
                k_s = T.alloc_shared((2, BT, K), io)
                v_s = T.alloc_shared((2, BT, BV), io)  # v, then W
                a_s = T.alloc_shared((2, BT, BT), io)
                g_s = T.alloc_shared((2, K if VEC else BT), fp32)  # vector: e^(G_C)
                h_s = T.alloc_shared((K, BV), io)  # the state's copy for U = K S, Q S and STORE_H
                vd_s = T.alloc_shared((BT, BV), io)
                # (each gate form's own tiles: None in the other's build)
                vn_s = None if VEC else T.alloc_shared((BT, BV), io)  # eR o Vd
                p_s = None if VEC else T.alloc_shared((BT, BT), io)
                kd_s = T.alloc_shared((2, BT, K), io) if VEC else None
                aqk_s = T.alloc_shared((2, BT, BT), io) if VEC else None
                o_s = T.alloc_shared((BT, BV), io)
                eg_s = None if VEC else T.alloc_shared((BT,), fp32)
                er_s = None if VEC else T.alloc_shared((BT,), fp32)

                s_f = T.alloc_fragment((K, BV), fp32)
                u_f = T.alloc_fragment((BT, BV), fp32)
                o_f = T.alloc_fragment((BT, BV), fp32)
                p_f = T.alloc_fragment((BT, BT), io if VEC else fp32)  # vector: the A operand of P Vd
                gl = T.alloc_var(fp32)

                ready = T.alloc_barrier(arrive_count=[96] * 2)  # the three loading warps (and TMA's bytes)
                free = T.alloc_barrier(arrive_count=[384] * 2)  # S, V, O have read the buffer
                top = T.alloc_barrier(arrive_count=416)  # S, V, O and the storing warp finished the step before
                h_rdy = T.alloc_barrier(arrive_count=128 if VEC else 256)  # S wrote the state's copy (V eG, eR)
                vd_rdy = T.alloc_barrier(arrive_count=128)
                vn_rdy = None if VEC else T.alloc_barrier(arrive_count=128)  # (vector: S reads Vd, after vd_rdy)
                o_rdy = T.alloc_barrier(arrive_count=128)

                tx = T.get_thread_binding()
                if tx < 128:
                    T.set_max_nreg(nreg["s"], int(nreg["s"] > 128))
                    role_s(s_f, h_s, kd_s if VEC else k_s, g_s, vd_s if VEC else vn_s, gl, ready, free, top, h_rdy,
                           vd_rdy if VEC else vn_rdy, h0, ht, fin, i_p, i_h, c0, nt, modes)  # fmt: skip
                elif tx < 256:
                    T.set_max_nreg(nreg["v"], int(nreg["v"] > 128))
                    role_v(u_f, v_s, k_s, a_s, g_s, h_s, vd_s, vn_s, eg_s, er_s, ready, free, top, h_rdy, vd_rdy,
                           vn_rdy, bos, eos, nt)  # fmt: skip
                elif tx < 384:
                    T.set_max_nreg(nreg["o"], int(nreg["o"] > 128))
                    role_o(p_f, o_f, q_s, aqk_s if VEC else k_s, g_s, h_s, p_s, vd_s, o_s, eg_s, ready, free, top,
                           h_rdy, vd_rdy, o_rdy, nt, modes)  # fmt: skip
                else:
                    T.set_max_nreg(nreg["producer"], int(nreg["producer"] > 128))
                    if tx < 416:
                        load_qk(q, k, kd, q_s, k_s, kd_s, ready, free, bos, i_hk, nt, modes)
                    elif tx < 448:
                        load_va(v, ag, aqk, v_s, a_s, aqk_s, ready, free, bos, i_h, c0, nt, modes)
                    elif tx < 480:
                        load_g(gs, g_s, ready, free, bos, eos, boc, i_h, nt)
                    else:
                        store_o_h(o, hs, o_s, h_s, top, h_rdy, o_rdy, bos, eos, boc, i_h, c0, nt, modes)

        if VEC:

            @T.prim_func
            def kda_fwd_walk(
                q: T.Tensor((ntok, H, K), io), k: T.Tensor((ntok, H, K), io), kd: T.Tensor((ntok, H, K), io),
                v: T.Tensor((ntok, H, V), io), ag: T.Tensor((ntok, H, BT), io), aqk: T.Tensor((ntok, H, BT), io),
                gs: T.Tensor((ngate, H, K), fp32), h0: T.Tensor((nh0, H, K, V), fp32),
                cu: T.Tensor((nrange + 1,), "int32"), co: T.Tensor((nrange,), "int32"),
                pmap: T.Tensor((nprog,), "int32"), fin: T.Tensor((nprog,), "int32"), o: T.Tensor((ntok, H, V), io),
                ht: T.Tensor((nstate, H, K, V), fp32), hs: T.Tensor((nchunk, H, K, V), io), modes: T.int32,
            ):  # fmt: skip
                walk(q, k, kd, v, ag, aqk, gs, h0, cu, co, pmap, fin, o, ht, hs, modes)

            return kda_fwd_walk

        @T.prim_func
        def fwd_walk(
            q: T.Tensor((ntok, Hk, K), io), k: T.Tensor((ntok, Hk, K), io), v: T.Tensor((ntok, H, V), io),
            ag: T.Tensor((ntok, H, BT), io), gs: T.Tensor((ntok, H), fp32), h0: T.Tensor((nh0, H, K, V), fp32),
            cu: T.Tensor((nrange + 1,), "int32"), co: T.Tensor((nrange,), "int32"), pmap: T.Tensor((nprog,), "int32"),
            fin: T.Tensor((nprog,), "int32"),
            o: T.Tensor((ntok, H, V), io), ht: T.Tensor((nstate, H, K, V), fp32), hs: T.Tensor((nchunk, H, K, V), io),
            modes: T.int32,
        ):  # fmt: skip
            walk(q, k, None, v, ag, None, gs, h0, cu, co, pmap, fin, o, ht, hs, modes)

        return fwd_walk

    return build()


@functools.cache
def _dense_ranges(N: int, T: int, NT: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(cu, chunk offsets) int32 of N dense sequences of T tokens (NT chunks each)."""
    cu = torch.arange(0, (N + 1) * T, T, dtype=torch.int32, device=device)
    return cu, torch.arange(0, N * NT, NT, dtype=torch.int32, device=device)


@functools.cache
def _identity(n: int, device: torch.device) -> Tensor:
    """0, 1, .., n - 1 int32: the program map and final_idx of a layout without them."""
    return torch.arange(n, dtype=torch.int32, device=device)


@functools.cache
def _no_final(n: int, device: torch.device) -> Tensor:
    """n times -1 int32: final_idx when no final state is asked for."""
    return torch.full((n,), -1, dtype=torch.int32, device=device)


def fwd_walk_tilelang(
    q: Tensor | None, k: Tensor, v: Tensor, ag: Tensor, gs: Tensor, *, layout: SeqLayout, scale: float = 1.0,
    h0: Tensor | None = None, num_states: int | None = None, output_final_state: bool = False,
    num_chunks: int | None = None, BV: int | None = None, hs: Tensor | None = None, aqk: Tensor | None = None,
    kd: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """(o `[B, T, HV, V]` in k's dtype or None without q, final states fp32 or None, h `[num_chunks, HV, K, V]` in
    k's dtype or None without num_chunks) over the layout's ranges (`kernels.common.chunk_state.SeqLayout`: dense
    sequences or varlen ranges, a program map, final_idx).

    q, k `[B, T, H, K]`, v `[B, T, HV, V]`, the Ag pass's Ag `[B, T, HV, 64]` and gate cumsum gs `[B, T, HV]` fp32;
    h0 `[layout.num_programs, HV, K, V]` fp32 or None; the final states `[num_states or num_programs, HV, K, V]`
    (at `layout.final_idx` when it has one); num_chunks: the chunk states of every range (STORE_H, at the layout's
    chunk offsets; hs: the buffer to store them in, `[num_chunks, HV, K, V]` in k's dtype, else allocated here). BV: 64
    or 128, None: `DEFAULT_BV`. kd given: KDA's gated form (`kernels.ops.kda.wy_ag.GatedKeys`; the gate "vector"
    build): q, k, kd are qg, ke, kd `[B, T, HV, K]`, gs is G_C `[NT, HV, K]` fp32 at the layout's chunk offsets, aqk
    the Ag pass's Aqk `[B, T, HV, 64]` (with q), scale unused (qg and Aqk carry it). Raises ValueError where
    `fwd_walk_refusal` gives a reason."""
    B, T, Hk, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = ag.shape[-1]
    why = tilelang_refusal_cached(_WHAT, K, V, BT, k.device)
    if why is not None:
        raise ValueError(why)
    dts = {x.dtype for x in (q, k, v, ag, aqk, kd) if x is not None}
    if len(dts) != 1 or k.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"the TileLang forward walk takes q, k, v and Ag in one of bf16, fp16, got {sorted(map(str, dts))}")
    gate = "scalar" if kd is None else "vector"
    gc_ok = gs.dim() == 3 and gs.shape[1:] == (HV, K) and gs.dtype == torch.float32
    if kd is not None and (kd.shape != k.shape or Hk != HV or (q is None) != (aqk is None) or not gc_ok):
        raise ValueError(f"the TileLang forward walk's gated form takes ke, kd (qg) [B, T, HV, K], G_C [NT, HV, K] "
                         f"fp32 and, with qg, Aqk; got ke {tuple(k.shape)}, kd {tuple(kd.shape)}, G_C "
                         f"{tuple(gs.shape)} {gs.dtype}, qg {q is not None}, Aqk {aqk is not None} for HV={HV}")  # fmt: skip
    dev = k.device
    P = layout.num_programs
    BV = BV or DEFAULT_BV
    on = {"output": q is not None, "store_h": num_chunks is not None, "h0": h0 is not None}
    modes = sum(bit for name, bit in FWD_WALK_MODES.items() if on[name])
    build = (HV, Hk, BV, float(scale) if kd is None else 1.0, TL_DTYPES[k.dtype], gate)
    # (in `compile_ahead`'s dry run the walk builds beside the Triton compiles and does not launch)
    kern = None if build_beside(("fwd_walk", *build), _build, *build) else _build(*build)
    if layout.cu_seqlens is None:
        cu, co = _dense_ranges(layout.num_seqs, T, cdiv(T, BT), dev)
    else:
        cu, co = layout.cu_seqlens.int(), layout.chunk_offsets.int()
    pmap = layout.seq_map.int() if layout.seq_map is not None else _identity(P, dev)
    if not output_final_state:
        fin = _no_final(P, dev)
    else:
        fin = layout.final_idx.int() if layout.final_idx is not None else _identity(P, dev)
    N = B * T
    o = torch.empty_like(v) if q is not None else None
    ht = k.new_empty(num_states or P, HV, K, V, dtype=torch.float32) if output_final_state else None
    if hs is not None and (num_chunks is None or hs.shape != (num_chunks, HV, K, V) or hs.dtype != k.dtype):
        raise ValueError(f"fwd walk: hs must be [{num_chunks}, {HV}, {K}, {V}] in {k.dtype}, got "
                         f"{tuple(hs.shape)} {hs.dtype}")  # fmt: skip
    if hs is None and num_chunks is not None:
        hs = k.new_empty(num_chunks, HV, K, V)
    qx, kx, vx, agx = (x.reshape(N, *x.shape[2:]) for x in (q if q is not None else k, k, v, ag))
    if kd is None:
        inputs = [qx, kx, vx, agx, gs.reshape(N, HV)]
    else:  # (without q the walk reads neither qg nor Aqk: k and Ag stand in)
        aqkx = aqk.reshape(N, HV, BT) if aqk is not None else agx
        inputs = [qx, kx, kd.reshape(N, HV, K), vx, agx, aqkx, gs]
    state32, state_io = stand_in(dev, torch.float32, 1, HV, K, V), stand_in(dev, k.dtype, 1, HV, K, V)  # (unread)
    args = [*inputs, h0 if h0 is not None else state32, cu, co[: cu.numel() - 1], pmap, fin,
            o.view(N, HV, V) if o is not None else v.reshape(N, HV, V),
            ht if ht is not None else state32, hs if hs is not None else state_io, modes]  # fmt: skip
    if kern is not None and P and T:
        kern(*args)
    return o, ht, hs
