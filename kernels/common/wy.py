"""Intra-chunk preparation (the WY form) of GDN and KDA, one Triton program per (chunk, head), all in registers.

Per chunk of C = 64 tokens (DESIGN.md §1; 16 and 32 run in the same blocks, those past the chunk empty), with G the cumulative log gate inside the chunk:

    A = StrictLower(beta_i k_i.k_j exp(G_i - G_j))      (KDA: sum_d k_id k_jd exp(G_id - G_jd))
    T = (I + A)^{-1}
    w = T (beta * exp(G) * K),   u = T (beta * V)

and, when q is given (the transition primitive has none), the intra-chunk attention
Aqk = scale * (Q K^T (x) exp(G_i - G_j)) on and below the diagonal, [B, T, H, C] in k's dtype (the blocks above
the diagonal are not written: every reader masks them).
GDN (`wy_gdn_fwd`) also stores the fp32 in-chunk gate cumsum `gcum` [B, T, H]; the later kernels apply the
scalar gate themselves. KDA (`wy_kda_fwd`) stores what the later kernels need so that they never touch the
per-key gate again: kg = K * exp(G_C - G) (the gated key of the state update), the per-chunk last-row gate
gc [NT_total, H, K] fp32, and qg = scale * Q * exp(G).

The chunk is handled as four 16-row blocks, so every tile is 16 x 16 (A, Aqk, T) or 16 x BK / 16 x BV (inputs;
the columns past K or V are masked, so any head dim runs in power-of-two blocks)
and nothing goes through memory between the phases (small tiles, few warps, many programs per SM: the
kernel is latency-bound at B=1, so occupancy is what counts):
1. the 10 lower blocks of A (fp32) and of Aqk, accumulated over column blocks of K;
2. T = (I + A)^{-1}: forward substitution on the four diagonal blocks (rows taken out of the register tile,
   four independent chains interleaved), then block substitution T_IJ = -T_II sum_K A_IK T_KJ (tf32 products);
3. w and u from the blocks of T (in the input dtype), in column blocks of BK / BV.

KDA numerics, for any g <= 0: no exponential overflows. The gate is floored where it is loaded
(`kernels.common.decay`: -inf and -1000 masks give finite cumsums and exact zero decays across them). For row
block I (rows i), with b_I the gate just before it and e_I = b_(I+1) the gate at its last row (per key dim), the
decay is split at a reference r_I: exp(G_i - G_j) = exp(G_i - r_I) exp(r_I - G_j).
- Below the diagonal (j in an earlier block, G_j >= b_I >= r_I): the right factor k_j exp(r_I - G_j) <= 1, one
  [16, BK] exp per block pair (6), and a tensor-core product with L_I = x exp(G - r_I).
- Diagonal blocks, when every key's span b_I - e_I is below FAST_SPAN = 100 in all four blocks (every safe gate:
  16 x 5 = 80): r_I = (b_I + e_I) / 2, both factors lie within e^(+-50), and the block is the tensor-core
  product L_I (k_I exp(r_I - G_I))^T as before. Otherwise r_I = b_I (L_I <= 1) and the diagonal blocks take
  exp(G_i - G_j) elementwise, one column j at a time (`_diag_gram`: 16 [16, BK] exps per block; FLA's form).
  An underflowed right factor below the diagonal drops at most e^(50 - 87) = e^-37 of a term.
- kg = K exp(G_C - G) and qg = scale Q exp(G) are formed directly (exponents <= 0).
Cost per chunk, K block and gram (Aqk, A) against the old split, which needed g >= -5.5: 6 more [16, BK] exps
(the right factors below the diagonal, formerly 6 [BK] vectors) and, for kg, 4 [16, BK] exps instead of 4 [BK];
on the elementwise path 64 [16, BK] exps and 64 masked [16, BK] products and reductions replace the 4 diagonal
16x16xBK dots.

Grid: dense input (NT, B*H); varlen (NT_total, H) with the chunk index of `kernels.common.index`.
Grouped value heads: q and k may have H / G heads (G = HV / H from the shapes, v's HV heads); they are read at
head i_h // G and every output (w, u, kg, qg, Aqk, ...) has HV heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program, group_heads, heuristics
from kernels.common.decay import GATE_FLOOR
from kernels.common.index import ChunkIndex
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.plan import LaunchPlan, launch_config

__all__ = ["BT_WY", "CHUNK_SIZES", "WY_GDN_FWD", "WY_KDA_FWD", "wy_gdn_fwd", "wy_kda_fwd"]

BT_WY = 64  # the default chunk size: the kernels are written for 4 blocks of 16 rows
CHUNK_SIZES = (16, 32, 64)  # the chunk sizes they take (a 16- or 32-token chunk leaves the blocks past it empty)
FLOOR = tl.constexpr(GATE_FLOOR)  # the gate floor of kernels.common.decay, applied where a kernel loads g for G
LOG2E = tl.constexpr(1.4426950408889634)  # the gates' prescale of the exp2 variants (`_gexp`)
# a 16-row block whose per-key decay spans less than this (all keys of the tile) takes its diagonal block as a
# tensor-core product of factors within e^(+-SPAN/2) (exact: no overflow, an underflowed right factor below the
# diagonal loses at most e^(SPAN/2 - 87) = e^-37 of a term); a larger span takes it elementwise
FAST_SPAN = tl.constexpr(100.0)
# the upward rounding of the fp32 decay-bound summary (`_chunk_bound`), relative to the sums it rounds
BOUND_MARGIN = tl.constexpr(1e-4)

WY_GDN_FWD = register(KernelSpec(
    name="wy_gdn_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # one warp per program (16x16 tiles gain nothing from more; more programs per SM hide the serial solve):
    # H200, B=1 T=64K: 0.94 ms vs 1.87 at 4 warps and 1.83 for the older kernel with an fp32 scratch
    default=LaunchConfig(BK=32, BV=64, num_warps=1, num_stages=2),
    space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (1, 2, 4), "num_stages": (1, 2, 3)},
))

WY_KDA_FWD = register(KernelSpec(
    name="wy_kda_fwd",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    # the per-key gate adds fp32 [16, BK] tiles (G, the two exp factors) next to the keys: BK 16, one warp
    # (H200, B=1 T=64K: 2.76 ms vs 4.18 at BK 32 / 4 warps and 9.67 for the older kernel)
    default=LaunchConfig(BK=16, BV=64, num_warps=1, num_stages=2),
    space={"BK": (16, 32, 64), "BV": (32, 64, 128), "num_warps": (1, 2, 4), "num_stages": (1, 2)},
))


# ---------------------------------------------------------------------------------------------------------------------
# helpers


@triton.jit
def _load_tile(p, bos, r0, T, i_h, H: tl.constexpr, D: tl.constexpr, c0, BR: tl.constexpr, BC: tl.constexpr):
    """Rows [r0, r0+BR), columns [c0, c0+BC) of a [.., T, H, D] tensor for head i_h, zero past T and past D."""
    o_r = r0 + tl.arange(0, BR)
    o_d = c0 + tl.arange(0, BC)
    return tl.load(p + ((bos + o_r) * H + i_h)[:, None] * D + o_d[None, :], mask=(o_r < T)[:, None] & (o_d < D)[None, :],
                   other=0.)


@triton.jit
def _store_tile(p, x, bos, r0, T, i_h, H: tl.constexpr, D: tl.constexpr, c0, BR: tl.constexpr, BC: tl.constexpr):
    """Store x [BR, BC] at rows [r0, r0+BR), columns [c0, c0+BC) of a [.., T, H, D] tensor; rows past T and columns
    past D skipped."""
    o_r = r0 + tl.arange(0, BR)
    o_d = c0 + tl.arange(0, BC)
    tl.store(p + ((bos + o_r) * H + i_h)[:, None] * D + o_d[None, :], x.to(p.dtype.element_ty),
             mask=(o_r < T)[:, None] & (o_d < D)[None, :])


@triton.jit
def _load_vec(p, bos, r0, T, i_h, H: tl.constexpr, BR: tl.constexpr):
    """Rows [r0, r0+BR) of a [.., T, H] tensor for head i_h as fp32 [BR], zero past T."""
    o_r = r0 + tl.arange(0, BR)
    return tl.load(p + (bos + o_r) * H + i_h, mask=o_r < T, other=0.).to(tl.float32)


@triton.jit
def _gexp(x, EXP2: tl.constexpr):
    """e^x, or 2^x where the gates were prescaled by log2(e) (EXP2: the code variants of the GDN passes)."""
    if EXP2:
        return tl.exp2(x)
    else:
        return tl.exp(x)


@triton.jit
def _decay(ga, gb, STRICT: tl.constexpr, EXP2: tl.constexpr = False):
    """exp(ga_i - gb_j) on and below the diagonal of a 16x16 diagonal block (strictly below if STRICT), else 0
    (EXP2: 2^, the gates in log2 units)."""
    o_i = tl.arange(0, 16)
    if STRICT:
        m = o_i[:, None] > o_i[None, :]
    else:
        m = o_i[:, None] >= o_i[None, :]
    return _gexp(tl.where(m, ga[:, None] - gb[None, :], float("-inf")), EXP2)


@triton.jit
def _inv_diag4(A0, A1, A2, A3):
    """(I + A)^{-1} of four strictly lower 16x16 fp32 blocks held in registers, exactly in fp32: forward substitution
    (row i of the strict part = -A_i - sum_k A_ik T_k, row i of A taken out of the tile by a masked sum), the four
    blocks' steps in one loop (four independent chains per iteration for the scheduler to interleave: in four loops
    each iteration waited on its own reductions' shuffles; session 20, H200: the Ag pass 0.357 -> 0.315 ms at 1x64K)."""
    o_i = tl.arange(0, 16)
    T0 = -A0
    T1 = -A1
    T2 = -A2
    T3 = -A3
    for i in range(2, 16):
        m_i = (o_i == i)[:, None]
        a0 = -tl.sum(tl.where(m_i, A0, 0.), 0)
        a1 = -tl.sum(tl.where(m_i, A1, 0.), 0)
        a2 = -tl.sum(tl.where(m_i, A2, 0.), 0)
        a3 = -tl.sum(tl.where(m_i, A3, 0.), 0)
        a0 = a0 + tl.sum(a0[:, None] * T0, 0)
        a1 = a1 + tl.sum(a1[:, None] * T1, 0)
        a2 = a2 + tl.sum(a2[:, None] * T2, 0)
        a3 = a3 + tl.sum(a3[:, None] * T3, 0)
        T0 = tl.where(m_i, a0[None, :], T0)
        T1 = tl.where(m_i, a1[None, :], T1)
        T2 = tl.where(m_i, a2[None, :], T2)
        T3 = tl.where(m_i, a3[None, :], T3)
    eye = tl.where(o_i[:, None] == o_i[None, :], 1., 0.)
    return T0 + eye, T1 + eye, T2 + eye, T3 + eye


