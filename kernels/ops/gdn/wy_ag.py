"""GDN's WY pass for the two-kernel forward (FlashQLA's decomposition): per chunk and value head it stores only

    Ag = T diag(beta),   T = (I + A)^{-1},   A = StrictLower(beta_i k_i.k_j exp(G_i - G_j))

`[B, T, HV, BT]` in k's dtype (row i of chunk c holds row i of the chunk's BT x BT Ag: the lower triangle with the
diagonal, zeros above it) and the fp32 in-chunk gate cumsum `gcum` `[B, T, HV]` (as `wy_gdn_fwd`'s). No q, no v, no
w, u or Aqk: the state+output pass forms u - w S = Ag (V - exp(G) (x) K S) itself.

`wy_gdn_fwd`'s machinery (`kernels.common.wy`: the gate cumsum, the gram of K, the gate and beta on A's rows, the
block solve), stopped after T. Two tilings of the gram K K^T, chosen by the launch config's `BR`:
- BR = 16 (default): the 10 lower 16x16 blocks, each a 16 x BK x 16 product in registers (`wy.py`'s `_gram`; one warp);
- BR = 64: one [64, BK] x [BK, 64] product per column block (4 warps: a warpgroup product on Hopper), its 10 lower
  16x16 blocks then taken out of the 64x64 register tile by reshapes, a permute and splits (`_lower_blocks`: a copy,
  exact; the compiler moves the data through shared memory, no global scratch).
Both then take the gate and beta, solve for T (`_solve`) and store T diag(beta) block by block.

Grouped value heads: k has H heads, g and beta HV = G H; value head h reads key head h // G (no repeat).
The warm split's per-chunk bound sums (`bnd`, `kernels.common.warm_split`) need ||v||^2 per token: with `bnd`, v
must be given (read only for those squares). The backward's reverse bound sums (`kernels.common.warm_bwd`, step 2) need
||q||^2 besides the gate, beta and ||k||^2 this pass has: with `rev`, q must be given (read only for those squares),
and the pass stores their q, k side, so the backward reads only do for them (`warm_bwd.reverse_chunk_bound_kept`).

Grid: dense (NT, B * HV); varlen (NT_total, HV) with the chunk index of `kernels.common.index` (the first dim halved
with the `two_chunks` variant: `AG_VARIANTS`, the launch config's VARIANT bits, exp2 too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program, heuristics
from kernels.common.index import ChunkIndex
from kernels.common.wy import (
    BOUND_MARGIN,
    CHUNK_SIZES,
    LOG2E,
    _add_squares,
    _blocks,
    _chunk_bound,
    _gdn_decay_rows,
    _gdn_gate,
    _gram,
    _grid,
    _load_blocks,
    _load_tile,
    _load_vec4,
    _solve,
    _store_aqk,
    _store_tile,
)
from kernels.configs import KernelSpec, LaunchConfig, cdiv, register
from kernels.ops.gdn.ag_hopper import ag_hopper, ag_hopper_wanted
from kernels.plan import LaunchPlan, launch_config

__all__ = ["AG_VARIANTS", "WY_GDN_AG_FWD", "wy_gdn_ag"]

WY_GDN_AG_FWD = register(
    KernelSpec(
        name="wy_gdn_ag_fwd",
        key=("H", "HV", "K", "BT", "IS_VARLEN", "dtype"),
        # BR 16: wy_gdn_fwd's 16-row blocks at its measured one warp (ptxas sm_90, K=128: BK 32 252 registers, no
        # spill; BK 64 spills 392 B); BR 64 (wgmma; 255 registers: 208 B spilled at 4 warps / BK 128, none at 8 warps
        # / BK 64) to time against it: benchmarks/wy_ag_lab.py. Not measured on a GPU yet.
        default=LaunchConfig(BK=32, BV=64, num_warps=1, num_stages=2, BR=16),
        space={"BR": (16, 64), "BK": (32, 64, 128), "num_warps": (1, 2, 4), "num_stages": (1, 2, 3)},
    )
)
ROW_TILES = (16, 64)  # the BR values the kernel takes
# code variants, bits of the launch config's VARIANT (None: 0): two_chunks: two chunk rows per program (half the
# programs; the two chunks' code straight-line in one program, for the compiler to interleave); exp2: the gate's decay
# in A by exp2 of the gates prescaled by log2(e) once per chunk
AG_VARIANTS = {"two_chunks": 1, "exp2": 2, "exact_inverse": 4}
# exact_inverse (session 20): the diagonal blocks' inverse by `_inv_diag4`'s fp32 substitution instead of the default
# tf32 product form (`kernels.common.wy._solve`)


@triton.jit
def _row_squares(p, bos, t0, T, i_h, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """The squared norms of the chunk's rows of a [.., T, H, D] tensor for head i_h, fp32 [16] per 16-row block."""
    n0 = tl.zeros([16], dtype=tl.float32)
    n1 = tl.zeros([16], dtype=tl.float32)
    n2 = tl.zeros([16], dtype=tl.float32)
    n3 = tl.zeros([16], dtype=tl.float32)
    for i_d in range(tl.cdiv(D, BD)):
        x0, x1, x2, x3 = _load_blocks(p, bos, t0, T, i_h, H, D, i_d * BD, BD)
        n0, n1, n2, n3 = _add_squares(n0, n1, n2, n3, x0, x1, x2, x3)
    return n0, n1, n2, n3


