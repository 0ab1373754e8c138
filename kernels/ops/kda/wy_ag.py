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

from kernels.common.chunk_program import group_heads, heuristics
from kernels.common.index import ChunkIndex
from kernels.common.wy import (
    _blocks,
    _gate_rowmax,
    _grid,
    _kda_beta_rows,
    _kda_gram,
    _load_vec4,
    _solve,
    _store_kda_aqk,
    _wy_chunk,
)
from kernels.configs import KernelSpec, LaunchConfig, register
from kernels.ops.gdn.wy_ag import WY_GDN_AG_FWD, _row_squares, _store_ag, _store_bound, ag_launch
from kernels.ops.kda.ag_hopper import kda_ag_hopper, kda_ag_hopper_wanted
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

# The Ag pass's code variants: bits of its launch config's VARIANT (None: 0, the default: G stored).
# gated: instead of G, the gated queries and keys the fused pass would form per V block (`GatedKeys`), so that pass does
#   only dots and one diagonal decay per chunk (its PRE_GATED); not measured on a GPU yet (benchmarks/kda_fused_lab.py
#   --forms). The default flips with WY_KDA_AG_FWD's default LaunchConfig(..., VARIANT=1).
KDA_AG_VARIANTS = {"gated": 1}


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
    tt: Tensor | None = None  # [B, T, HV, BT] in k's dtype: T = (I + A)^-1 (with store_t), or None


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