@triton.jit
def _inv_neumann(A):
    """(I + A)^{-1} of a strictly lower 16x16 fp32 block as (I - A)(I + A^2)(I + A^4)(I + A^8) (A^16 = 0): six
    products at Triton's default fp32 precision (tf32 on NVIDIA tensor cores, as `_solve`'s off-diagonal merges), no
    loop and no reductions. Session 20, H200, GDN's Ag pass at 1x64K: 0.241 ms against 0.315 for `_inv_diag4` (0.370
    / 0.436 with the bound sums); Ag from fp32 k against the fp64 solve 5.07e-6 against 4.90e-6 (rel_l2). With keys of
    norm 4 (not normalized) the whole solve errs about twice as much as with the substitution
    (`benchmarks/solve_precision.py`); with unit-norm keys alike."""
    o_i = tl.arange(0, 16)
    A2 = tl.dot(A, A)
    A4 = tl.dot(A2, A2)
    A8 = tl.dot(A4, A4)
    P = tl.where(o_i[:, None] == o_i[None, :], 1., 0.) - A
    P = tl.dot(P, A2, P)
    P = tl.dot(P, A4, P)
    return tl.dot(P, A8, P)


@triton.jit
def _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, EXACT: tl.constexpr = False):
    """The 10 lower blocks of T = (I + A)^{-1} from those of the strictly lower A (fp32, registers): the diagonal
    blocks by `_inv_neumann` (EXACT: `_inv_diag4`'s fp32 substitution, a lab variant), then the blocks below them."""
    if EXACT:
        T00, T11, T22, T33 = _inv_diag4(A00, A11, A22, A33)
    else:
        T00 = _inv_neumann(A00)
        T11 = _inv_neumann(A11)
        T22 = _inv_neumann(A22)
        T33 = _inv_neumann(A33)
    T10 = -tl.dot(T11, tl.dot(A10, T00))
    T21 = -tl.dot(T22, tl.dot(A21, T11))
    T32 = -tl.dot(T33, tl.dot(A32, T22))
    T20 = -tl.dot(T22, tl.dot(A20, T00) + tl.dot(A21, T10))
    T31 = -tl.dot(T33, tl.dot(A31, T11) + tl.dot(A32, T21))
    T30 = -tl.dot(T33, tl.dot(A30, T00) + tl.dot(A31, T10) + tl.dot(A32, T20))
    return T00, T10, T11, T20, T21, T22, T30, T31, T32, T33


