"""KDA's Ag pass for the two-kernel forward (GDN's `kernels.ops.gdn.wy_ag`, with the per-key gate): per chunk and
value head it stores

    Ag  = T diag(beta),   T = (I + A)^{-1},   A = StrictLower(beta_i sum_d k_id k_jd exp(G_id - G_jd))
    Aqk = scale sum_d q_id k_jd exp(G_id - G_jd)  on and below the diagonal

both `[B, T, HV, BT]` in k's dtype (row i of chunk c holds row i of the chunk's BT x BT matrix; Ag with zeros above
the diagonal; Aqk's blocks above the diagonal are not written: its reader masks them), and the fp32 in-chunk cumsum G
of the floored per-key gate `gcum` `[B, T, HV, K]` (FLA's gk). No w, u, kg or qg: the state+output pass
(`kernels.ops.kda.fused`) forms u - w S = Ag (V - (K (x) exp(G)) S) and the gated q and k itself. The `gated` variant
(`KDA_AG_VARIANTS`, the launch config's VARIANT) stores those instead of G (`GatedKeys`: qg = scale Q exp(G),
ke = K exp(G), kd = K exp(G_C - G) in k's dtype, G_C per chunk), formed once per chunk instead of once per V block of
the fused pass.

`wy_kda_fwd`'s machinery (`kernels.common.wy`): the decayed grams in 16-row blocks (`_kda_gram`: tensor-core
products when every key's span in the chunk's blocks is < FAST_SPAN, the elementwise `_diag_gram` on the diagonal
blocks otherwise; every exponent <= 0 for any g <= 0), the mask and beta on A's rows, the block solve, and GDN's Ag
store (`kernels.ops.gdn.wy_ag._store_ag`), stopped after T.

Code variants (`KDA_AG_VARIANTS`, bits of the launch config's VARIANT; None: the code above, the default):
- one_pass: both grams in one pass over the key blocks in 16-row blocks (`_kda_grams`), the exp factors shared;
- tiles64: both grams as [64, BK] x [BK, 16] products per column block of the chunk (`_kda_grams64`), split over the
  warps by rows (a 16x16 product is computed by every warp of the program), then the same solve and stores;
- split_solve (with tiles64): A (strictly lower, beta on the rows) into an fp32 scratch, then the block solve and the
  Ag store in a second kernel at one warp (`wy_kda_ag_solve_kernel`): the solve's 16 serial steps reduce across
  rows, which crosses warps at 4-8;
- gated (with the default code only): the gated keys instead of G (`GatedKeys`, above).
The first three keep the default's numerics: every exponent bounded by FAST_SPAN / 2, the elementwise diagonal blocks past it.

Grouped value heads: q, k have H heads, g and beta HV = G H; value head h reads key head h // G (no repeat).
The warm split's per-chunk bound sums (`bnd`, `kernels.common.warm_split`) need ||v||^2 per token and each token's
largest gate over the key dims (as `wy_kda_fwd`'s): with `bnd`, v must be given (read only for those squares).

Grid: dense (NT, B * HV); varlen (NT_total, HV) with the chunk index of `kernels.common.index`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import group_heads
from kernels.common.index import ChunkIndex
from kernels.common.wy import (
    FAST_SPAN,
    FLOOR,
    _add_squares,
    _blocks,
    _chunk_bound,
    _gate_rowmax,
    _grid,
    _kda_beta_rows,
    _kda_gate,
    _kda_gram,
    _load_tile,
    _load_vec,
    _load_vec4,
    _solve,
    _store_kda_aqk,
    _store_tile,
    _wy_chunk,
    _zero_blocks,
)
from kernels.configs import KernelSpec, LaunchConfig, register
from kernels.ops.gdn.wy_ag import WY_GDN_AG_FWD, _row_squares, _store_ag, _store_bound, ag_launch
from kernels.plan import LaunchPlan, default_plan

__all__ = ["KDA_AG_VARIANTS", "WY_KDA_AG_FWD", "GatedKeys", "gated_ag_plan", "wy_kda_ag"]

WY_KDA_AG_FWD = register(
    KernelSpec(
        name="wy_kda_ag_fwd",
        key=WY_GDN_AG_FWD.key,
        # wy_kda_fwd's measured tiles (BK 16, one warp: the per-key gate's fp32 [16, BK] tiles next to the keys);
        # not measured on a GPU yet (benchmarks/kda_fused_lab.py)
        default=LaunchConfig(BK=16, BV=64, num_warps=1, num_stages=2),
        space={"BK": (16, 32, 64), "num_warps": (1, 2, 4), "num_stages": (1, 2)},
    )
)
# code variants, bits of the launch config's VARIANT (None: 0, the two-gram code above): one_pass: both grams in one
# pass over the column blocks (`_kda_grams`: the gate, k and q loaded and G stored once, the exp factors shared by the
# two grams), to time at 2-4 warps against the default (benchmarks/kda_fused_lab.py --ag-configs); tiles64, split_solve
# (module docstring); gated: instead of G, the gated queries and keys the fused pass would form per V block
# (`GatedKeys`), so that pass does only dots and one diagonal decay per chunk (its PRE_GATED), with the default code only
# (benchmarks/kda_fused_lab.py --forms). None measured on a GPU yet.
KDA_AG_VARIANTS = {"one_pass": 1, "tiles64": 2, "split_solve": 4, "gated": 8}
# the split_solve variant's second kernel (the block solve from A in memory) runs at one warp, the Ag passes' measured
# width for the serial 16x16 solve (GDN: 0.71 ms at one warp against 2.5 at 2-4, kernels/NOTES.md)
SOLVE_WARPS = 1


def gated_ag_plan(plan: LaunchPlan | None = None, gated: bool = True) -> LaunchPlan:
    """`plan` (None: the default plan) with the Ag pass's explicit config its default one with the `gated` variant
    (or, gated False, without it): the switch between KDA's two fused-pass forms (tests, benchmarks/kda_fused_lab.py)."""
    bits = KDA_AG_VARIANTS["gated"] if gated else None
    cfg = dataclasses.replace(WY_KDA_AG_FWD.default, VARIANT=bits)
    return (plan if plan is not None else default_plan()).with_configs({WY_KDA_AG_FWD.name: cfg})


