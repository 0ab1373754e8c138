"""GDN's backward from the forward's kept Ag (the recompute policies "ag" and "ag+states", `kernels.plan.LaunchPlan.keep`):
no WY prep (`wy_gdn_fwd`) and no `wy_inverse` in the backward; under "ag+states" no state recompute either.

The two-kernel forward (`kernels.ops.gdn.fused`) keeps its Ag pass's outputs: Ag = T diag(beta) `[B, T, HV, BT]`
(k's dtype) and the in-chunk gate cumsum G `[B, T, HV]` fp32. The backward then runs

1. `wy_from_ag` (one chunk-parallel kernel, per chunk and value head, 4 warps, every product a 64-row `tl.dot`): from
   Ag, q, k, v and G it forms what the shared backward kernels read,

       M   = StrictLower(K K^T o exp(G_i - G_j))            (beta-free: A = diag(beta) M)
       T   = I - Ag M                                        (= (I + A)^{-1}: T (I + diag(beta) M) = I, no 1/beta)
       Aqk = scale Tril(Q K^T o exp(G_i - G_j)),   w = Ag (exp(G) o K),   u = Ag V

   so `wy_bwd` gets T exactly as `wy_inverse` made it, without dividing Ag by beta (exact for beta -> 0);
2. `chunk_bwd` with those factors: under "ag" its state recompute (`chunk_state_fwd` from w, u) from the forward's
   segment entering states (`seg_states`, the forward's split) or, without them, its own split; under "ag+states" the
   forward's output launch stored the chunk states (`kernels.ops.gdn.fused.fused_state_output_keep`, with the maps of
   every segment and its split) and no state recompute runs; then its reverse state pass and gradient kernels.
   (Until session 18 "ag" recomputed the states by the fused pass's STORE_STATES mode over exact transitions of
   every segment: 2.17 ms at 1x64K on the H200, `benchmarks/results/bwd_ag_lab_h200.md`.)

Bytes per token-head (bf16, K = V = 128, chunk 64) of step 1: reads q, k, v (768), Ag (128), G (4); writes w, u (512),
Aqk, T (256): 1.67 KB, about what the recompute it replaces moved (`wy_gdn_fwd` 1.42 KB + `wy_inverse` 0.39 KB), but
without the 16x16 block solves at one warp that held `wy_gdn_fwd` at 2.6x its bytes floor. Forming w, Aqk inside the
reverse state pass and u, T inside `wy_bwd` instead would save ~1.7 KB per token-head more (kernels/NOTES.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_bwd import LazyFactors, chunk_bwd
from kernels.common.chunk_program import chunk_of_program, group_heads, heuristics
from kernels.common.chunk_state import SeqLayout, chunk_state_ag_fwd
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.state_keep import KEPT_STATES
from kernels.common.warm_bwd import KEPT_REV_SUMS, _reverse_bound_store, kept_rev_sums
from kernels.common.wy import BT_WY, CHUNK_SIZES, FLOOR
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.ops.gdn.fwd_walk import fwd_walk_tilelang, fwd_walk_wanted
from kernels.ops.gdn.reverse_bwd import auto_reverse, chunk_gdn_bwd_reverse
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.plan import LaunchPlan, default_plan, launch_config
from kernels.vocabulary import REVERSE_WALKS

__all__ = ["WY_FROM_AG", "ag_factors", "chunk_gdn_bwd_ag", "wy_from_ag"]

WY_FROM_AG = register(
    KernelSpec(
        name="wy_from_ag",
        key=("H", "HV", "K", "V", "BT", "IS_VARLEN", "dtype"),
        # 64-row products only (grams, Ag M, Ag X): one warpgroup; BK = BV = 64 column blocks. Not tuned on a GPU yet.
        default=LaunchConfig(BK=64, BV=64, num_warps=4, num_stages=2),
        space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    )
)


@heuristics(
    {
        "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        "G": group_heads("v"),
        "HAS_BND": lambda args: args["bnd"] is not None,
        "USE_SEL": lambda args: args["sel"] is not None,
        "SEL_PER_HEAD": lambda args: args["sel"] is not None and args["sel"].dim() == 2,
    }
)
@triton.jit(do_not_specialize=["T"])
def wy_from_ag_kernel(
    q, k, v,  # [B, T, H, K], [B, T, H, K], [B, T, HV, V]
    ag, gcum,  # [B, T, HV, BT] Ag (lower incl. the diagonal), [B, T, HV] fp32 in-chunk gate cumsum
    w, u, aqk, tt,  # out: [B, T, HV, K], [B, T, HV, V], [B, T, HV, BT] (scaled, lower incl. diag), [B, T, HV, BT] T
    g, beta, do,  # with bnd: the raw gate, beta [B, T, HV] and do [B, T, HV, V] (else None)
    bnd,  # out [NT_total, HV, 2] fp32 or None: `reverse_chunk_bound`'s sums (flipped chunk order)
    sel,  # bool [NT_total] or [NT_total, HV] or None: only the flagged chunks (per value head) are formed
    cu_seqlens, chunk_indices,
    scale, log_scale, T, NT_ALL,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, G: tl.constexpr, HAS_BND: tl.constexpr, USE_SEL: tl.constexpr, SEL_PER_HEAD: tl.constexpr,
):  # fmt: skip
    i_bh, i_hv = tl.program_id(1), tl.program_id(1) % HV
    _, i_t, i_tg, bos, T = chunk_of_program(tl.program_id(0), i_bh // HV, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    if USE_SEL:  # a chunk no pass reads: nothing to form (a device-side mask, no host sync)
        if SEL_PER_HEAD:
            b_sel = tl.load(sel + i_tg * HV + i_hv)
        else:
            b_sel = tl.load(sel + i_tg)
        if b_sel == 0:
            return
    o_t = tl.arange(0, BT)
    m_r = i_t * BT + o_t < T
    p_v = (bos + i_t * BT + o_t) * HV + i_hv  # rows of the per-value-head tensors
    p_k = (bos + i_t * BT + o_t) * (HV // G) + i_hv // G  # rows of q, k (grouped heads: the shared head)
    dt = k.dtype.element_ty
    m_low = (o_t[:, None] >= o_t[None, :]) & m_r[:, None] & m_r[None, :]
    b_g = tl.load(gcum + p_v, mask=m_r, other=0.0)
    # exp(G_i - G_j) on the lower triangle of valid rows only (G is non-increasing there: exponent <= 0)
    b_d = tl.exp(tl.where(m_low, b_g[:, None] - b_g[None, :], float("-inf")))
    b_a = tl.load(ag + p_v[:, None] * BT + o_t[None, :], mask=m_low, other=0.0)  # [BT, BT]

    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    kk = tl.zeros([BT], dtype=tl.float32)  # the bound's squared norms (HAS_BND)
    qq = tl.zeros([BT], dtype=tl.float32)
    dd = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_rk = m_r[:, None] & (o_k < K)[None, :]
        b_k = tl.load(k + p_k[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
        b_q = tl.load(q + p_k[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
        b_kk = tl.dot(b_k, tl.trans(b_k), b_kk)
        b_qk = tl.dot(b_q, tl.trans(b_k), b_qk)
        b_w = tl.dot(b_a, (b_k * tl.exp(b_g)[:, None]).to(dt))  # w = Ag (e^G o K)
        tl.store(w + p_v[:, None] * K + o_k[None, :], b_w.to(w.dtype.element_ty), mask=m_rk)
        if HAS_BND:
            kk += tl.sum(b_k.to(tl.float32) * b_k.to(tl.float32), 1)
            qq += tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1)
    p_c = p_v[:, None] * BT + o_t[None, :]
    tl.store(aqk + p_c, (b_qk * b_d * scale).to(aqk.dtype.element_ty), mask=m_r[:, None])
    b_m = tl.where(o_t[:, None] > o_t[None, :], b_kk * b_d, 0.0)  # M, strictly lower
    b_t = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0) - tl.dot(b_a.to(tl.float32), b_m)  # T = I - Ag M
    tl.store(tt + p_c, b_t.to(tt.dtype.element_ty), mask=m_r[:, None])
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + p_v[:, None] * V + o_v[None, :], mask=m_rv, other=0.0)
        tl.store(u + p_v[:, None] * V + o_v[None, :], tl.dot(b_a, b_v).to(u.dtype.element_ty), mask=m_rv)
        if HAS_BND:
            b_do = tl.load(do + p_v[:, None] * V + o_v[None, :], mask=m_rv, other=0.0).to(tl.float32)
            dd += tl.sum(b_do * b_do, 1)
    if HAS_BND:  # the reverse bound sums of `reverse_chunk_bound` (GDN's scalar gate), without its launch
        gm = tl.maximum(tl.load(g + p_v, mask=m_r, other=0.0).to(tl.float32), FLOOR)
        b_b = tl.load(beta + p_v, mask=m_r, other=0.0).to(tl.float32)
        _reverse_bound_store(bnd, (NT_ALL - 1 - i_tg) * HV + i_hv, kk, qq, dd, gm, b_b, m_r, log_scale)


def wy_from_ag(
    q: Tensor, k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, scale: float, index: ChunkIndex,
    launch: LaunchPlan | None = None, bound: tuple[Tensor, Tensor, Tensor] | None = None, sel: Tensor | None = None,
    out: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """(w, u, aqk, T, bnd) of every chunk from the kept Ag and gate cumsum (module docstring), each `[B, T, HV, ..]`
    in k's dtype: what `wy_gdn_fwd` (w, u, Aqk) and `wy_inverse` (T) give. q, k `[B, T, H, K]`, v `[B, T, HV, V]`.
    bound: (g, beta, do), the raw gate, beta and the output's gradient: bnd is then `reverse_chunk_bound`'s
    `[NT_total, HV, 2]` (the warm reverse windows' sums, `kernels.common.warm_bwd`) from this launch's loads of q
    and k plus do's; else None. sel: bool `[NT_total]` or `[NT_total, HV]` on the device (global chunk order): only
    the flagged chunks are formed, the other rows of w, u, aqk, T are left as they were (no bound with it); out: the
    (w, u, aqk, T) buffers to form them in (else new ones)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = index.chunk_size
    if BT not in CHUNK_SIZES or ag.shape != (B, T, HV, BT) or gcum.shape != (B, T, HV) or HV % H:
        raise ValueError(
            f"wy_from_ag: Ag {tuple(ag.shape)} / gcum {tuple(gcum.shape)} do not match v {tuple(v.shape)}, k "
            f"{tuple(k.shape)} with chunk {BT}"
        )
    key = {
        "H": H,
        "HV": HV,
        "K": K,
        "V": V,
        "BT": BT,
        "IS_VARLEN": index.is_varlen,
        "dtype": str(k.dtype).removeprefix("torch."),
    }
    cfg = launch_config(launch, WY_FROM_AG, key)
    BK, BV = min(cfg.BK or 64, head_block(K)), min(cfg.BV or 64, head_block(V))
    if sel is not None and (bound is not None or sel.dtype != torch.bool or sel.shape not in
                            ((index.num_chunks,), (index.num_chunks, HV))):  # fmt: skip
        raise ValueError(f"wy_from_ag: sel must be bool [{index.num_chunks}] or [{index.num_chunks}, {HV}] without a "
                         f"bound, got {sel.dtype} {tuple(sel.shape)} (bound {bound is not None})")  # fmt: skip
    if out is not None:
        w, u, aqk, tt = out
    else:
        w, u = k.new_empty(B, T, HV, K), torch.empty_like(v, dtype=k.dtype)
        aqk, tt = torch.empty_like(ag), torch.empty_like(ag)
    g, beta, do = (x.contiguous() for x in bound) if bound is not None else (None, None, None)
    bnd = torch.empty(index.num_chunks, HV, 2, dtype=torch.float32, device=k.device) if bound is not None else None
    grid = (index.num_chunks, HV) if index.is_varlen else (cdiv(T, BT), B * HV)
    bounds = (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)
    wy_from_ag_kernel[grid](
        q, k, v, ag, gcum, w, u, aqk, tt, g, beta, do, bnd, sel, *bounds, scale, math.log(scale), T,
        index.num_chunks if bnd is not None else 0,  # (read with bnd only: 0 keeps one compile across lengths)
        HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return w, u, aqk, tt, bnd


def ag_factors(
    q: Tensor, k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan
) -> LazyFactors:
    """The reverse walk's factors on demand (`kernels.common.chunk_bwd.LazyFactors`): `wy_from_ag` forms w, u, aqk
    (and T) of the chunks a selection flags, every call into the same buffers; the chunk states come from the Ag form
    of the state pass, which reads Ag, k, v and no w, u: the TileLang walk without q (`kernels.ops.gdn.fwd_walk`,
    under `LaunchPlan.fwd_pass`) or Triton's `chunk_state_ag_fwd`."""
    bufs: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []

    def form(sel: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        w, u, aqk, tt, _ = wy_from_ag(q, k, v, ag, gcum, scale=scale, index=index, launch=launch, sel=sel,
                                      out=bufs[0] if bufs else None)  # fmt: skip
        bufs[:] = [(w, u, aqk, tt)]
        return w, u, aqk

    def states(layout: SeqLayout, h0: Tensor | None) -> Tensor:
        if fwd_walk_wanted(k, v, index.chunk_size, launch):
            _, _, h = fwd_walk_tilelang(None, k, v, ag, gcum, layout=layout, h0=h0, num_chunks=index.num_chunks)
            assert h is not None
            return h
        return chunk_state_ag_fwd(k, v, ag, gcum, layout=layout, num_chunks=index.num_chunks, BT=index.chunk_size,
                                  h0=h0, launch=launch)  # fmt: skip

    return LazyFactors(form, states)


def chunk_gdn_bwd_ag(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float, wy: Mapping[str, Tensor] | None,
    initial_state: Tensor | None = None, dht: Tensor | None = None, cu_seqlens: Tensor | None = None,
    plan: LaunchPlan | None = None, split_chunks: int | None = None, chunk_size: int = BT_WY,
    warm_report: dict[str, Tensor] | None = None, seg_states: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """(dq, dk, dv, dg, dbeta, dh0) of GDN from the forward's kept `wy` = {"ag": Ag, "gs": gate cumsum} (the module
    docstring's steps), with its chunk states too under "ag+states" (`KEPT_STATES`: h, v_new, M, split; the forward's
    split used, split_chunks ignored), or with `wy=None` from the Ag pass run again here (`wy_gdn_ag`: the recompute
    policy's memory, the Ag pass's time instead of `wy_gdn_fwd` + `wy_inverse`); seg_states: the forward's split and
    segment entering states (`kernels.common.seqsplit.keep_segment_states`), from which `chunk_bwd` recomputes the
    chunk states; the other arguments as `kernels.common.chunk_bwd.chunk_bwd`."""
    B, T = k.shape[:2]
    launch = plan if plan is not None else default_plan()
    q, k, v, do = (x.contiguous() for x in (q, k, v, do))
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    if wy is None:
        ag, gcum = wy_gdn_ag(k, g.contiguous(), beta.contiguous(), index=index, launch=launch)
    else:
        ag, gcum = wy["ag"], wy["gs"]
    states = {name: wy[name] for name in KEPT_STATES if name in wy} if wy is not None and "h" in wy else {}
    if launch.bwd_grads in REVERSE_WALKS or auto_reverse(k, v, index.chunk_size, launch):
        # the TileLang reverse walk, reading Ag itself (`kernels.ops.gdn.reverse_bwd`; "auto" takes it for long bf16
        # steps on Hopper); w, u, aqk formed only where its state pass reads them (`ag_factors`)
        lazy = ag_factors(q, k, v, ag, gcum, scale=scale, index=index, launch=launch)
        return chunk_gdn_bwd_reverse(q, k, v, g, beta, do, ag=ag, gs=gcum, kept=states or None, lazy=lazy, index=index,
                                     scale=scale, initial_state=initial_state, dht=dht, launch=launch,
                                     split_chunks=split_chunks, warm_report=warm_report, seg_states=seg_states,
                                     qk_sums=kept_rev_sums(wy))  # fmt: skip
    # the warm reverse windows' bound sums in this launch when the backward will run the forward's split from its
    # segment states (no forward sums needed: `chunk_bwd` then skips `reverse_chunk_bound`), unless the forward's Ag
    # pass kept their q, k side (`kernels.common.warm_bwd.KEPT_REV_SUMS`: `chunk_bwd` then reads do alone for them)
    if states and "v_new" not in states:
        raise ValueError(
            "chunk_gdn_bwd_ag: the forward kept the TileLang walk's chunk states without v_new (for the reverse walk, "
            f"`fused.walk_keeps_states`); this backward (bwd_grads={launch.bwd_grads!r}) needs v_new: run it under the "
            "forward's plan"
        )
    rev_sums = kept_rev_sums(wy)
    fold = bool(seg_states) and not states and rev_sums is None and launch.bwd_warm_for("gdn") > 0
    w, u, aqk, tt, bnd = wy_from_ag(q, k, v, ag, gcum, scale=scale, index=index, launch=launch,
                                    bound=(g, beta, do) if fold else None)  # fmt: skip
    factors = {"w": w, "u": u, "gs": gcum, "aqk": aqk, "tt": tt, **({"bnd": bnd} if bnd is not None else {}),
               **(dict(zip(KEPT_REV_SUMS, rev_sums, strict=True)) if rev_sums else {})}  # fmt: skip
    del ag  # read by nothing after this (with wy=None its memory is free for the gradient kernels' buffers)
    return chunk_bwd("gdn", q, k, v, g, beta, do, scale=scale, initial_state=initial_state, dht=dht,
                     cu_seqlens=cu_seqlens, plan=launch, split_chunks=split_chunks, wy={**factors, **states},
                     chunk_size=chunk_size, warm_report=warm_report, seg_states=seg_states)  # fmt: skip