@triton.jit
def _apply_T(x0, x1, x2, x3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33):
    """The four 16-row blocks of T X (lower block-triangular T times X; fp32 accumulation)."""
    y0 = tl.dot(T00, x0)
    y1 = tl.dot(T11, x1, tl.dot(T10, x0))
    y2 = tl.dot(T22, x2, tl.dot(T21, x1, tl.dot(T20, x0)))
    y3 = tl.dot(T33, x3, tl.dot(T32, x2, tl.dot(T31, x1, tl.dot(T30, x0))))
    return y0, y1, y2, y3


@triton.jit
def _wy_chunk(cu_seqlens, chunk_indices, need, T, H: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
              USE_NEED: tl.constexpr):
    """(head i_h, global chunk row i_tg, first token bos, the chunk's first row t0, its end T, skip) of this program
    (grid (chunks, B * H)); skip: the sequence's outputs are not needed (`need`, transition only)."""
    tl.static_assert(BT == 16 or BT == 32 or BT == 64, "the WY kernel is written for chunks of 16, 32 or 64 tokens")
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    if USE_NEED:  # the constexpr branch guards the load (need is None when USE_NEED is False)
        skip = tl.load(need + i_n) == 0
    else:
        skip = i_n < 0  # never
    t0 = i_t * BT
    T = tl.minimum(T, t0 + BT)  # the four 16-row blocks end at the chunk: rows past it load as zero (BT 16, 32)
    return i_h, i_tg, bos, t0, T, skip


@triton.jit
def _load_vec4(p, bos, t0, T, i_h, H: tl.constexpr):
    """The four 16-row blocks of a per-token vector ([B, T, H], e.g. beta) of the chunk at row t0."""
    return (_load_vec(p, bos, t0, T, i_h, H, 16), _load_vec(p, bos, t0 + 16, T, i_h, H, 16),
            _load_vec(p, bos, t0 + 32, T, i_h, H, 16), _load_vec(p, bos, t0 + 48, T, i_h, H, 16))


@triton.jit
def _solve_to(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, dt: tl.constexpr):
    """The blocks of T = (I + A)^{-1} (`_solve`), in dtype dt for the products with K and V."""
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    return (T00.to(dt), T10.to(dt), T11.to(dt), T20.to(dt), T21.to(dt), T22.to(dt), T30.to(dt), T31.to(dt), T32.to(dt),
            T33.to(dt))