class GatedKeys(NamedTuple):
    """The Ag pass's gated tensors (its `gated` variant), each factor exp(<= 0) for any g <= 0: none overflows, and an
    underflow drops only terms below e^-37 of their q or k (qg, ke are `_kda_gram`'s L_I e^{r_I}: e^{r_I} flushes to
    0 below e^-87 and G exceeds r_I by less than FAST_SPAN / 2 = 50)."""

    qg: Tensor  # [B, T, HV, K] in k's dtype: scale Q exp(G) (the output's inter-chunk queries)
    ke: Tensor  # [B, T, HV, K] in k's dtype: K exp(G) (w = Ag ke: W = V - ke S)
    kd: Tensor  # [B, T, HV, K] in k's dtype: K exp(G_C - G) (the state update)
    gc: Tensor  # [NT_total, HV, K] fp32: G_C, the gate cumsum at the chunk's last row (the state's decay)


@triton.jit
def _gate_rowmax4(g, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """Each token's largest floored gate over the key dims (`_gate_rowmax`), fp32 [16] per 16-row block."""
    m0 = tl.full([16], float("-inf"), tl.float32)
    m1 = tl.full([16], float("-inf"), tl.float32)
    m2 = tl.full([16], float("-inf"), tl.float32)
    m3 = tl.full([16], float("-inf"), tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        m0 = tl.maximum(m0, _gate_rowmax(g, bos, t0, T, i_h, H, K, i_k * BK, BK))
        m1 = tl.maximum(m1, _gate_rowmax(g, bos, t0 + 16, T, i_h, H, K, i_k * BK, BK))
        m2 = tl.maximum(m2, _gate_rowmax(g, bos, t0 + 32, T, i_h, H, K, i_k * BK, BK))
        m3 = tl.maximum(m3, _gate_rowmax(g, bos, t0 + 48, T, i_h, H, K, i_k * BK, BK))
    return m0, m1, m2, m3


@triton.jit
def _diag_grams(q, k, G, BK: tl.constexpr):
    """`_diag_gram` of q and of k against k in one 16-row block (one set of exps for both): sum_d x_id k_jd
    exp(G_id - G_jd) for j <= i (0 above the diagonal), x = q, k; fp32 [16, BK] inputs, every exponent <= 0."""
    o_i = tl.arange(0, 16)
    Xq = tl.zeros([16, 16], dtype=tl.float32)
    Xk = tl.zeros([16, 16], dtype=tl.float32)
    for j in range(16):  # a loop, not unrolled (as `_diag_gram`)
        m_j = (o_i == j)[:, None]
        kj = tl.sum(tl.where(m_j, k, 0.0), 0)
        gj = tl.sum(tl.where(m_j, G, 0.0), 0)
        e = tl.exp(tl.where((o_i >= j)[:, None], G - gj[None, :], float("-inf"))) * kj[None, :]
        Xq = tl.where((o_i == j)[None, :], tl.sum(q * e, 1)[:, None], Xq)
        Xk = tl.where((o_i == j)[None, :], tl.sum(k * e, 1)[:, None], Xk)
    return Xq, Xk


@triton.jit
def _pair(R, r, e):
    """The right factor of an off-diagonal block pair, transposed: R exp(r - e) = k_j exp(r_I - G_j) for R = k_j
    exp(e_J - G_j) (e_J: the gate at block J's last row, r_I <= e_J the row block's reference)."""
    return tl.trans(R * tl.exp(r - e)[None, :])


@triton.jit
def _kda_grams(q, k, g, gcum, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
               HAS_BOUND: tl.constexpr):  # fmt: skip
    """Both decayed grams of the chunk at t0 in one pass over the column blocks of BK (the one_pass variant): the 10
    lower 16x16 blocks of sum_d q_id k_jd exp(G_id - G_jd) and of sum_d k_id k_jd exp(G_id - G_jd) (fp32, diagonal
    blocks unmasked), storing the cumsum G into gcum [.., T, H, K]; with HAS_BOUND also each token's largest floored
    gate and ||k||^2 (the bound sums), fp32 [16] per block (else -inf and zeros).

    `_kda_gram`'s split, shared by the two grams: row block I takes the reference r_I (the mid gate of its span when
    every key's span in the column block is < FAST_SPAN, else the gate b_I before it) and one left exp tile
    E_I = exp(G_I - r_I) for both q and k. Below the diagonal, block J's right factor is formed once with the gate
    e_J at its last row, R_J = k_J exp(e_J - G_J) (exponents <= 0), and each pair (I, J) scales it by the vector
    exp(r_I - e_J) <= 1 (r_I <= b_I <= e_J): k_j exp(r_I - G_j) without a tile of exps per pair; an underflow there
    drops a term below e^(SPAN/2 - 87) = e^-37, as `_kda_gram`'s. Diagonal blocks: the tensor-core product with
    k_I exp(r_I - G_I) (fast), else the elementwise `_diag_grams`. Exps per column block: 4 + 3 tiles and 6 vectors,
    and 4 tiles on the fast diagonal (the two-gram code: 28 tiles)."""
    Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _zero_blocks()
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _zero_blocks()
    m0 = tl.full([16], float("-inf"), tl.float32)
    m1 = tl.full([16], float("-inf"), tl.float32)
    m2 = tl.full([16], float("-inf"), tl.float32)
    m3 = tl.full([16], float("-inf"), tl.float32)
    n0 = tl.zeros([16], dtype=tl.float32)
    n1 = tl.zeros([16], dtype=tl.float32)
    n2 = tl.zeros([16], dtype=tl.float32)
    n3 = tl.zeros([16], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        G0, G1, G2, G3, g1, g2, g3, gl = _kda_gate(g, bos, t0, T, i_h, H, K, c0, BK)
        _store_tile(gcum, G0, bos, t0, T, i_h, H, K, c0, 16, BK)
        _store_tile(gcum, G1, bos, t0 + 16, T, i_h, H, K, c0, 16, BK)
        _store_tile(gcum, G2, bos, t0 + 32, T, i_h, H, K, c0, 16, BK)
        _store_tile(gcum, G3, bos, t0 + 48, T, i_h, H, K, c0, 16, BK)
        k0 = _load_tile(k, bos, t0, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k1 = _load_tile(k, bos, t0 + 16, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k2 = _load_tile(k, bos, t0 + 32, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        k3 = _load_tile(k, bos, t0 + 48, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        q0 = _load_tile(q, bos, t0, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        q1 = _load_tile(q, bos, t0 + 16, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        q2 = _load_tile(q, bos, t0 + 32, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        q3 = _load_tile(q, bos, t0 + 48, T, i_h // G, H // G, K, c0, 16, BK).to(tl.float32)
        if HAS_BOUND:
            n0, n1, n2, n3 = _add_squares(n0, n1, n2, n3, k0, k1, k2, k3)
            m0 = tl.maximum(m0, _gate_rowmax(g, bos, t0, T, i_h, H, K, c0, BK))
            m1 = tl.maximum(m1, _gate_rowmax(g, bos, t0 + 16, T, i_h, H, K, c0, BK))
            m2 = tl.maximum(m2, _gate_rowmax(g, bos, t0 + 32, T, i_h, H, K, c0, BK))
            m3 = tl.maximum(m3, _gate_rowmax(g, bos, t0 + 48, T, i_h, H, K, c0, BK))
        # the row references (`_kda_gram`'s): mid span when every key's block span is < FAST_SPAN, else b_I
        fast = tl.max(tl.maximum(tl.maximum(-g1, g1 - g2), tl.maximum(g2 - g3, g3 - gl)), 0) < FAST_SPAN
        r0 = tl.where(fast, 0.5 * g1, 0.0)
        r1 = tl.where(fast, 0.5 * (g1 + g2), g1)
        r2 = tl.where(fast, 0.5 * (g2 + g3), g2)
        r3 = tl.where(fast, 0.5 * (g3 + gl), g3)
        E0 = tl.exp(G0 - r0[None, :])
        E1 = tl.exp(G1 - r1[None, :])
        E2 = tl.exp(G2 - r2[None, :])
        E3 = tl.exp(G3 - r3[None, :])
        Lq1, Lk1 = q1 * E1, k1 * E1
        Lq2, Lk2 = q2 * E2, k2 * E2
        Lq3, Lk3 = q3 * E3, k3 * E3
        # below the diagonal: R_J = k_J exp(e_J - G_J), then per pair k_j exp(r_I - G_j) = R_J exp(r_I - e_J)
        R0 = k0 * tl.exp(g1[None, :] - G0)
        R1 = k1 * tl.exp(g2[None, :] - G1)
        R2 = k2 * tl.exp(g3[None, :] - G2)
        S = _pair(R0, r1, g1)
        Q10 = tl.dot(Lq1, S, Q10)
        A10 = tl.dot(Lk1, S, A10)
        S = _pair(R0, r2, g1)
        Q20 = tl.dot(Lq2, S, Q20)
        A20 = tl.dot(Lk2, S, A20)
        S = _pair(R1, r2, g2)
        Q21 = tl.dot(Lq2, S, Q21)
        A21 = tl.dot(Lk2, S, A21)
        S = _pair(R0, r3, g1)
        Q30 = tl.dot(Lq3, S, Q30)
        A30 = tl.dot(Lk3, S, A30)
        S = _pair(R1, r3, g2)
        Q31 = tl.dot(Lq3, S, Q31)
        A31 = tl.dot(Lk3, S, A31)
        S = _pair(R2, r3, g3)
        Q32 = tl.dot(Lq3, S, Q32)
        A32 = tl.dot(Lk3, S, A32)
        if fast:  # the diagonal blocks: right factors k_I exp(r_I - G_I) <= exp(FAST_SPAN / 2)
            D = tl.trans(k0 * tl.exp(r0[None, :] - G0))
            Q00 = tl.dot(q0 * E0, D, Q00)
            A00 = tl.dot(k0 * E0, D, A00)
            D = tl.trans(k1 * tl.exp(r1[None, :] - G1))
            Q11 = tl.dot(Lq1, D, Q11)
            A11 = tl.dot(Lk1, D, A11)
            D = tl.trans(k2 * tl.exp(r2[None, :] - G2))
            Q22 = tl.dot(Lq2, D, Q22)
            A22 = tl.dot(Lk2, D, A22)
            D = tl.trans(k3 * tl.exp(r3[None, :] - G3))
            Q33 = tl.dot(Lq3, D, Q33)
            A33 = tl.dot(Lk3, D, A33)
        else:
            Xq, Xk = _diag_grams(q0, k0, G0, BK)
            Q00, A00 = Q00 + Xq, A00 + Xk
            Xq, Xk = _diag_grams(q1, k1, G1, BK)
            Q11, A11 = Q11 + Xq, A11 + Xk
            Xq, Xk = _diag_grams(q2, k2, G2, BK)
            Q22, A22 = Q22 + Xq, A22 + Xk
            Xq, Xk = _diag_grams(q3, k3, G3, BK)
            Q33, A33 = Q33 + Xq, A33 + Xk
    return (Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, A00, A10, A11, A20, A21, A22, A30, A31, A32, A33,
            m0, m1, m2, m3, n0, n1, n2, n3)  # fmt: skip


@triton.jit
def _rows4(X, C: tl.constexpr):
    """The four 16-row blocks of a [64, C] register tile (reshape, permute, splits: a copy, exact)."""
    Y = tl.permute(tl.reshape(X, [2, 2, 16, C]), [2, 3, 0, 1])  # (r, c, I // 2, I % 2)
    lo, hi = tl.split(Y)
    X0, X2 = tl.split(lo)
    X1, X3 = tl.split(hi)
    return X0, X1, X2, X3


@triton.jit
def _vec4(x):
    """The four 16-row blocks of a [64] register vector (`_rows4`)."""
    lo, hi = tl.split(tl.permute(tl.reshape(x, [2, 2, 16]), [2, 0, 1]))
    x0, x2 = tl.split(lo)
    x1, x3 = tl.split(hi)
    return x0, x1, x2, x3


@triton.jit
def _last_row(X):
    """The last row of a [16, C] tile, [C] (a masked sum: exact)."""
    return tl.sum(tl.where((tl.arange(0, 16) == 15)[:, None], X, 0.0), 0)


@triton.jit
def _col_pair(QC, AC, qt, kt, G, kJ, GJ, ref, lo: tl.constexpr):
    """Column block J of both grams over one column block of keys, rows 16 lo.. of the chunk (the others 0): the
    [64, BK] x [BK, 16] products (scale q (x) exp(G - ref)) (k_J (x) exp(ref - G_J))^T and the same with k on the left;
    ref [BK] per key, >= G on those rows up to exp(FAST_SPAN / 2) (module docstring of `_kda_grams64`)."""
    rows = tl.arange(0, 64)[:, None] >= lo
    E = tl.exp(tl.where(rows, G - ref[None, :], float("-inf")))
    R = tl.trans(kJ * tl.exp(ref[None, :] - GJ))
    return tl.dot(qt * E, R, QC), tl.dot(kt * E, R, AC)


@triton.jit
def _place(X, J: tl.constexpr):
    """A [16, 16] tile at rows 16 J.. of a [64, 16] zero tile, by a product with a 0/1 selection in full fp32 (exact)."""
    sel = tl.where(tl.arange(0, 64)[:, None] == J * 16 + tl.arange(0, 16)[None, :], 1.0, 0.0)
    return tl.dot(sel, X, input_precision="ieee")


@triton.jit
def _kda_grams64(q, k, g, gcum, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                 G: tl.constexpr, HAS_BOUND: tl.constexpr):  # fmt: skip
    """Both decayed grams of the chunk at t0 in one pass over the column blocks of BK in 64-row tiles (the tiles64
    variant): per gram four [64, 16] column blocks J (rows before block J zero; diagonal blocks unmasked), each one
    [64, BK] x [BK, 16] product per column block of keys (a product split over the warps by rows); G stored into gcum;
    with HAS_BOUND each token's largest floored gate and ||k||^2, fp32 [64] (else -inf and zeros).

    Column block J's product takes one per-key reference ref_J for all its rows: the left factor x_i exp(G_i - ref_J)
    on rows i >= 16 J, the right k_j exp(ref_J - G_j) on block J's rows.
    - Every key's span in the 4 blocks < FAST_SPAN: ref_J = the mid gate of block J's span. Both factors lie within
      e^(+-SPAN/2) on block J's rows; on later rows the left one is <= e^(-SPAN/2), and where it underflows the term
      is below e^(SPAN/2 - 87) = e^-37 (`_kda_gram`'s bound). The diagonal blocks are in the same product.
    - Else: ref_J = the gate at block J's last row, rows i > block J only (every exponent <= 0; an underflowed factor
      drops a term below e^-87); the diagonal blocks elementwise (`_diag_grams` on 16-row tiles taken out of the
      64-row ones, placed into their column blocks by an exact product)."""
    QC0 = tl.zeros([64, 16], dtype=tl.float32)
    QC1 = tl.zeros([64, 16], dtype=tl.float32)
    QC2 = tl.zeros([64, 16], dtype=tl.float32)
    QC3 = tl.zeros([64, 16], dtype=tl.float32)
    AC0 = tl.zeros([64, 16], dtype=tl.float32)
    AC1 = tl.zeros([64, 16], dtype=tl.float32)
    AC2 = tl.zeros([64, 16], dtype=tl.float32)
    AC3 = tl.zeros([64, 16], dtype=tl.float32)
    m = tl.full([64], float("-inf"), tl.float32)
    n = tl.zeros([64], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        x = tl.maximum(_load_tile(g, bos, t0, T, i_h, H, K, c0, 64, BK).to(tl.float32), FLOOR)
        Gt = tl.cumsum(x, 0)  # rows past T add 0
        _store_tile(gcum, Gt, bos, t0, T, i_h, H, K, c0, 64, BK)
        kt = _load_tile(k, bos, t0, T, i_h // G, H // G, K, c0, 64, BK).to(tl.float32)
        qt = _load_tile(q, bos, t0, T, i_h // G, H // G, K, c0, 64, BK).to(tl.float32)
        if HAS_BOUND:
            n += tl.sum(kt * kt, 1)
            m = tl.maximum(m, tl.max(tl.where((c0 + tl.arange(0, BK) < K)[None, :], x, float("-inf")), 1))
        G0, G1, G2, G3 = _rows4(Gt, BK)
        k0, k1, k2, k3 = _rows4(kt, BK)
        e0, e1, e2, e3 = _last_row(G0), _last_row(G1), _last_row(G2), _last_row(G3)
        fast = tl.max(tl.maximum(tl.maximum(-e0, e0 - e1), tl.maximum(e1 - e2, e2 - e3)), 0) < FAST_SPAN
        if fast:
            QC0, AC0 = _col_pair(QC0, AC0, qt, kt, Gt, k0, G0, 0.5 * e0, 0)
            QC1, AC1 = _col_pair(QC1, AC1, qt, kt, Gt, k1, G1, 0.5 * (e0 + e1), 16)
            QC2, AC2 = _col_pair(QC2, AC2, qt, kt, Gt, k2, G2, 0.5 * (e1 + e2), 32)
            QC3, AC3 = _col_pair(QC3, AC3, qt, kt, Gt, k3, G3, 0.5 * (e2 + e3), 48)
        else:
            QC0, AC0 = _col_pair(QC0, AC0, qt, kt, Gt, k0, G0, e0, 16)
            QC1, AC1 = _col_pair(QC1, AC1, qt, kt, Gt, k1, G1, e1, 32)
            QC2, AC2 = _col_pair(QC2, AC2, qt, kt, Gt, k2, G2, e2, 48)
            q0, q1, q2, q3 = _rows4(qt, BK)
            Xq, Xk = _diag_grams(q0, k0, G0, BK)
            QC0, AC0 = QC0 + _place(Xq, 0), AC0 + _place(Xk, 0)
            Xq, Xk = _diag_grams(q1, k1, G1, BK)
            QC1, AC1 = QC1 + _place(Xq, 1), AC1 + _place(Xk, 1)
            Xq, Xk = _diag_grams(q2, k2, G2, BK)
            QC2, AC2 = QC2 + _place(Xq, 2), AC2 + _place(Xk, 2)
            Xq, Xk = _diag_grams(q3, k3, G3, BK)
            QC3, AC3 = QC3 + _place(Xq, 3), AC3 + _place(Xk, 3)
    return QC0, QC1, QC2, QC3, AC0, AC1, AC2, AC3, m, n


@triton.jit
def _store_aqk_cols(aqk, bos, t0, T, i_h, QC0, QC1, QC2, QC3, scale, H: tl.constexpr, BT: tl.constexpr):
    """Aqk = scale (the q-k gram's column blocks of `_kda_grams64`) on and below the diagonal into [.., T, H, BT]
    (the entries above it are not written; columns past BT skipped)."""
    o_r = tl.arange(0, 64)
    o_c = tl.arange(0, 16)
    p = aqk + ((bos + t0 + o_r) * H + i_h)[:, None] * BT + o_c[None, :]
    ok = (t0 + o_r < T)[:, None]
    tl.store(p, (QC0 * scale).to(p.dtype.element_ty), mask=ok & (o_r[:, None] >= o_c[None, :]) & (0 + o_c < BT)[None, :])
    tl.store(
        p + 16, (QC1 * scale).to(p.dtype.element_ty), mask=ok & (o_r[:, None] >= 16 + o_c[None, :]) & (16 + o_c < BT)[None, :]
    )
    tl.store(
        p + 32, (QC2 * scale).to(p.dtype.element_ty), mask=ok & (o_r[:, None] >= 32 + o_c[None, :]) & (32 + o_c < BT)[None, :]
    )
    tl.store(
        p + 48, (QC3 * scale).to(p.dtype.element_ty), mask=ok & (o_r[:, None] >= 48 + o_c[None, :]) & (48 + o_c < BT)[None, :]
    )


@triton.jit
def _store_a_cols(abuf, bos, t0, T, i_h, AC0, AC1, AC2, AC3, b, H: tl.constexpr, BT: tl.constexpr):
    """A = StrictLower(the k-k gram's column blocks of `_kda_grams64`) with beta b [64] on the rows into the fp32
    [.., T, H, BT] scratch of the split_solve variant (entries on and above the diagonal not written)."""
    o_r = tl.arange(0, 64)
    o_c = tl.arange(0, 16)
    p = abuf + ((bos + t0 + o_r) * H + i_h)[:, None] * BT + o_c[None, :]
    ok = (t0 + o_r < T)[:, None]
    tl.store(p, AC0 * b[:, None], mask=ok & (o_r[:, None] > o_c[None, :]) & (o_c < BT)[None, :])
    tl.store(p + 16, AC1 * b[:, None], mask=ok & (o_r[:, None] > 16 + o_c[None, :]) & (16 + o_c < BT)[None, :])
    tl.store(p + 32, AC2 * b[:, None], mask=ok & (o_r[:, None] > 32 + o_c[None, :]) & (32 + o_c < BT)[None, :])
    tl.store(p + 48, AC3 * b[:, None], mask=ok & (o_r[:, None] > 48 + o_c[None, :]) & (48 + o_c < BT)[None, :])


@triton.heuristics(
    {
        "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        "HAS_BOUND": lambda args: args["bnd"] is not None,
        "GATED": lambda args: args["kd"] is not None,
        "G": group_heads("g"),
    }
)
@triton.jit(do_not_specialize=["T"])
def wy_kda_ag_fwd_kernel(
    q,  # [B, T, H, K]
    k,  # [B, T, H, K]
    v,  # [B, T, HV, V] or None (read only for bnd)
    g,  # [B, T, HV, K] natural-log per-key gate
    beta,  # [B, T, HV]
    ag,  # out [B, T, HV, BT] = T diag(beta), zeros above the diagonal
    aqk,  # out [B, T, HV, BT] scale (Q K^T (x) decay), on and below the diagonal
    gcum,  # out [B, T, HV, K] fp32 in-chunk cumsum of the floored g, or None (GATED)
    qg, ke, kd, gc,  # out or None (GATED): [B, T, HV, K] scale Q exp(G), K exp(G), K exp(G_C - G); [NT_total, HV, K] G_C
    cu_seqlens,  # [N+1] int32 or None
    chunk_indices,  # [NT_total, 2] int32 or None
    bnd,  # out [NT_total, HV, 2] fp32 or None: the chunk's decay-bound summary (L, W) (`_chunk_bound`, warm_split)
    abuf,  # out [B, T, HV, BT] fp32 or None (SPLIT): A's strictly lower part with beta on the rows, for the solve kernel
    scale, T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_BOUND: tl.constexpr, G: tl.constexpr, ONE_PASS: tl.constexpr,
    TILES64: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    i_hv, i_tg, bos, t0, T, _ = _wy_chunk(cu_seqlens, chunk_indices, None, T, HV, BT, IS_VARLEN, False)
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_hv, HV)
    if TILES64:  # both grams in one pass in 64-row tiles (KDA_AG_VARIANTS), the bound's per-token facts on the way
        QC0, QC1, QC2, QC3, AC0, AC1, AC2, AC3, xm, kkm = _kda_grams64(
            q, k, g, gcum, bos, t0, T, i_hv, HV, K, BK, G, HAS_BOUND
        )
        _store_aqk_cols(aqk, bos, t0, T, i_hv, QC0, QC1, QC2, QC3, scale, HV, BT)
        if SPLIT:  # A to memory, the solve in its own kernel (`wy_kda_ag_solve_kernel`)
            _store_a_cols(abuf, bos, t0, T, i_hv, AC0, AC1, AC2, AC3, _load_vec(beta, bos, t0, T, i_hv, HV, 64), HV, BT)
        else:
            A00, A10, A20, A30 = _rows4(AC0, 16)
            _, A11, A21, A31 = _rows4(AC1, 16)
            _, _, A22, A32 = _rows4(AC2, 16)
            _, _, _, A33 = _rows4(AC3, 16)
        x0, x1, x2, x3 = _vec4(xm)
        kk0, kk1, kk2, kk3 = _vec4(kkm)
    elif ONE_PASS:  # both grams in one pass (KDA_AG_VARIANTS), with the bound's per-token facts on the way
        (Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, A00, A10, A11, A20, A21, A22, A30, A31, A32, A33,
         x0, x1, x2, x3, kk0, kk1, kk2, kk3) = _kda_grams(q, k, g, gcum, bos, t0, T, i_hv, HV, K, BK, G, HAS_BOUND)  # fmt: skip
        _store_kda_aqk(aqk, bos, t0, T, i_hv, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, HV, BT)
    elif GATED:  # the q-k gram (stores qg), then the k-k gram (stores kd, gc and ke)
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _kda_gram(
            q, k, g, qg, bos, t0, T, i_hv, gc, scale, HV, K, BK, False, G, 1
        )
        _store_kda_aqk(aqk, bos, t0, T, i_hv, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, HV, BT)
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(
            k, k, g, kd, bos, t0, T, i_hv, gc + (i_tg * HV + i_hv) * K, 1.0, HV, K, BK, True, G, 3, ke
        )
    else:
        # the q-k gram (stores G), then the k-k gram (stores nothing): one set of 10 accumulators live at a time
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _kda_gram(
            q, k, g, gcum, bos, t0, T, i_hv, gcum, scale, HV, K, BK, False, G, 2
        )
        _store_kda_aqk(aqk, bos, t0, T, i_hv, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, HV, BT)
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(
            k, k, g, gcum, bos, t0, T, i_hv, gcum, 1.0, HV, K, BK, True, G, 0
        )
    if not SPLIT:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_beta_rows(
            A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, b0, b1, b2, b3
        )
        T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
        _store_ag(ag, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, bos, t0, T, i_hv, HV, BT)
    if HAS_BOUND:
        if ONE_PASS or TILES64:
            vv0, vv1, vv2, vv3 = _row_squares(v, bos, t0, T, i_hv, HV, V, BV)
            b_L, b_W = _chunk_bound(x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, vv0, vv1, vv2, vv3)
            tl.store(bnd + (i_tg * HV + i_hv) * 2, b_L)
            tl.store(bnd + (i_tg * HV + i_hv) * 2 + 1, b_W)
        else:
            x0, x1, x2, x3 = _gate_rowmax4(g, bos, t0, T, i_hv, HV, K, BK)
            _store_bound(
                bnd, k, v, x0, x1, x2, x3, b0, b1, b2, b3, bos, t0, T, i_tg, i_hv // G, HV // G, i_hv, HV, K, V, BK, BV
            )


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T"])
def wy_kda_ag_solve_kernel(
    abuf,  # [B, T, HV, BT] fp32: A's strictly lower part with beta on the rows (entries above it unread)
    beta,  # [B, T, HV]
    ag,  # out [B, T, HV, BT] = T diag(beta), zeros above the diagonal
    cu_seqlens, chunk_indices, T,
    HV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """The split_solve variant's second kernel: Ag = (I + A)^{-1} diag(beta) of one chunk and value head from A in
    memory (the 10 lower 16x16 blocks, the diagonal ones masked to j < i), `_solve` and `_store_ag` as the Ag pass."""
    i_hv, _, bos, t0, T, _ = _wy_chunk(cu_seqlens, chunk_indices, None, T, HV, BT, IS_VARLEN, False)
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_hv, HV)
    o_i = tl.arange(0, 16)
    m_d = o_i[:, None] > o_i[None, :]
    A00 = tl.where(m_d, _load_tile(abuf, bos, t0, T, i_hv, HV, BT, 0, 16, 16), 0.0)
    A10 = _load_tile(abuf, bos, t0 + 16, T, i_hv, HV, BT, 0, 16, 16)
    A11 = tl.where(m_d, _load_tile(abuf, bos, t0 + 16, T, i_hv, HV, BT, 16, 16, 16), 0.0)
    A20 = _load_tile(abuf, bos, t0 + 32, T, i_hv, HV, BT, 0, 16, 16)
    A21 = _load_tile(abuf, bos, t0 + 32, T, i_hv, HV, BT, 16, 16, 16)
    A22 = tl.where(m_d, _load_tile(abuf, bos, t0 + 32, T, i_hv, HV, BT, 32, 16, 16), 0.0)
    A30 = _load_tile(abuf, bos, t0 + 48, T, i_hv, HV, BT, 0, 16, 16)
    A31 = _load_tile(abuf, bos, t0 + 48, T, i_hv, HV, BT, 16, 16, 16)
    A32 = _load_tile(abuf, bos, t0 + 48, T, i_hv, HV, BT, 32, 16, 16)
    A33 = tl.where(m_d, _load_tile(abuf, bos, t0 + 48, T, i_hv, HV, BT, 48, 16, 16), 0.0)
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    _store_ag(ag, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, bos, t0, T, i_hv, HV, BT)


def wy_kda_ag(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan | None = None,
    bnd: Tensor | None = None, v: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | GatedKeys]:  # fmt: skip
    """KDA's Ag pass: (ag, aqk `[B, T, HV, BT]` in k's dtype, gcum fp32 `[B, T, HV, K]`), or with the launch config's
    `gated` variant (`KDA_AG_VARIANTS`) (ag, aqk, `GatedKeys`) and no gcum.

    q, k `[B, T, H, K]`; g `[B, T, HV, K]`, beta `[B, T, HV]`, HV a multiple of H (value head h reads key head
    h // (HV / H)). bnd: fp32 `[NT_total, HV, 2]` or None: receives each chunk's decay-bound summary (L, W), as
    `wy_kda_fwd(bnd=)`; it needs v `[B, T, HV, V]` (its rows' norms; v is not read otherwise).
    """
    B, T, H, K = k.shape
    HV = g.shape[2]
    if q.shape != k.shape or g.shape != (B, T, HV, K) or beta.shape != (B, T, HV) or HV % H:
        raise ValueError(
            f"wy_kda_ag: q must be k's shape, g [B, T, HV, K] and beta [B, T, HV] with HV a multiple of k's H={H}, "
            f"got q {tuple(q.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} for k {tuple(k.shape)}"
        )
    BT, V, cfg = ag_launch("wy_kda_ag", WY_KDA_AG_FWD, launch, k, HV, index, bnd, v)
    BK, BV = _blocks(cfg, index, K, V)
    bits = cfg.VARIANT or 0
    if bits & ~sum(KDA_AG_VARIANTS.values()):
        raise ValueError(f"wy_kda_ag: unknown VARIANT bits {bits}; the bits are {KDA_AG_VARIANTS}")
    split = bool(bits & KDA_AG_VARIANTS["split_solve"])
    if split and not bits & KDA_AG_VARIANTS["tiles64"]:
        raise ValueError(f"wy_kda_ag: the split_solve variant needs tiles64 (VARIANT bits {KDA_AG_VARIANTS}), got {bits}")
    is_gated = bool(bits & KDA_AG_VARIANTS["gated"])
    if is_gated and bits & (KDA_AG_VARIANTS["one_pass"] | KDA_AG_VARIANTS["tiles64"]):
        raise ValueError(f"wy_kda_ag: the gated variant runs with the default code only (VARIANT bits {KDA_AG_VARIANTS}), "
                         f"got {bits}")  # fmt: skip
    ag = torch.empty(B, T, HV, BT, dtype=k.dtype, device=k.device)
    aqk = torch.empty(B, T, HV, BT, dtype=k.dtype, device=k.device)
    gated: GatedKeys | None = None
    gcum: Tensor | None = None
    if is_gated:
        gated = GatedKeys(*(k.new_empty(B, T, HV, K) for _ in range(3)),
                          gc=torch.empty(index.num_chunks, HV, K, dtype=torch.float32, device=k.device))  # fmt: skip
    else:
        gcum = torch.empty(B, T, HV, K, dtype=torch.float32, device=k.device)
    abuf = torch.empty(B, T, HV, BT, dtype=torch.float32, device=k.device) if split else None
    cu, ci = (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)
    grid = _grid(index, B, T, HV)
    wy_kda_ag_fwd_kernel[grid](
        q, k, v if bnd is not None else None, g, beta, ag, aqk, gcum, *(gated or (None,) * 4), cu, ci, bnd, abuf, scale,
        T, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, ONE_PASS=bool(bits & KDA_AG_VARIANTS["one_pass"]),
        TILES64=bool(bits & KDA_AG_VARIANTS["tiles64"]), SPLIT=split, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split:
        wy_kda_ag_solve_kernel[grid](abuf, beta, ag, cu, ci, T, HV=HV, BT=BT, num_warps=SOLVE_WARPS, num_stages=1)
    if gated is not None:
        return ag, aqk, gated
    assert gcum is not None
    return ag, aqk, gcum