@triton.jit
def _key_squares(k, A00, A11, A22, A33, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """||k||^2 of the chunk's rows (key head i_h), fp32 [16] per 16-row block: the diagonal of the raw gram K K^T's
    diagonal blocks A00..A33 for 16-bit k (its products exact in fp32: session 20, one read of k and ~1000 of the
    pass's ~11600 instructions fewer), read again and squared for fp32 k (whose gram is a tf32 product on a GPU)."""
    if k.dtype.element_ty == tl.float32:
        kk0, kk1, kk2, kk3 = _row_squares(k, bos, t0, T, i_h, H, K, BK)
    else:
        o_i = tl.arange(0, 16)
        eye = o_i[:, None] == o_i[None, :]
        kk0 = tl.sum(tl.where(eye, A00, 0.0), 1)
        kk1 = tl.sum(tl.where(eye, A11, 0.0), 1)
        kk2 = tl.sum(tl.where(eye, A22, 0.0), 1)
        kk3 = tl.sum(tl.where(eye, A33, 0.0), 1)
    return kk0, kk1, kk2, kk3


@triton.jit
def _store_bound(bnd, v, x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, bos, t0, T, i_tg, i_hv, HV: tl.constexpr,
                 V: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    """The chunk's decay-bound summary (`_chunk_bound`; x: each token's largest floored gate; kk: ||k||^2 per token)
    into bnd [NT_total, HV, 2] at the global chunk i_tg, with ||v||^2 (value head i_hv of HV) read here."""
    vv0, vv1, vv2, vv3 = _row_squares(v, bos, t0, T, i_hv, HV, V, BV)
    b_L, b_W = _chunk_bound(x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, vv0, vv1, vv2, vv3)
    tl.store(bnd + (i_tg * HV + i_hv) * 2, b_L)
    tl.store(bnd + (i_tg * HV + i_hv) * 2 + 1, b_W)


@triton.jit
def _store_p(p_r, qq, c, m):
    """p = 0.5 log qq + c of a 16-row block at p_r (rows m); -inf where qq = 0 (a zero q row writes nothing; no log
    of 0)."""
    tl.store(p_r, tl.where(qq > 0.0, 0.5 * tl.log(tl.where(qq > 0.0, qq, 1.0)) + c, float("-inf")), mask=m)


@triton.jit
def _store_rev_bound(q, rp, rc, x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, bos, t0, T, i_tg, i_h, i_hv,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """The q, k side of the backward's reverse bound sums of the chunk (`kernels.common.warm_bwd`, step 2; x: each
    token's floored gate, kk: ||k||^2), with ||q||^2 (key head i_h of H) read here: per token of value head i_hv
    p = 0.5 log ||q||^2 + the inclusive in-chunk cumsum of l (-inf where q = 0) into rp [.., T, HV], and the chunk's
    (L + BOUND_MARGIN A, A) (A = sum |l|) into rc [NT_total, HV, 2] at the global chunk i_tg."""
    qq0, qq1, qq2, qq3 = _row_squares(q, bos, t0, T, i_h, H, K, BK)
    # l = g + log max(1, |1 - beta ||k||^2|) (`_bound_logs`); rows past T load g = 0, beta = 0: l = 0
    l0 = x0 + tl.log(tl.maximum(tl.abs(1.0 - b0 * kk0), 1.0))
    l1 = x1 + tl.log(tl.maximum(tl.abs(1.0 - b1 * kk1), 1.0))
    l2 = x2 + tl.log(tl.maximum(tl.abs(1.0 - b2 * kk2), 1.0))
    l3 = x3 + tl.log(tl.maximum(tl.abs(1.0 - b3 * kk3), 1.0))
    s0, s1, s2, s3 = tl.sum(l0, 0), tl.sum(l1, 0), tl.sum(l2, 0), tl.sum(l3, 0)
    A = tl.sum(tl.abs(l0), 0) + tl.sum(tl.abs(l1), 0) + tl.sum(tl.abs(l2), 0) + tl.sum(tl.abs(l3), 0)
    # the cumsum across the four blocks: each block's own plus the sums of the blocks before
    c0 = tl.cumsum(l0, 0)
    c1 = tl.cumsum(l1, 0) + s0
    c2 = tl.cumsum(l2, 0) + (s0 + s1)
    c3 = tl.cumsum(l3, 0) + (s0 + s1 + s2)
    o_i = tl.arange(0, 16)
    p_r = rp + (bos + t0 + o_i) * HV + i_hv
    _store_p(p_r, qq0, c0, t0 + o_i < T)
    _store_p(p_r + 16 * HV, qq1, c1, t0 + 16 + o_i < T)
    _store_p(p_r + 32 * HV, qq2, c2, t0 + 32 + o_i < T)
    _store_p(p_r + 48 * HV, qq3, c3, t0 + 48 + o_i < T)
    # L rounded up as `_chunk_bound` rounds it; A for the backward's margin on W (it rounds W there)
    tl.store(rc + (i_tg * HV + i_hv) * 2, (s0 + s1 + s2 + s3) + BOUND_MARGIN * A)
    tl.store(rc + (i_tg * HV + i_hv) * 2 + 1, A)


@triton.jit
def _split_rows(Y):
    """The four row blocks of Y [16, 16, 2, 2] (r, c, I // 2, I % 2) as [16, 16] tiles (`_lower_blocks`)."""
    e, o = tl.split(Y)
    Y0, Y2 = tl.split(e)
    Y1, Y3 = tl.split(o)
    return Y0, Y1, Y2, Y3


@triton.jit
def _lower_blocks(X):
    """The 10 lower 16x16 blocks of a 64x64 register tile, by reshapes and splits (a copy: exact)."""
    Xq = tl.reshape(tl.permute(tl.reshape(X, [4, 16, 4, 16]), [1, 3, 0, 2]), [16, 16, 2, 2, 2, 2])
    c0, c1 = tl.split(Xq)  # column blocks J even / odd: (r, c, I // 2, I % 2, J // 2)
    XJ0, XJ2 = tl.split(c0)
    XJ1, XJ3 = tl.split(c1)
    X00, X10, X20, X30 = _split_rows(XJ0)
    _, X11, X21, X31 = _split_rows(XJ1)
    _, _, X22, X32 = _split_rows(XJ2)
    _, _, _, X33 = _split_rows(XJ3)
    return X00, X10, X11, X20, X21, X22, X30, X31, X32, X33


@triton.jit
def _gram64(k, bos, t0, T, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """The 10 lower 16x16 blocks of K K^T over the chunk at t0 (fp32) from one [64, BK] x [BK, 64] product per column
    block of BK (a warpgroup product on Hopper at 4 warps), taken out of the 64x64 tile in registers."""
    X = tl.zeros([64, 64], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = _load_tile(k, bos, t0, T, i_h, H, K, i_k * BK, 64, BK)
        X = tl.dot(b_k, tl.trans(b_k), X)
    return _lower_blocks(X)


@triton.jit
def _store_ag(
    ag, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, bos, t0, T, i_h, H: tl.constexpr, BT: tl.constexpr
):
    """Ag = T diag(beta) into [.., T, H, BT]: the 10 lower blocks of T with column j scaled by beta_j, and zeros in
    the 6 blocks above the diagonal (columns past BT and rows past T are skipped)."""
    c0, c1, c2, c3 = b0[None, :], b1[None, :], b2[None, :], b3[None, :]
    _store_aqk(
        ag,
        bos,
        t0,
        T,
        i_h,
        T00 * c0,
        T10 * c0,
        T11 * c1,
        T20 * c0,
        T21 * c1,
        T22 * c2,
        T30 * c0,
        T31 * c1,
        T32 * c2,
        T33 * c3,
        H,
        BT,
    )
    z = tl.zeros([16, 16], dtype=tl.float32)
    _store_tile(ag, z, bos, t0, T, i_h, H, BT, 16, 16, 16)
    _store_tile(ag, z, bos, t0, T, i_h, H, BT, 32, 16, 16)
    _store_tile(ag, z, bos, t0, T, i_h, H, BT, 48, 16, 16)
    _store_tile(ag, z, bos, t0 + 16, T, i_h, H, BT, 32, 16, 16)
    _store_tile(ag, z, bos, t0 + 16, T, i_h, H, BT, 48, 16, 16)
    _store_tile(ag, z, bos, t0 + 32, T, i_h, H, BT, 48, 16, 16)


@triton.jit
def _ag_chunk(
    i_c, q, k, v, g, beta, ag, gcum, cu_seqlens, chunk_indices, bnd, rp, rc, T, H: tl.constexpr, HV: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_BOUND: tl.constexpr, HAS_REV: tl.constexpr, EXP2: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Ag, gcum (and the bound sums, forward and reverse) of chunk row i_c of value head program_id(1) (the kernel's
    arguments)."""
    i_hv = tl.program_id(1) % HV
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, tl.program_id(1) // HV, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    t0 = i_t * BT
    T = tl.minimum(T, t0 + BT)  # as `_wy_chunk`: the chunk's rows only
    i_h = i_hv // (HV // H)  # the key head of this value head
    x0, x1, x2, x3, g0, g1, g2, g3 = _gdn_gate(g, gcum, bos, t0, T, i_hv, HV)
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_hv, HV)
    if BR == 64:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gram64(k, bos, t0, T, i_h, H, K, BK)
    else:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gram(k, k, bos, t0, T, i_h, H, K, BK)
    if HAS_BOUND or HAS_REV:
        kk0, kk1, kk2, kk3 = _key_squares(k, A00, A11, A22, A33, bos, t0, T, i_h, H, K, BK)
    if EXP2:  # the decay in log2 units (gcum stays natural-log: the fused pass and the backward read it)
        g0, g1, g2, g3 = g0 * LOG2E, g1 * LOG2E, g2 * LOG2E, g3 * LOG2E
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _gdn_decay_rows(
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, g0, g1, g2, g3, b0, b1, b2, b3, EXP2
    )
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, EXACT)
    _store_ag(ag, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, bos, t0, T, i_hv, HV, BT)
    if HAS_BOUND:
        _store_bound(bnd, v, x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, bos, t0, T, i_tg, i_hv, HV, V, BV)
    if HAS_REV:
        _store_rev_bound(q, rp, rc, x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, bos, t0, T, i_tg, i_h, i_hv,
                         H, HV, K, BK)  # fmt: skip


@heuristics(
    {
        "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        "HAS_BOUND": lambda args: args["bnd"] is not None,
        "HAS_REV": lambda args: args["rp"] is not None,
    }
)
@triton.jit(do_not_specialize=["T", "NC"])
def wy_gdn_ag_fwd_kernel(
    q,  # [B, T, H, K] or None (read only for rp, rc)
    k,  # [B, T, H, K]
    v,  # [B, T, HV, V] or None (read only for bnd)
    g,  # [B, T, HV] natural-log gate
    beta,  # [B, T, HV]
    ag,  # out [B, T, HV, BT] = T diag(beta), zeros above the diagonal
    gcum,  # out [B, T, HV] fp32 in-chunk cumsum of the floored g
    cu_seqlens,  # [N+1] int32 or None
    chunk_indices,  # [NT_total, 2] int32 or None
    bnd,  # out [NT_total, HV, 2] fp32 or None: the chunk's decay-bound summary (L, W) (`_chunk_bound`, warm_split)
    rp,  # out [B, T, HV] fp32 or None: the reverse sums' per-token p (`_store_rev_bound`, kernels.common.warm_bwd)
    rc,  # out [NT_total, HV, 2] fp32 or None: the reverse sums' per-chunk (L + BOUND_MARGIN A, A)
    T,
    NC,  # chunk rows of the grid's first dim (dense: per sequence; varlen: all)
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    CPP: tl.constexpr,  # chunks per program (AG_VARIANTS)
    EXP2: tl.constexpr,  # the decay by exp2 (AG_VARIANTS)
    EXACT: tl.constexpr,  # the diagonal blocks' inverse in fp32 (AG_VARIANTS, `_solve`)
    IS_VARLEN: tl.constexpr,
    HAS_BOUND: tl.constexpr,
    HAS_REV: tl.constexpr,
):
    tl.static_assert(BT == 16 or BT == 32 or BT == 64, "the WY kernel is written for chunks of 16, 32 or 64 tokens")
    for j in tl.static_range(CPP):
        # past the last row: the last chunk again (the same values stored twice; no branch between the chunks)
        i_c = tl.minimum(tl.program_id(0) * CPP + j, NC - 1)
        _ag_chunk(i_c, q, k, v, g, beta, ag, gcum, cu_seqlens, chunk_indices, bnd, rp, rc, T, H, HV, K, V, BT, BK, BV,
                  BR, IS_VARLEN, HAS_BOUND, HAS_REV, EXP2, EXACT)  # fmt: skip


def ag_checks(name: str, k: Tensor, HV: int, index: ChunkIndex, bnd: Tensor | None, v: Tensor | None) -> None:
    """An Ag pass's (GDN's, KDA's) checks: a chunk size the kernels take, and v `[B, T, HV, V]` with bnd (its rows'
    norms); a one-line ValueError otherwise."""
    B, T, H, K = k.shape
    bthv = (B, T, HV)
    if bnd is not None and (v is None or v.shape[:3] != bthv):
        raise ValueError(
            f"{name}: bnd needs v [B, T, HV, V] = [{', '.join(map(str, bthv))}, V] (its rows' norms), got "
            f"{None if v is None else tuple(v.shape)}"
        )
    if index.chunk_size not in CHUNK_SIZES:
        raise ValueError(f"{name}: chunk_size must be one of {CHUNK_SIZES}, got {index.chunk_size}")


def ag_launch(name: str, spec: KernelSpec, launch: LaunchPlan | None, k: Tensor, HV: int, index: ChunkIndex,
              bnd: Tensor | None, v: Tensor | None) -> tuple[int, int, LaunchConfig]:  # fmt: skip
    """(BT, V, the launch config) of an Ag pass (GDN's, KDA's) after `ag_checks` (V = 16 without v, which is then not
    read)."""
    ag_checks(name, k, HV, index, bnd, v)
    B, T, H, K = k.shape
    key = {"H": H, "HV": HV, "K": K, "BT": index.chunk_size, "IS_VARLEN": index.is_varlen,
           "dtype": str(k.dtype).removeprefix("torch.")}  # fmt: skip
    return index.chunk_size, v.shape[-1] if v is not None else 16, launch_config(launch, spec, key)


def wy_gdn_ag(
    k: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    index: ChunkIndex,
    launch: LaunchPlan | None = None,
    bnd: Tensor | None = None,
    v: Tensor | None = None,
    rev: tuple[Tensor, Tensor] | None = None,
    q: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GDN's WY pass for the two-kernel forward: (ag `[B, T, HV, BT]` in k's dtype, gcum fp32 `[B, T, HV]`).

    k `[B, T, H, K]`; g, beta `[B, T, HV]`, HV a multiple of H (value head h reads key head h // (HV / H)).
    bnd: fp32 `[NT_total, HV, 2]` or None: receives each chunk's decay-bound summary (L, W), as `wy_gdn_fwd(bnd=)`;
    it needs v `[B, T, HV, V]` (its rows' norms; v is not read otherwise).
    rev: (p fp32 `[B, T, HV]`, c fp32 `[NT_total, HV, 2]`) or None: receive the q, k side of the backward's reverse
    bound sums (`_store_rev_bound`; `kernels.common.warm_bwd.reverse_chunk_bound_kept` adds do's); it needs q
    `[B, T, H, K]` (its rows' norms; q is not read otherwise).
    """
    B, T, H, K = k.shape
    HV = g.shape[2]
    if g.shape != (B, T, HV) or beta.shape != (B, T, HV) or HV % H:
        raise ValueError(
            f"wy_gdn_ag: g and beta must be [B, T, HV] with HV a multiple of k's H={H}, got "
            f"{tuple(g.shape)} and {tuple(beta.shape)} for k {tuple(k.shape)}"
        )
    if rev is not None and (
        q is None
        or q.shape != k.shape
        or rev[0].shape != (B, T, HV)
        or rev[1].shape != (index.num_chunks, HV, 2)
        or any(x.dtype != torch.float32 for x in rev)
    ):
        raise ValueError(
            f"wy_gdn_ag: rev needs q of k's shape {tuple(k.shape)} and fp32 buffers [{B}, {T}, {HV}] and "
            f"[{index.num_chunks}, {HV}, 2], got q {None if q is None else tuple(q.shape)} and "
            f"{[(str(x.dtype), tuple(x.shape)) for x in rev]}"
        )
    if ag_hopper_wanted(k, index.chunk_size, launch, v if bnd is not None else None):
        ag_checks("wy_gdn_ag", k, HV, index, bnd, v)
        return ag_hopper(k, g, beta, index=index, bnd=bnd, v=v if bnd is not None else None, rev=rev,
                         q=q if rev is not None else None)  # fmt: skip
    BT, V, cfg = ag_launch("wy_gdn_ag", WY_GDN_AG_FWD, launch, k, HV, index, bnd, v)
    BR = cfg.BR or 16
    if BR not in ROW_TILES:
        raise ValueError(f"wy_gdn_ag: launch config BR must be one of {ROW_TILES}, got {BR}")
    BK, BV = _blocks(cfg, index, K, V)
    bits = cfg.VARIANT or 0
    if bits & ~sum(AG_VARIANTS.values()):
        raise ValueError(f"wy_gdn_ag: unknown VARIANT bits {bits}; the bits are {AG_VARIANTS}")
    cpp = 2 if bits & AG_VARIANTS["two_chunks"] else 1
    ag = torch.empty(B, T, HV, BT, dtype=k.dtype, device=k.device)
    gcum = torch.empty(B, T, HV, dtype=torch.float32, device=k.device)
    rows, heads = _grid(index, B, T, HV)
    rp, rc = rev if rev is not None else (None, None)
    wy_gdn_ag_fwd_kernel[(cdiv(rows, cpp), heads)](
        q if rev is not None else None,
        k,
        v if bnd is not None else None,
        g,
        beta,
        ag,
        gcum,
        index.cu_seqlens if index.is_varlen else None,
        index.chunk_indices if index.is_varlen else None,
        bnd,
        rp,
        rc,
        T,
        rows,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BT=BT,
        BK=BK,
        BV=BV,
        BR=BR,
        CPP=cpp,
        EXP2=bool(bits & AG_VARIANTS["exp2"]),
        EXACT=bool(bits & AG_VARIANTS["exact_inverse"]),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return ag, gcum