@triton.jit
def _store_w(w, y0, y1, y2, y3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h, H: tl.constexpr,
             K: tl.constexpr, c0, BK: tl.constexpr):
    """w = T y for one column block [c0, c0 + BK) of the chunk at row t0, stored block by block (u too: `_store_u`)."""
    w0, w1, w2, w3 = _apply_T(y0, y1, y2, y3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33)
    _store_tile(w, w0, bos, t0, T, i_h, H, K, c0, 16, BK)
    _store_tile(w, w1, bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
    _store_tile(w, w2, bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
    _store_tile(w, w3, bos, t0 + 48, T, i_h, H, K, c0, 16, BK)


@triton.jit
def _store_u(v, u, bos, t0, T, i_h, b0, b1, b2, b3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
             H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, NORMS: tl.constexpr, G: tl.constexpr):
    """u = T (beta V), in column blocks of BV (both ops; GDN's w = T (beta exp(G) K) too: v, u, b are then k, w and
    beta exp(G)); the T blocks are already in the input dtype; v is read at head i_h // G of H // G (grouped keys). Returns the squared norms of the four blocks' rows of
    v, fp32 [16] each, if NORMS (the decay bound's `bnd`), else zeros."""
    dt = T00.dtype
    n0 = tl.zeros([16], dtype=tl.float32)
    n1 = tl.zeros([16], dtype=tl.float32)
    n2 = tl.zeros([16], dtype=tl.float32)
    n3 = tl.zeros([16], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        c0 = i_v * BV
        v0, v1, v2, v3 = _load_blocks(v, bos, t0, T, i_h // G, H // G, V, c0, BV)
        if NORMS:
            n0, n1, n2, n3 = _add_squares(n0, n1, n2, n3, v0, v1, v2, v3)
        x0 = (v0 * b0[:, None]).to(dt)
        x1 = (v1 * b1[:, None]).to(dt)
        x2 = (v2 * b2[:, None]).to(dt)
        x3 = (v3 * b3[:, None]).to(dt)
        _store_w(u, x0, x1, x2, x3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h, H, V, c0, BV)
    return n0, n1, n2, n3


@triton.jit
def _store_u_bound(v, u, bnd, bos, t0, T, i_h, i_tg, b0, b1, b2, b3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                   x0, x1, x2, x3, kk0, kk1, kk2, kk3, H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   HAS_BOUND: tl.constexpr):
    """`_store_u`, then if HAS_BOUND the chunk's decay-bound summary (`_chunk_bound`; x: each token's largest floored
    gate, kk: ||k||^2) into bnd [NT_total, H, 2] at the global chunk i_tg."""
    n0, n1, n2, n3 = _store_u(v, u, bos, t0, T, i_h, b0, b1, b2, b3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                              H, V, BV, HAS_BOUND, 1)
    if HAS_BOUND:
        b_L, b_W = _chunk_bound(x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, n0, n1, n2, n3)
        tl.store(bnd + (i_tg * H + i_h) * 2, b_L)
        tl.store(bnd + (i_tg * H + i_h) * 2 + 1, b_W)


@triton.jit
def _load_blocks(p, bos, t0, T, i_h, H: tl.constexpr, D: tl.constexpr, c0, BC: tl.constexpr):
    """The chunk's four 16-row blocks of columns [c0, c0+BC) of a [.., T, H, D] tensor, fp32 (`_load_tile`)."""
    return (_load_tile(p, bos, t0, T, i_h, H, D, c0, 16, BC).to(tl.float32),
            _load_tile(p, bos, t0 + 16, T, i_h, H, D, c0, 16, BC).to(tl.float32),
            _load_tile(p, bos, t0 + 32, T, i_h, H, D, c0, 16, BC).to(tl.float32),
            _load_tile(p, bos, t0 + 48, T, i_h, H, D, c0, 16, BC).to(tl.float32))


@triton.jit
def _add_squares(n0, n1, n2, n3, x0, x1, x2, x3):
    """n_i + the row sums of squares of x_i (fp32): the squared row norms of four 16-row blocks, a column block on."""
    return n0 + tl.sum(x0 * x0, 1), n1 + tl.sum(x1 * x1, 1), n2 + tl.sum(x2 * x2, 1), n3 + tl.sum(x3 * x3, 1)


@triton.jit
def _bound_logs(x, b, kk, vv):
    """Per token of a 16-row block: l = g + log max(1, |1 - beta ||k||^2|) (log of the token map's norm bound) and
    log u = log(|beta| ||k|| ||v||) (log of its write's norm); rows past T (beta = 0, g = 0) give l = 0, log u = -inf."""
    return x + tl.log(tl.maximum(tl.abs(1. - b * kk), 1.)), tl.log(tl.abs(b)) + 0.5 * tl.log(kk) + 0.5 * tl.log(vv)


@triton.jit
def _chunk_bound(x0, x1, x2, x3, b0, b1, b2, b3, k0, k1, k2, k3, v0, v1, v2, v3):
    """The chunk's decay-bound summary (`kernels.common.decay_bound` at chunk granularity), fp32 rounded up: L >= sum of
    l over the chunk and W >= log sum_t u_t exp(sum of l after t in the chunk) (its writes' state norm at its end)."""
    l0, u0 = _bound_logs(x0, b0, k0, v0)
    l1, u1 = _bound_logs(x1, b1, k1, v1)
    l2, u2 = _bound_logs(x2, b2, k2, v2)
    l3, u3 = _bound_logs(x3, b3, k3, v3)
    s0, s1, s2, s3 = tl.sum(l0, 0), tl.sum(l1, 0), tl.sum(l2, 0), tl.sum(l3, 0)
    L = s0 + s1 + s2 + s3
    A = tl.sum(tl.abs(l0), 0) + tl.sum(tl.abs(l1), 0) + tl.sum(tl.abs(l2), 0) + tl.sum(tl.abs(l3), 0)
    # exponent of token t: log u_t + (L - inclusive cumsum of l up to t), the decay after t
    e0 = u0 + (L - tl.cumsum(l0, 0))
    e1 = u1 + (L - s0 - tl.cumsum(l1, 0))
    e2 = u2 + (L - s0 - s1 - tl.cumsum(l2, 0))
    e3 = u3 + (L - s0 - s1 - s2 - tl.cumsum(l3, 0))
    m = tl.maximum(tl.maximum(tl.max(e0, 0), tl.max(e1, 0)), tl.maximum(tl.max(e2, 0), tl.max(e3, 0)))
    m = tl.where(m == float("-inf"), 0., m)  # no write in the chunk: W = log 0 = -inf below, without inf - inf
    lw = m + tl.log(tl.sum(tl.exp(e0 - m), 0) + tl.sum(tl.exp(e1 - m), 0) + tl.sum(tl.exp(e2 - m), 0)
                   + tl.sum(tl.exp(e3 - m), 0))
    # fp32 rounding, made rigorous by rounding up: a sum of 64 terms errs by <= 63 eps sum|l| = 3.8e-6 A, the
    # exponents and the log-sum-exp by about as much plus a few ulp of |W| (margins 26x and 10x over those)
    # (no write in the chunk: W = -inf stays -inf, not -inf + inf)
    return L + BOUND_MARGIN * A, tl.where(lw > float("-inf"), lw + BOUND_MARGIN * (A + tl.abs(lw) + 1.), lw)


@triton.jit
def _zero_blocks():
    """10 fp32 16x16 accumulators: the lower blocks of a 64x64 chunk product."""
    return (tl.zeros([16, 16], dtype=tl.float32), tl.zeros([16, 16], dtype=tl.float32),
            tl.zeros([16, 16], dtype=tl.float32), tl.zeros([16, 16], dtype=tl.float32),
            tl.zeros([16, 16], dtype=tl.float32), tl.zeros([16, 16], dtype=tl.float32),
            tl.zeros([16, 16], dtype=tl.float32), tl.zeros([16, 16], dtype=tl.float32),
            tl.zeros([16, 16], dtype=tl.float32), tl.zeros([16, 16], dtype=tl.float32))


@triton.jit
def _gram(x, k, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """The 10 lower 16x16 blocks of X K^T over the chunk at t0 (fp32), over column blocks of BK."""
    X00, X10, X11, X20, X21, X22, X30, X31, X32, X33 = _zero_blocks()
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        k0t = tl.trans(_load_tile(k, bos, t0, T, i_h, H, K, c0, 16, BK))
        k1t = tl.trans(_load_tile(k, bos, t0 + 16, T, i_h, H, K, c0, 16, BK))
        k2t = tl.trans(_load_tile(k, bos, t0 + 32, T, i_h, H, K, c0, 16, BK))
        k3t = tl.trans(_load_tile(k, bos, t0 + 48, T, i_h, H, K, c0, 16, BK))
        x0 = _load_tile(x, bos, t0, T, i_h, H, K, c0, 16, BK)
        X00 = tl.dot(x0, k0t, X00)
        x1 = _load_tile(x, bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
        X10 = tl.dot(x1, k0t, X10)
        X11 = tl.dot(x1, k1t, X11)
        x2 = _load_tile(x, bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
        X20 = tl.dot(x2, k0t, X20)
        X21 = tl.dot(x2, k1t, X21)
        X22 = tl.dot(x2, k2t, X22)
        x3 = _load_tile(x, bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
        X30 = tl.dot(x3, k0t, X30)
        X31 = tl.dot(x3, k1t, X31)
        X32 = tl.dot(x3, k2t, X32)
        X33 = tl.dot(x3, k3t, X33)
    return X00, X10, X11, X20, X21, X22, X30, X31, X32, X33


@triton.jit
def _store_aqk(aqk, bos, t0, T, i_h, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, H: tl.constexpr,
               BT: tl.constexpr):
    """The 10 lower 16x16 blocks of Aqk into [.., T, H, BT] (the blocks above the diagonal are left unwritten)."""
    _store_tile(aqk, Q00, bos, t0, T, i_h, H, BT, 0, 16, 16)
    _store_tile(aqk, Q10, bos, t0 + 16, T, i_h, H, BT, 0, 16, 16)
    _store_tile(aqk, Q11, bos, t0 + 16, T, i_h, H, BT, 16, 16, 16)
    _store_tile(aqk, Q20, bos, t0 + 32, T, i_h, H, BT, 0, 16, 16)
    _store_tile(aqk, Q21, bos, t0 + 32, T, i_h, H, BT, 16, 16, 16)
    _store_tile(aqk, Q22, bos, t0 + 32, T, i_h, H, BT, 32, 16, 16)
    _store_tile(aqk, Q30, bos, t0 + 48, T, i_h, H, BT, 0, 16, 16)
    _store_tile(aqk, Q31, bos, t0 + 48, T, i_h, H, BT, 16, 16, 16)
    _store_tile(aqk, Q32, bos, t0 + 48, T, i_h, H, BT, 32, 16, 16)
    _store_tile(aqk, Q33, bos, t0 + 48, T, i_h, H, BT, 48, 16, 16)


@triton.jit
def _gdn_cumsum(g, bos, t0, T, i_h, H: tl.constexpr):
    """GDN's floored gate x and its in-chunk cumsum G (block by block with the carry of the blocks before) for the
    four 16-row blocks of the chunk at t0, fp32 [16] each (rows past T: x = 0, G flat)."""
    x0 = tl.maximum(_load_vec(g, bos, t0, T, i_h, H, 16), FLOOR)
    x1 = tl.maximum(_load_vec(g, bos, t0 + 16, T, i_h, H, 16), FLOOR)
    x2 = tl.maximum(_load_vec(g, bos, t0 + 32, T, i_h, H, 16), FLOOR)
    x3 = tl.maximum(_load_vec(g, bos, t0 + 48, T, i_h, H, 16), FLOOR)
    g0 = tl.cumsum(x0, 0)
    g1 = tl.cumsum(x1, 0) + tl.sum(x0, 0)
    g2 = tl.cumsum(x2, 0) + tl.sum(x0, 0) + tl.sum(x1, 0)
    g3 = tl.cumsum(x3, 0) + tl.sum(x0, 0) + tl.sum(x1, 0) + tl.sum(x2, 0)
    return x0, x1, x2, x3, g0, g1, g2, g3


@triton.jit
def _gdn_gate(g, gcum, bos, t0, T, i_h, H: tl.constexpr):
    """`_gdn_cumsum`, with G stored into gcum [.., T, H] (rows past T skipped)."""
    o_i = tl.arange(0, 16)
    x0, x1, x2, x3, g0, g1, g2, g3 = _gdn_cumsum(g, bos, t0, T, i_h, H)
    p_g = gcum + (bos + t0 + o_i) * H + i_h
    tl.store(p_g, g0, mask=t0 + o_i < T)
    tl.store(p_g + 16 * H, g1, mask=t0 + 16 + o_i < T)
    tl.store(p_g + 32 * H, g2, mask=t0 + 32 + o_i < T)
    tl.store(p_g + 48 * H, g3, mask=t0 + 48 + o_i < T)
    return x0, x1, x2, x3, g0, g1, g2, g3


@triton.jit
def _gdn_decay_rows(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, g0, g1, g2, g3, b0, b1, b2, b3,
                    EXP2: tl.constexpr = False):
    """The 10 lower blocks of K K^T (fp32) to those of A = StrictLower(beta_i k_i.k_j exp(G_i - G_j)): the gate
    (blocks below the diagonal: i after j, so G_i - G_j <= 0) and beta on the rows (EXP2: G in log2 units, 2^)."""
    return (A00 * _decay(g0, g0, True, EXP2) * b0[:, None],
            A10 * _gexp(g1[:, None] - g0[None, :], EXP2) * b1[:, None], A11 * _decay(g1, g1, True, EXP2) * b1[:, None],
            A20 * _gexp(g2[:, None] - g0[None, :], EXP2) * b2[:, None],
            A21 * _gexp(g2[:, None] - g1[None, :], EXP2) * b2[:, None], A22 * _decay(g2, g2, True, EXP2) * b2[:, None],
            A30 * _gexp(g3[:, None] - g0[None, :], EXP2) * b3[:, None], A31 * _gexp(g3[:, None] - g1[None, :], EXP2) * b3[:, None],
            A32 * _gexp(g3[:, None] - g2[None, :], EXP2) * b3[:, None], A33 * _decay(g3, g3, True, EXP2) * b3[:, None])


# the WY kernels' flags from their optional arguments (both ops)
_WY_HEURISTICS = {
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    "HAS_Q": lambda args: args["q"] is not None,
    "USE_NEED": lambda args: args["need"] is not None,
    "HAS_BOUND": lambda args: args["bnd"] is not None,
    "G": group_heads("v"),
}


# ---------------------------------------------------------------------------------------------------------------------
# GDN


@heuristics(_WY_HEURISTICS)
@triton.jit(do_not_specialize=["T"])
def wy_gdn_fwd_kernel(
    q,  # [B, T, H, K] or None (transition only)
    k,  # [B, T, H, K]
    v,  # [B, T, H, V]
    g,  # [B, T, H] natural-log gate
    beta,  # [B, T, H]
    w,  # out [B, T, H, K]
    u,  # out [B, T, H, V]
    gcum,  # out [B, T, H] fp32 in-chunk cumsum of g
    aqk,  # out [B, T, H, BT] (if q)
    cu_seqlens,  # [N+1] int32 or None
    chunk_indices,  # [NT_total, 2] int32 or None
    need,  # [N] bool or None (transition only): 0 = this sequence's outputs are not needed, skip its chunks
    bnd,  # out [NT_total, H, 2] fp32 or None: the chunk's decay-bound summary (L, W), `_chunk_bound` (warm_split)
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_Q: tl.constexpr, USE_NEED: tl.constexpr, HAS_BOUND: tl.constexpr, G: tl.constexpr,
):
    i_h, i_tg, bos, t0, T, skip = _wy_chunk(cu_seqlens, chunk_indices, need, T, H, BT, IS_VARLEN, USE_NEED)
    if skip:
        return
    x0, x1, x2, x3, g0, g1, g2, g3 = _gdn_gate(g, gcum, bos, t0, T, i_h, H)
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_h, H)

    # phase 1: the lower blocks of Q K^T (stored), then of K K^T (one set of 10 accumulators live at a time)
    if HAS_Q:
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _gram(q, k, bos, t0, T, i_h // G, H // G, K, BK)
        Q00 *= _decay(g0, g0, False) * scale
        Q11 *= _decay(g1, g1, False) * scale
        Q22 *= _decay(g2, g2, False) * scale
        Q33 *= _decay(g3, g3, False) * scale
        Q10 *= tl.exp(g1[:, None] - g0[None, :]) * scale
        Q20 *= tl.exp(g2[:, None] - g0[None, :]) * scale
        Q21 *= tl.exp(g2[:, None] - g1[None, :]) * scale
        Q30 *= tl.exp(g3[:, None] - g0[None, :]) * scale
        Q31 *= tl.exp(g3[:, None] - g1[None, :]) * scale
        Q32 *= tl.exp(g3[:, None] - g2[None, :]) * scale
        _store_aqk(aqk, bos, t0, T, i_h, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, H, BT)
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gram(k, k, bos, t0, T, i_h // G, H // G, K, BK)
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gdn_decay_rows(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33,
                                                                       g0, g1, g2, g3, b0, b1, b2, b3)

    # phase 2: T = (I + A)^{-1}, then in the input dtype for the products with K and V
    dt = k.dtype.element_ty
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve_to(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, dt)

    # phase 3: w = T (beta exp(G) K), u = T (beta V), in column blocks
    e0, e1, e2, e3 = b0 * tl.exp(g0), b1 * tl.exp(g1), b2 * tl.exp(g2), b3 * tl.exp(g3)
    # (the same loop as u's, with the rows scaled by beta exp(G); the bound's ||k||^2 from its fp32 key tiles)
    kk0, kk1, kk2, kk3 = _store_u(k, w, bos, t0, T, i_h, e0, e1, e2, e3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                                  H, K, BK, HAS_BOUND, G)
    _store_u_bound(v, u, bnd, bos, t0, T, i_h, i_tg, b0, b1, b2, b3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                   x0, x1, x2, x3, kk0, kk1, kk2, kk3, H, V, BV, HAS_BOUND)


# ---------------------------------------------------------------------------------------------------------------------
# KDA


@triton.jit
def _kda_gate(g, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr):
    """In-chunk cumsum G of the per-key gate (floored, kernels.common.decay) for columns [c0, c0+BK), as four
    [16, BK] fp32 blocks, and the gate before each block (b1, b2, b3; b0 = 0) and at the chunk's last row (gl)."""
    x0 = tl.maximum(_load_tile(g, bos, t0, T, i_h, H, K, c0, 16, BK).to(tl.float32), FLOOR)
    x1 = tl.maximum(_load_tile(g, bos, t0 + 16, T, i_h, H, K, c0, 16, BK).to(tl.float32), FLOOR)
    x2 = tl.maximum(_load_tile(g, bos, t0 + 32, T, i_h, H, K, c0, 16, BK).to(tl.float32), FLOOR)
    x3 = tl.maximum(_load_tile(g, bos, t0 + 48, T, i_h, H, K, c0, 16, BK).to(tl.float32), FLOOR)
    b1 = tl.sum(x0, 0)
    b2 = b1 + tl.sum(x1, 0)
    b3 = b2 + tl.sum(x2, 0)
    gl = b3 + tl.sum(x3, 0)  # rows past T add 0
    G0 = tl.cumsum(x0, 0)
    G1 = tl.cumsum(x1, 0) + b1[None, :]
    G2 = tl.cumsum(x2, 0) + b2[None, :]
    G3 = tl.cumsum(x3, 0) + b3[None, :]
    return G0, G1, G2, G3, b1, b2, b3, gl


@triton.jit
def _gate_rowmax(g, bos, r0, T, i_h, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr):
    """The largest floored gate of each row over columns [c0, c0+BK) (columns past K excluded), fp32 [16]."""
    x = tl.maximum(_load_tile(g, bos, r0, T, i_h, H, K, c0, 16, BK).to(tl.float32), FLOOR)
    return tl.max(tl.where((c0 + tl.arange(0, BK) < K)[None, :], x, float("-inf")), 1)


@triton.jit
def _diag_gram(x, k, G, BK: tl.constexpr):
    """sum_d x_id k_jd exp(G_id - G_jd) for j <= i in one 16-row block (0 above the diagonal), x, k, G [16, BK]
    fp32: the decay taken elementwise (G_i - G_j <= 0), one column j at a time (FLA's diagonal blocks)."""
    o_i = tl.arange(0, 16)
    X = tl.zeros([16, 16], dtype=tl.float32)
    for j in range(16):  # a loop, not unrolled: unrolled (x 4 blocks x 2 grams) it tripled the compile time
        m_j = (o_i == j)[:, None]
        kj = tl.sum(tl.where(m_j, k, 0.), 0)
        gj = tl.sum(tl.where(m_j, G, 0.), 0)
        e = tl.exp(tl.where((o_i >= j)[:, None], G - gj[None, :], float("-inf")))
        X = tl.where((o_i == j)[None, :], tl.sum(x * kj[None, :] * e, 1)[:, None], X)
    return X


@triton.jit
def _kda_gram(x, k, g, xg, bos, t0, T, i_h, gc, scale, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
              IS_K: tl.constexpr, G: tl.constexpr, STORE: tl.constexpr = 1, xe=None):
    """The 10 lower 16x16 blocks of sum_d x_id k_jd exp(G_id - G_jd) (fp32; diagonal blocks unmasked), over column
    blocks of BK, every exponent <= 0 (module docstring): below the diagonal the factors are split at the gate b_I
    before the ROW block, the diagonal blocks take the decay elementwise. On the way it stores (STORE 1) the gated copy
    of x: kg = K exp(G_C - G) and gc (IS_K; `gc` points at the chunk's row), or qg = scale Q exp(G) (`gc` unused);
    STORE 2: the cumsum G itself into xg [.., T, H, K] (the Ag pass's, `kernels.ops.kda.wy_ag`); STORE 3 (IS_K): kg and
    gc as STORE 1 and ke = K exp(G) <= K into xe (the Ag pass's gated keys); STORE 0: nothing.
    x and k are read at head i_h // G of H // G (grouped keys), the gate and the stores at i_h of H."""
    X00, X10, X11, X20, X21, X22, X30, X31, X32, X33 = _zero_blocks()
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        G0, G1, G2, G3, g1, g2, g3, gl = _kda_gate(g, bos, t0, T, i_h, H, K, c0, BK)
        k0 = _load_tile(k, bos, t0, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k1 = _load_tile(k, bos, t0 + 16, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k2 = _load_tile(k, bos, t0 + 32, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k3 = _load_tile(k, bos, t0 + 48, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        x0 = _load_tile(x, bos, t0, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        x1 = _load_tile(x, bos, t0 + 16, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        x2 = _load_tile(x, bos, t0 + 32, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        x3 = _load_tile(x, bos, t0 + 48, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        # the reference of row block I: b_I - s_I, with s_I = half the block's span (per key) when every key's span is
        # < FAST_SPAN, else 0
        fast = tl.max(tl.maximum(tl.maximum(-g1, g1 - g2), tl.maximum(g2 - g3, g3 - gl)), 0) < FAST_SPAN
        r0 = tl.where(fast, 0.5 * g1, 0.)
        r1 = tl.where(fast, 0.5 * (g1 + g2), g1)
        r2 = tl.where(fast, 0.5 * (g2 + g3), g2)
        r3 = tl.where(fast, 0.5 * (g3 + gl), g3)
        # left factors x_i exp(G_i - r_I) <= exp(s_I)
        L0 = x0 * tl.exp(G0 - r0[None, :])
        L1 = x1 * tl.exp(G1 - r1[None, :])
        L2 = x2 * tl.exp(G2 - r2[None, :])
        L3 = x3 * tl.exp(G3 - r3[None, :])
        if STORE == 2:  # the in-chunk cumsum G (fp32)
            _store_tile(xg, G0, bos, t0, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, G1, bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, G2, bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, G3, bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
        elif IS_K and (STORE == 1 or STORE == 3):  # kg = K exp(G_C - G) <= K; gc = G_C
            tl.store(gc + c0 + tl.arange(0, BK), gl, mask=c0 + tl.arange(0, BK) < K)
            _store_tile(xg, k0 * tl.exp(gl[None, :] - G0), bos, t0, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, k1 * tl.exp(gl[None, :] - G1), bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, k2 * tl.exp(gl[None, :] - G2), bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, k3 * tl.exp(gl[None, :] - G3), bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
            if STORE == 3:  # ke = K exp(G) = L_I exp(r_I) <= K (x is K; as qg: one exp per key, not per entry)
                _store_tile(xe, L0 * tl.exp(r0)[None, :], bos, t0, T, i_h, H, K, c0, 16, BK)
                _store_tile(xe, L1 * tl.exp(r1)[None, :], bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
                _store_tile(xe, L2 * tl.exp(r2)[None, :], bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
                _store_tile(xe, L3 * tl.exp(r3)[None, :], bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
        elif STORE == 1:  # qg = scale Q exp(G) = scale L_I exp(r_I)
            _store_tile(xg, L0 * (scale * tl.exp(r0))[None, :], bos, t0, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, L1 * (scale * tl.exp(r1))[None, :], bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, L2 * (scale * tl.exp(r2))[None, :], bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
            _store_tile(xg, L3 * (scale * tl.exp(r3))[None, :], bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
        # below the diagonal: right factors k_j exp(r_I - G_j) <= 1 (j in an earlier block, so G_j >= b_I >= r_I)
        X10 = tl.dot(L1, tl.trans(k0 * tl.exp(r1[None, :] - G0)), X10)
        X20 = tl.dot(L2, tl.trans(k0 * tl.exp(r2[None, :] - G0)), X20)
        X21 = tl.dot(L2, tl.trans(k1 * tl.exp(r2[None, :] - G1)), X21)
        X30 = tl.dot(L3, tl.trans(k0 * tl.exp(r3[None, :] - G0)), X30)
        X31 = tl.dot(L3, tl.trans(k1 * tl.exp(r3[None, :] - G1)), X31)
        X32 = tl.dot(L3, tl.trans(k2 * tl.exp(r3[None, :] - G2)), X32)
        if fast:  # the diagonal blocks: right factors k_j exp(r_I - G_j) <= exp(s_I)
            X00 = tl.dot(L0, tl.trans(k0 * tl.exp(r0[None, :] - G0)), X00)
            X11 = tl.dot(L1, tl.trans(k1 * tl.exp(r1[None, :] - G1)), X11)
            X22 = tl.dot(L2, tl.trans(k2 * tl.exp(r2[None, :] - G2)), X22)
            X33 = tl.dot(L3, tl.trans(k3 * tl.exp(r3[None, :] - G3)), X33)
        else:
            X00 += _diag_gram(x0, k0, G0, BK)
            X11 += _diag_gram(x1, k1, G1, BK)
            X22 += _diag_gram(x2, k2, G2, BK)
            X33 += _diag_gram(x3, k3, G3, BK)
    return X00, X10, X11, X20, X21, X22, X30, X31, X32, X33


@triton.jit
def _store_kda_aqk(aqk, bos, t0, T, i_h, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, H: tl.constexpr,
                   BT: tl.constexpr):
    """Aqk = scale (the q-k gram of `_kda_gram`), the diagonal blocks masked to j <= i, into [.., T, H, BT]."""
    o_i = tl.arange(0, 16)
    m_dq = o_i[:, None] >= o_i[None, :]
    _store_aqk(aqk, bos, t0, T, i_h, tl.where(m_dq, Q00, 0.) * scale, Q10 * scale, tl.where(m_dq, Q11, 0.) * scale,
               Q20 * scale, Q21 * scale, tl.where(m_dq, Q22, 0.) * scale, Q30 * scale, Q31 * scale, Q32 * scale,
               tl.where(m_dq, Q33, 0.) * scale, H, BT)


@triton.jit
def _kda_beta_rows(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, b0, b1, b2, b3):
    """The k-k gram of `_kda_gram` to A = StrictLower(beta_i sum_d k_id k_jd exp(G_id - G_jd)): the diagonal blocks
    masked to j < i, beta on the rows."""
    o_i = tl.arange(0, 16)
    m_d = o_i[:, None] > o_i[None, :]
    return (tl.where(m_d, A00, 0.) * b0[:, None], A10 * b1[:, None], tl.where(m_d, A11, 0.) * b1[:, None],
            A20 * b2[:, None], A21 * b2[:, None], tl.where(m_d, A22, 0.) * b2[:, None], A30 * b3[:, None],
            A31 * b3[:, None], A32 * b3[:, None], tl.where(m_d, A33, 0.) * b3[:, None])


@heuristics(_WY_HEURISTICS)
@triton.jit(do_not_specialize=["T"])
def wy_kda_fwd_kernel(
    q,  # [B, T, H, K] or None (transition only)
    k,  # [B, T, H, K]
    v,  # [B, T, H, V]
    g,  # [B, T, H, K] natural-log per-key gate
    beta,  # [B, T, H]
    w,  # out [B, T, H, K]
    u,  # out [B, T, H, V]
    kg,  # out [B, T, H, K] = K exp(G_C - G)
    gc,  # out [NT_total, H, K] fp32: G at the chunk's last row
    qg,  # out [B, T, H, K] = scale Q exp(G) (if q)
    aqk,  # out [B, T, H, BT] (if q)
    cu_seqlens,
    chunk_indices,
    need,  # [N] bool or None (transition only): 0 = this sequence's outputs are not needed, skip its chunks
    bnd,  # out [NT_total, H, 2] fp32 or None: the chunk's decay-bound summary (L, W), `_chunk_bound` (warm_split)
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_Q: tl.constexpr, USE_NEED: tl.constexpr, HAS_BOUND: tl.constexpr, G: tl.constexpr,
):
    i_h, i_tg, bos, t0, T, skip = _wy_chunk(cu_seqlens, chunk_indices, need, T, H, BT, IS_VARLEN, USE_NEED)
    if skip:
        return
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_h, H)

    # phase 1: the lower blocks of Aqk (with qg; stored), then of A (with kg and gc): one set of 10 accumulators
    # live at a time
    if HAS_Q:
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _kda_gram(q, k, g, qg, bos, t0, T, i_h, gc, scale, H, K, BK,
                                                                     False, G)
        _store_kda_aqk(aqk, bos, t0, T, i_h, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, H, BT)
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(k, k, g, kg, bos, t0, T, i_h, gc + (i_tg * H + i_h) * K,
                                                                 1.0, H, K, BK, True, G)
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_beta_rows(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33,
                                                                      b0, b1, b2, b3)

    # phase 2: T = (I + A)^{-1}, then in the input dtype for the products with K and V
    dt = k.dtype.element_ty
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve_to(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, dt)

    # phase 3: w = T (beta exp(G) K) in column blocks of BK (the gate is per key dim), u = T (beta V)
    # the decay bound's per-token facts (if HAS_BOUND): ||k||^2 and the largest (floored) gate over the key dims
    kk0, kk1, kk2, kk3 = (tl.zeros([16], dtype=tl.float32), tl.zeros([16], dtype=tl.float32),
                          tl.zeros([16], dtype=tl.float32), tl.zeros([16], dtype=tl.float32))
    gm0, gm1, gm2, gm3 = (tl.full([16], float("-inf"), tl.float32), tl.full([16], float("-inf"), tl.float32),
                          tl.full([16], float("-inf"), tl.float32), tl.full([16], float("-inf"), tl.float32))
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        G0, G1, G2, G3, g1, g2, g3, gl = _kda_gate(g, bos, t0, T, i_h, H, K, c0, BK)
        k0, k1, k2, k3 = _load_blocks(k, bos, t0, T, i_h // G, H // G, K, c0, BK)
        if HAS_BOUND:
            kk0, kk1, kk2, kk3 = _add_squares(kk0, kk1, kk2, kk3, k0, k1, k2, k3)
            gm0 = tl.maximum(gm0, _gate_rowmax(g, bos, t0, T, i_h, H, K, c0, BK))
            gm1 = tl.maximum(gm1, _gate_rowmax(g, bos, t0 + 16, T, i_h, H, K, c0, BK))
            gm2 = tl.maximum(gm2, _gate_rowmax(g, bos, t0 + 32, T, i_h, H, K, c0, BK))
            gm3 = tl.maximum(gm3, _gate_rowmax(g, bos, t0 + 48, T, i_h, H, K, c0, BK))
        y0 = (k0 * tl.exp(G0) * b0[:, None]).to(dt)
        y1 = (k1 * tl.exp(G1) * b1[:, None]).to(dt)
        y2 = (k2 * tl.exp(G2) * b2[:, None]).to(dt)
        y3 = (k3 * tl.exp(G3) * b3[:, None]).to(dt)
        _store_w(w, y0, y1, y2, y3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, bos, t0, T, i_h, H, K, c0, BK)
    _store_u_bound(v, u, bnd, bos, t0, T, i_h, i_tg, b0, b1, b2, b3, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33,
                   gm0, gm1, gm2, gm3, kk0, kk1, kk2, kk3, H, V, BV, HAS_BOUND)


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def _key(index: ChunkIndex, H: int, K: int, V: int, dtype: torch.dtype) -> dict[str, object]:
    return {"H": H, "K": K, "V": V, "BT": index.chunk_size, "IS_VARLEN": index.is_varlen,
            "dtype": str(dtype).removeprefix("torch.")}


def _grid(index: ChunkIndex, B: int, T: int, H: int) -> tuple[int, int]:
    if index.is_varlen:
        return (index.num_chunks, H)
    return (cdiv(T, index.chunk_size), B * H)


def _blocks(cfg: LaunchConfig, index: ChunkIndex, K: int, V: int) -> tuple[int, int]:
    """The column blocks: the config's, at most the tile of the head dim (`head_block`; the last block is masked)."""
    assert index.chunk_size in CHUNK_SIZES, f"WY kernels need a chunk_size in {CHUNK_SIZES}, got {index.chunk_size}"
    BK, BV = min(cfg.BK or 64, head_block(K)), min(cfg.BV or 64, head_block(V))
    assert BK >= 16 and BV >= 16, f"bad column blocks BK={BK} BV={BV} for K={K} V={V}"
    return BK, BV


def _need_flags(need: Tensor | None, index: ChunkIndex, q: Tensor | None) -> Tensor | None:
    """bool [N] -> one byte per sequence for the kernel (same bytes); only without q (transition), since the
    forward needs every chunk's outputs."""
    if need is None:
        return None
    assert q is None, "need masks the transition's WY prep only"
    assert need.shape == (index.num_seqs,) and need.dtype == torch.bool, \
        f"need must be bool [{index.num_seqs}], got {need.dtype} {tuple(need.shape)}"
    return need.contiguous()  # bool: Triton loads and stores it as int8 (no view, two ATen ops per launch)


def wy_gdn_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    launch: LaunchPlan | None = None, need: Tensor | None = None, bnd: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """GDN intra-chunk pass: (w, u, gcum fp32 [B, T, H], aqk or None without q).

    need: bool `[N]` (transition only): chunks of unflagged sequences are skipped and their outputs left unwritten.
    bnd: fp32 `[NT_total, H, 2]` or None: receives each chunk's decay-bound summary (L, W) (`_chunk_bound`; the
    warmup certification of `kernels.common.warm_split`).
    """
    B, T, _, K = k.shape
    H, V = v.shape[2], v.shape[-1]  # the value heads (q, k may have H / G, grouped)
    cfg = launch_config(launch, WY_GDN_FWD, _key(index, H, K, V, k.dtype))
    BK, BV = _blocks(cfg, index, K, V)
    BT = index.chunk_size
    w = k.new_empty(B, T, H, K)
    u = torch.empty_like(v)
    gcum = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    wy_gdn_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, gcum, aqk,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        _need_flags(need, index, q), bnd, scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return w, u, gcum, aqk


def wy_kda_fwd(
    q: Tensor | None, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex,
    launch: LaunchPlan | None = None, need: Tensor | None = None, bnd: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """KDA intra-chunk pass: (w, u, kg, gc fp32 [NT_total, H, K], qg, aqk); qg/aqk are None without q.

    need: bool `[N]` (transition only): chunks of unflagged sequences are skipped and their outputs left unwritten.
    bnd: fp32 `[NT_total, H, 2]` or None: receives each chunk's decay-bound summary, as `wy_gdn_fwd`'s (the gate of a
    token: its largest over the key dims).
    """
    B, T, _, K = k.shape
    H, V = v.shape[2], v.shape[-1]  # the value heads (q, k may have H / G, grouped)
    cfg = launch_config(launch, WY_KDA_FWD, _key(index, H, K, V, k.dtype))
    BK, BV = _blocks(cfg, index, K, V)
    BT = index.chunk_size
    w = k.new_empty(B, T, H, K)
    u = torch.empty_like(v)
    kg = k.new_empty(B, T, H, K)
    gc = torch.empty(index.num_chunks, H, K, dtype=torch.float32, device=k.device)
    qg = q.new_empty(B, T, H, K) if q is not None else None
    aqk = torch.empty(B, T, H, BT, dtype=k.dtype, device=k.device) if q is not None else None
    wy_kda_fwd_kernel[_grid(index, B, T, H)](
        q, k, v, g, beta, w, u, kg, gc, qg, aqk,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        _need_flags(need, index, q), bnd, scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return w, u, kg, gc, qg, aqk