@heuristics(
    {
        "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        "HAS_BOUND": lambda args: args["bnd"] is not None,
        "GATED": lambda args: args["kd"] is not None,
        "STORE_T": lambda args: args["tt"] is not None,
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
    tt,  # out [B, T, HV, BT] or None: T = (I + A)^-1 itself, zeros above the diagonal (for the backward from Ag)
    scale, T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_BOUND: tl.constexpr, G: tl.constexpr, GATED: tl.constexpr, STORE_T: tl.constexpr,
):  # fmt: skip
    i_hv, i_tg, bos, t0, T, _ = _wy_chunk(cu_seqlens, chunk_indices, None, T, HV, BT, IS_VARLEN, False)
    b0, b1, b2, b3 = _load_vec4(beta, bos, t0, T, i_hv, HV)
    # the q-k gram (stores G, or GATED qg), then the k-k gram (stores nothing, or GATED kd, gc and ke): one set of 10
    # accumulators live at a time
    if GATED:
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _kda_gram(
            q, k, g, qg, bos, t0, T, i_hv, gc, scale, HV, K, BK, False, G, 1
        )
    else:
        Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33 = _kda_gram(
            q, k, g, gcum, bos, t0, T, i_hv, gcum, scale, HV, K, BK, False, G, 2
        )
    _store_kda_aqk(aqk, bos, t0, T, i_hv, Q00, Q10, Q11, Q20, Q21, Q22, Q30, Q31, Q32, Q33, scale, HV, BT)
    if GATED:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(
            k, k, g, kd, bos, t0, T, i_hv, gc + (i_tg * HV + i_hv) * K, 1.0, HV, K, BK, True, G, 3, ke
        )
    else:
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_gram(
            k, k, g, gcum, bos, t0, T, i_hv, gcum, 1.0, HV, K, BK, True, G, 0
        )
    A00, A10, A11, A20, A21, A22, A30, A31, A32, A33 = _kda_beta_rows(
        A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, b0, b1, b2, b3
    )
    T00, T10, T11, T20, T21, T22, T30, T31, T32, T33 = _solve(A00, A10, A11, A20, A21, A22, A30, A31, A32, A33)
    _store_ag(ag, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, b0, b1, b2, b3, bos, t0, T, i_hv, HV, BT)
    if STORE_T:  # T with unit columns: the backward's T (no `wy_inverse` there)
        one = tl.full([16], 1.0, tl.float32)
        _store_ag(tt, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, one, one, one, one, bos, t0, T, i_hv, HV, BT)
    if HAS_BOUND:
        x0, x1, x2, x3 = _gate_rowmax4(g, bos, t0, T, i_hv, HV, K, BK)
        kk0, kk1, kk2, kk3 = _row_squares(k, bos, t0, T, i_hv // G, HV // G, K, BK)
        _store_bound(bnd, v, x0, x1, x2, x3, b0, b1, b2, b3, kk0, kk1, kk2, kk3, bos, t0, T, i_tg, i_hv, HV, V, BV)


def wy_kda_ag(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan | None = None,
    bnd: Tensor | None = None, v: Tensor | None = None, store_t: bool = False,
) -> tuple[Tensor, Tensor, Tensor | GatedKeys]:  # fmt: skip
    """KDA's Ag pass: (ag, aqk `[B, T, HV, BT]` in k's dtype, gcum fp32 `[B, T, HV, K]`), or with the launch config's
    `gated` variant (`KDA_AG_VARIANTS`) (ag, aqk, `GatedKeys`) and no gcum.

    q, k `[B, T, H, K]`; g `[B, T, HV, K]`, beta `[B, T, HV]`, HV a multiple of H (value head h reads key head
    h // (HV / H)). bnd: fp32 `[NT_total, HV, 2]` or None: receives each chunk's decay-bound summary (L, W), as
    `wy_kda_fwd(bnd=)`; it needs v `[B, T, HV, V]` (its rows' norms; v is not read otherwise).
    store_t: in the gated form, also T = (I + A)^-1 (`GatedKeys.tt`, for the backward from Ag: it then runs no
    `wy_inverse`); the G form ignores it. With the plan's `ag_pass` on TileLang
    (`kernels.ops.kda.ag_hopper.kda_ag_hopper_wanted`) the pass is that kernel's, which stores the gated form whatever
    the config's variant.
    """
    B, T, H, K = k.shape
    HV = g.shape[2]
    if q.shape != k.shape or g.shape != (B, T, HV, K) or beta.shape != (B, T, HV) or HV % H:
        raise ValueError(
            f"wy_kda_ag: q must be k's shape, g [B, T, HV, K] and beta [B, T, HV] with HV a multiple of k's H={H}, "
            f"got q {tuple(q.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} for k {tuple(k.shape)}"
        )
    BT, V, cfg = ag_launch("wy_kda_ag", WY_KDA_AG_FWD, launch, k, HV, index, bnd, v)
    if kda_ag_hopper_wanted(k, BT, launch, v if bnd is not None else None):  # the TileLang pass: the gated form
        ag, aqk, gated_keys = kda_ag_hopper(q, k, g, beta, scale=scale, index=index, bnd=bnd,
                                            v=v if bnd is not None else None, store_t=store_t)  # fmt: skip
        return ag, aqk, GatedKeys(*gated_keys)
    BK, BV = _blocks(cfg, index, K, V)
    bits = cfg.VARIANT or 0
    if bits & ~sum(KDA_AG_VARIANTS.values()):
        raise ValueError(f"wy_kda_ag: unknown VARIANT bits {bits}; the bits are {KDA_AG_VARIANTS}")
    ag = torch.empty(B, T, HV, BT, dtype=k.dtype, device=k.device)
    aqk = torch.empty(B, T, HV, BT, dtype=k.dtype, device=k.device)
    gated: GatedKeys | None = None
    gcum: Tensor | None = None
    if bits & KDA_AG_VARIANTS["gated"]:
        gated = GatedKeys(*(k.new_empty(B, T, HV, K) for _ in range(3)),
                          gc=torch.empty(index.num_chunks, HV, K, dtype=torch.float32, device=k.device),
                          tt=torch.empty_like(ag) if store_t else None)  # fmt: skip
    else:
        gcum = torch.empty(B, T, HV, K, dtype=torch.float32, device=k.device)
    wy_kda_ag_fwd_kernel[_grid(index, B, T, HV)](
        q, k, v if bnd is not None else None, g, beta, ag, aqk, gcum, *(gated[:4] if gated is not None else (None,) * 4),
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None, bnd,
        gated.tt if gated is not None else None, scale, T,
        HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if gated is not None:
        return ag, aqk, gated
    assert gcum is not None
    return ag, aqk, gcum
