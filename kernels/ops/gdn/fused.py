"""GDN's fused state+output pass in FlashQLA's two-kernel decomposition: w S and u formed on the fly from Ag (the
op's second pass after its Ag pass, `kernels.ops.gdn.wy_ag`; the op table runs it as GDN's `fused_fwd`).

The WY pass stores only, per chunk, Ag = T diag(beta) `[B, T, HV, BT]` (k's dtype, lower triangle incl. the
diagonal; T = (I + A)^{-1}, A = StrictLower(beta_i k_i.k_j exp(G_i - G_j))) and the in-chunk gate cumsum G
`[B, T, HV]` fp32. This pass then walks a sequence (or a segment of one) chunk by chunk with S `[K, BV]` fp32 in
registers; every product is a `tl.dot` with 64 rows (chunk 64), so Hopper can issue wgmma:

    eG = exp(G), gl = exp(G_last)
    U  = K @ S                    (S cast to k's dtype for the dot, as FLA and FlashQLA do)
    W  = V - eG * U               (rows)
    Vd = Ag @ W                   (= u - w S of the three-kernel form: u = Ag V, w = Ag diag(eG) K)
    O  = scale eG * (Q @ S) + P @ Vd,   P = scale (Q K^T) o exp(G_i - G_j), i >= j      (OUTPUT)
    S  = gl S + K^T @ (exp(G_last - G) * Vd)

Modes (constexpr): OUTPUT (store o) or the state alone; an initial state (none, or one per program row: the
sequence's, or a segment's merged entering state); TRANSITION: the augmented state [K, K+V] from [I | 0] whose first
K columns walk the recurrence with V = 0 (the segment's map M, no v loads) and the others from zero with V (S_ext),
the format `kernels.common.seqsplit`'s chain takes; STORE_FINAL (at `final_idx`, as `kernels.common.chunk_state`);
STORE_STATES (the policy "ag+states": the output launch keeps them for the backward, `fused_state_output_keep`): also
the state entering each chunk h and v_new = Vd (k's dtype), as the WY path's state pass stores them;
GATE_VECTOR (KDA, `kernels.ops.kda.fused`: gcum `[B, T, HV, K]`, the per-key gate on K's and Q's columns, W = V -
(K (x) eG) S, S = diag(gl) S + (K (x) exp(G_last - G))^T Vd) with HAS_AQK (P read from the Ag pass's Aqk);
PRE_GATED (KDA, with `kd`: the Ag pass's `gated` variant, `kernels.ops.kda.wy_ag.GatedKeys`): q, k are qg, ke at HV
heads, gcum is G_C `[NT_total, HV, K]`: W = V - ke S, O = qg S + P Vd, S = diag(exp(G_C)) S + kd^T Vd, no gate tile.
Grouped value heads: program head hv reads q/k head hv // (HV / H) (no repeat_interleave). Any K, V <= 256 in tiles
of `kernels.configs.head_block`. Rows past a sequence's end load as zero (their gate as 0: exp stays finite) and are
not stored. Ranges: `kernels.common.chunk_state.SeqLayout` (whole sequences, or seqsplit's segments). Code variants
(exp2, TMA descriptors, a pipelined or warp-specialised chunk loop) by the launch config's VARIANT bits:
`FUSED_VARIANTS`.

`gdn_fused_fwd` is the GDN forward on this pass: the Ag prep, then plain or split (seqsplit's plan, this kernel's
transitions, `seg_chain_fwd`, this kernel with the output from each segment's entering state). With a warm window
(`kernels.common.warm_split`) the Ag prep also sums the decay bound per chunk, this kernel walks the windows from zero
(state only) and its transitions skip the certified (segment, head) pairs (`need`). The Ag prep is the op's
(`kernels.ops.gdn.wy_ag.wy_gdn_ag`, handed in by the op table: `kernels/common` imports no op). Under the recompute
policy "ag+states" (`fused_state_output_keep`) the output launch also runs STORE_STATES (h, v_new for the backward,
`kernels.common.state_keep`'s kept states; o bit-identical), after exact transitions over every segment, or after the
warm split when the backward's reverse pass has its own warm window (`LaunchPlan.bwd_warm`; then no maps are kept).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import given, heuristics
from kernels.common.chunk_state import SeqLayout, skipped_states
from kernels.common.index import ChunkIndex
from kernels.common.seqsplit import (
    SplitPlan,
    device_sms,
    keep_segment_states,
    plan_split,
    resolve_split,
    seg_chain_fwd,
    whole_sequences,
)
from kernels.common.state_program import range_of_program
from kernels.common.warm_bwd import KEPT_REV_SUMS
from kernels.common.warm_split import WarmInputs, certified_transitions, window_plan
from kernels.common.wy import LOG2E, _gexp
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.ops.gdn.fwd_walk import fwd_walk_tilelang, fwd_walk_wanted, wave_seg_chunks
from kernels.ops.gdn.reverse_bwd import auto_reverse
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.plan import LaunchPlan, launch_config
from kernels.vocabulary import REVERSE_WALKS

__all__ = [
    "FUSED_VARIANTS",
    "GDN_FUSED_STATE_OUTPUT_FWD",
    "KDA_FUSED_STATE_OUTPUT_FWD",
    "AgPrep",
    "gdn_fused_fwd",
    "gdn_fused_state_output",
    "gdn_fused_transition",
    "exact_segment_states",
    "forward_splits",
    "fused_state_output_fwd",
    "fused_state_output_keep",
    "variant_flags",
]


GDN_FUSED_STATE_OUTPUT_FWD = register(
    KernelSpec(
        name="gdn_fused_state_output_fwd",
        key=("H", "HV", "K", "V", "BT", "MODE", "IS_VARLEN", "dtype"),
        # 64-row tiles and one warpgroup (wgmma); two stages prefetch the next chunk's q, k, v, Ag
        default=LaunchConfig(BV=64, num_warps=4, num_stages=2),
        space={"BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    )
)

# The fused pass's code variants: bits of its launch config's VARIANT (None: 0, the default code). Each is a constexpr
# of the kernel; the interpreter runs them all (it ignores the loop attributes):
# exp2: the gates prescaled by log2(e) once per chunk, every exponential one exp2;
# tma: q, k, v, Ag loaded and o stored through per-program TMA descriptors (`tl.make_tensor_descriptor`; the
#   allocator `triton.set_allocator` is set on the GPU path; in TRANSITION with K % BV != 0 v keeps its pointer loads:
#   a column block straddles the state's identity block);
# pipe: the chunk loop as `tl.range(num_stages=config's num_stages)`: every load of the next chunks in flight, not only
#   the dot operands the kernel-level num_stages pipelines;
# ws: `tl.range(warp_specialize=True)` on the chunk loop (Triton's automatic warp specialisation; on Hopper 8 more warps,
#   producers and consumers). Only with tma: Triton 3.6's Hopper pass (NVGPUWarpSpecialization) fails to compile the
#   loop with any pointer load of a tile (sm_90, 2026-12-02), so the loop runs without it where v keeps its pointers.
FUSED_VARIANTS = {"exp2": 1, "tma": 2, "pipe": 4, "ws": 8}
# the same kernel on KDA's per-key gate (GATE_VECTOR: gcum [B, T, HV, K], Aqk read; or PRE_GATED): its own configs
# (fp32 [BT, BK] gate tiles next to the keys); the forms and configs timed by benchmarks/kda_fused_lab.py --forms
KDA_FUSED_STATE_OUTPUT_FWD = register(
    KernelSpec(
        name="kda_fused_state_output_fwd",
        key=GDN_FUSED_STATE_OUTPUT_FWD.key,
        default=LaunchConfig(BV=64, num_warps=4, num_stages=2),
        space={"BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    )
)

# (k, g, beta, *, index, launch, bnd=None, v=None[, rev, q]) -> (Ag [B, T, HV, BT] in k's dtype, gcum [B, T, HV] fp32);
# bnd: the warm split's per-chunk bound sums to fill (they read v); rev: the backward's reverse sums' q, k side to fill
# (they read q; passed only where the forward keeps them, `wy_gdn_ag(rev=)`)
AgPrep = Callable[..., tuple[Tensor, Tensor]]


# constexpr flag -> the argument whose presence sets it
_FLAGS = {"HAS_AQK": "aqk", "USE_INITIAL_STATE": "h0", "STORE_FINAL_STATE": "ht", "OUTPUT": "o", "TRANSITION": "m",
          "IS_VARLEN": "cu_seqlens", "USE_SEQ_MAP": "seq_map", "USE_FINAL_IDX": "final_idx", "USE_NEED": "need",
          "STORE_STATES": "hs", "PRE_GATED": "kd"}  # fmt: skip


@triton.jit
def _rows(base, T, D: tl.constexpr, stride: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """A TMA descriptor over the T rows of one head of a [.., T, H, D] tensor (`base` at its first row), tiles
    [BR, BC]."""
    return tl.make_tensor_descriptor(base, shape=[T, D], strides=[stride, 1], block_shape=[BR, BC])


@heuristics(given(**_FLAGS))
# KDA's per-key gate: its cumsum [B, T, HV, K], or (PRE_GATED) the gated keys and the last-row gate [NT_total, HV, K]
@heuristics({"GATE_VECTOR": lambda args: args["gcum"].dim() == 4 or args["kd"] is not None})
@triton.jit(do_not_specialize=["T"])
def gdn_fused_state_output_kernel(
    q, k, v,  # [B, T, H, K] (q: OUTPUT only), [B, T, H, K], [B, T, HV, V]
    ag, gcum,  # [B, T, HV, BT] Ag (lower triangle incl. the diagonal; nothing above it is read), [B, T, HV] fp32 G
    aqk,  # [B, T, HV, BT] or None: the output's intra-chunk P, read (KDA) instead of formed from q, k and G (GDN)
    kd,  # [B, T, HV, K] or None (PRE_GATED, KDA: q, k are then qg, ke [B, T, HV, K] and gcum is G_C [NT_total, HV, K])
    h0, ht, m, o,  # entering states [N, HV, K, V] fp32 (TRANSITION: the S_ext of the pairs need skips); out: final
    # states (TRANSITION: S_ext), M [N, HV, K, K], o
    cu_seqlens, chunk_offsets, seq_map, final_idx,  # the SeqLayout (`kernels.common.chunk_state`): int32 or None
    need,  # [N, HV] bool or None (TRANSITION): 0 = walk no chunk, store M = 0 and S_ext = h0's (a certified warm window)
    hs, vn,  # out or None (STORE_STATES, the backward's recompute): h [NT_total, HV, K, V] entering each chunk, v_new = Vd
    scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, OUTPUT: tl.constexpr, TRANSITION: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_SEQ_MAP: tl.constexpr, USE_FINAL_IDX: tl.constexpr, USE_NEED: tl.constexpr,
    STORE_STATES: tl.constexpr, HAS_AQK: tl.constexpr, GATE_VECTOR: tl.constexpr, PRE_GATED: tl.constexpr,
    EXP2: tl.constexpr = False, TMA: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None, WS: tl.constexpr = False,
):  # fmt: skip
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = (i_nh // HV).to(tl.int64), i_nh % HV
    i_h = i_hv // (HV // H)  # the q/k head of this value head
    _, bos, T, boc, NT = range_of_program(i_n, seq_map, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN, USE_SEQ_MAP)
    dt = k.dtype.element_ty
    if USE_NEED:
        b_need = tl.load(need + i_n * HV + i_hv) != 0
        NT = tl.where(b_need, NT, 0)
    else:
        b_need = True

    o_t = tl.arange(0, BT)  # chunk rows
    m_causal = o_t[:, None] >= o_t[None, :]
    o_k = tl.arange(0, BK)  # state rows: K padded to a power of two, the rows past K masked
    m_k = o_k < K
    o_c = i_v * BV + tl.arange(0, BV)  # state columns (TRANSITION: of the augmented [K, K+V] state)
    if TRANSITION:
        m_c = o_c < K + V
        o_vc = o_c - K  # the value column of an S_ext column (negative: an M column, V = 0 there)
        m_vc = (o_c >= K) & m_c
        b_h = tl.where((o_k[:, None] == o_c[None, :]) & (o_c < K)[None, :] & b_need, 1.0, 0.0)  # [I | 0] (0: masked)
        if USE_INITIAL_STATE:  # a skipped pair's S_ext (its certified window's state), in its S_ext columns
            p_s = h0 + (i_n * HV + i_hv) * K * V + o_k[:, None] * V + o_vc[None, :]
            b_h += tl.load(p_s, mask=m_k[:, None] & m_vc[None, :] & (b_need == 0), other=0.0)
    else:
        m_c = o_c < V
        o_vc = o_c
        m_vc = m_c
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
        if USE_INITIAL_STATE:
            b_h += tl.load(
                h0 + (i_n * HV + i_hv) * K * V + o_k[:, None] * V + o_c[None, :], mask=m_k[:, None] & m_c[None, :], other=0.0
            )

    if TMA:  # per-program descriptors over this range's rows: TMA zero-fills the rows past T and columns past K, V
        d_k = _rows(k + bos * H * K + i_h * K, T, K, H * K, BT, BK)
        if PRE_GATED:
            d_kd = _rows(kd + bos * H * K + i_h * K, T, K, H * K, BT, BK)
        d_a = _rows(ag + bos * HV * BT + i_hv * BT, T, BT, HV * BT, BT, BT)
        d_v = _rows(v + bos * HV * V + i_hv * V, T, V, HV * V, BT, BV)
        if OUTPUT:
            d_q = _rows(q + bos * H * K + i_h * K, T, K, H * K, BT, BK)
            d_o = _rows(o + bos * HV * V + i_hv * V, T, V, HV * V, BT, BV)

    # v by TMA: its columns in the range's state, in TRANSITION those of S_ext only when no block straddles the
    # identity block (K % BV == 0: a block is all M, loaded clamped and zeroed, or all S_ext)
    V_TMA: tl.constexpr = TMA and (not TRANSITION or K % BV == 0)
    for i_t in tl.range(NT, num_stages=LOOP_STAGES, warp_specialize=WS and V_TMA):
        o_r = i_t * BT + o_t
        m_r = o_r < T
        p_k = (bos + o_r) * H + i_h  # [BT] token rows of q, k
        p_v = (bos + o_r) * HV + i_hv  # [BT] token rows of v, Ag, G, o
        r_last = bos + tl.minimum(i_t * BT + BT, T) - 1  # the chunk's last token
        if PRE_GATED:  # [BK]: the last-row gate G_C of the chunk (q, k arrive gated; no [BT, BK] gate tile)
            b_g = tl.load(gcum + ((boc + i_t) * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
            b_gl = b_g
        elif GATE_VECTOR:  # [BT, BK], [BK]: the per-key cumsum (0 past the end and past K keeps every exp finite)
            b_g = tl.load(gcum + p_v[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
            b_gl = tl.load(gcum + (r_last * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
        else:  # [BT], a scalar
            b_g = tl.load(gcum + p_v, mask=m_r, other=0.0)
            b_gl = tl.load(gcum + r_last * HV + i_hv)
        if EXP2:  # the gates in log2 units once per chunk: every exponential below is one exp2
            b_g, b_gl = b_g * LOG2E, b_gl * LOG2E
        b_eg = _gexp(b_g, EXP2)
        r0 = tl.cast(i_t * BT, tl.int32)  # the chunk's first row in the range (TMA offsets are 32-bit)
        if TMA:
            b_k = d_k.load([r0, 0])
            b_a = tl.where(m_causal, d_a.load([r0, 0]), 0.0)  # nothing above the diagonal is read
        else:
            b_k = tl.load(k + p_k[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)  # [BT, BK]
            b_a = tl.load(ag + p_v[:, None] * BT + o_t[None, :], mask=m_r[:, None] & m_causal, other=0.0)  # [BT, BT]
        if V_TMA and TRANSITION:
            b_v = tl.where(i_v * BV >= K, d_v.load([r0, tl.maximum(i_v * BV - K, 0)]), 0.0)
        elif V_TMA:
            b_v = d_v.load([r0, i_v * BV])
        else:
            b_v = tl.load(v + p_v[:, None] * V + o_vc[None, :], mask=m_r[:, None] & m_vc[None, :], other=0.0)
        b_hc = b_h.to(dt)
        if STORE_STATES:
            tl.store(
                hs + ((boc + i_t) * HV + i_hv) * K * V + o_k[:, None] * V + o_c[None, :],
                b_hc,
                mask=m_k[:, None] & m_c[None, :],
            )
        if PRE_GATED:
            b_w = b_v.to(tl.float32) - tl.dot(b_k, b_hc)  # V - ke S  [BT, BV]
        elif GATE_VECTOR:
            b_w = b_v.to(tl.float32) - tl.dot((b_k * b_eg).to(dt), b_hc)  # V - (K (x) eG) S  [BT, BV]
        else:
            b_w = b_v.to(tl.float32) - b_eg[:, None] * tl.dot(b_k, b_hc)  # V - eG K S  [BT, BV]
        b_vd = tl.dot(b_a, b_w.to(dt))  # u - w S
        if STORE_STATES:
            tl.store(vn + p_v[:, None] * V + o_c[None, :], b_vd.to(dt), mask=m_r[:, None] & m_c[None, :])
        if OUTPUT:
            if TMA:
                b_q = d_q.load([r0, 0])
            else:
                b_q = tl.load(q + p_k[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
            m_qk = m_causal & m_r[:, None]
            if HAS_AQK:
                b_p = tl.load(aqk + p_v[:, None] * BT + o_t[None, :], mask=m_qk, other=0.0)
            else:
                b_p = tl.where(m_qk, tl.dot(b_q, tl.trans(b_k)) * _gexp(b_g[:, None] - b_g[None, :], EXP2), 0.0) * scale
            if PRE_GATED:  # qg = scale Q exp(G)
                b_o = tl.dot(b_q, b_hc) + tl.dot(b_p.to(dt), b_vd.to(dt))
            elif GATE_VECTOR:
                b_o = tl.dot((b_q * b_eg * scale).to(dt), b_hc) + tl.dot(b_p.to(dt), b_vd.to(dt))
            else:
                b_o = tl.dot(b_q, b_hc) * (b_eg * scale)[:, None] + tl.dot(b_p.to(dt), b_vd.to(dt))
            if TMA:  # rows past T and columns past V are clipped
                d_o.store([r0, i_v * BV], b_o.to(o.dtype.element_ty))
            else:
                tl.store(o + p_v[:, None] * V + o_c[None, :], b_o.to(o.dtype.element_ty), mask=m_r[:, None] & m_c[None, :])
        if PRE_GATED:  # S = diag(gl) S + kd^T Vd (kd's rows past the end load as zero)
            if TMA:
                b_kd = d_kd.load([r0, 0])
            else:
                b_kd = tl.load(kd + p_k[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
            b_h = b_h * _gexp(b_gl, EXP2)[:, None]
            b_h = tl.dot(tl.trans(b_kd), b_vd.to(dt), b_h)
        elif GATE_VECTOR:  # S = diag(gl) S + (K (x) exp(G_last - G))^T Vd
            b_vd = tl.where(m_r[:, None], b_vd, 0.0)
            b_h = b_h * _gexp(b_gl, EXP2)[:, None]
            b_h = tl.dot(tl.trans((b_k * _gexp(b_gl[None, :] - b_g, EXP2)).to(dt)), b_vd.to(dt), b_h)
        else:
            b_vd = tl.where(m_r[:, None], b_vd * _gexp(b_gl - b_g, EXP2)[:, None], 0.0)
            b_h = b_h * _gexp(b_gl, EXP2)
            b_h = tl.dot(tl.trans(b_k), b_vd.to(dt), b_h)

    if TRANSITION:
        tl.store(m + (i_n * HV + i_hv) * K * K + o_k[:, None] * K + o_c[None, :], b_h, mask=m_k[:, None] & (o_c < K)[None, :])
        tl.store(ht + (i_n * HV + i_hv) * K * V + o_k[:, None] * V + o_vc[None, :], b_h, mask=m_k[:, None] & m_vc[None, :])
    elif STORE_FINAL_STATE:
        if USE_FINAL_IDX:
            i_f = tl.load(final_idx + i_n).to(tl.int64)
        else:
            i_f = i_n
        if i_f >= 0:
            tl.store(ht + (i_f * HV + i_hv) * K * V + o_k[:, None] * V + o_c[None, :], b_h, mask=m_k[:, None] & m_c[None, :])


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def _config(
    launch: LaunchPlan | None,
    k: Tensor,
    v: Tensor,
    gcum: Tensor,
    *,
    BT: int,
    mode: str,
    layout: SeqLayout,
    ncols_limit: int,
    kd: Tensor | None = None,
) -> LaunchConfig:
    key = {
        "H": k.shape[2],
        "HV": v.shape[2],
        "K": k.shape[3],
        "V": v.shape[3],
        "BT": BT,
        "MODE": mode,
        "IS_VARLEN": layout.cu_seqlens is not None,
        "dtype": str(k.dtype).removeprefix("torch."),
    }
    spec = KDA_FUSED_STATE_OUTPUT_FWD if gcum.dim() == 4 or kd is not None else GDN_FUSED_STATE_OUTPUT_FWD
    return launch_config(launch, spec, key, bv_limit=ncols_limit)


def _launch(cfg: LaunchConfig, ncols: int, layout: SeqLayout, *, q: Tensor | None, k: Tensor, v: Tensor, ag: Tensor,
            gcum: Tensor, BT: int, scale: float = 1.0, h0: Tensor | None = None, ht: Tensor | None = None,
            m: Tensor | None = None, o: Tensor | None = None, need: Tensor | None = None,
            hs: Tensor | None = None, vn: Tensor | None = None, aqk: Tensor | None = None,
            kd: Tensor | None = None) -> None:  # fmt: skip
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BV = cfg.BV
    assert BV is not None and BV >= 16 and BT >= 16, f"tiles must be >= 16, got BV={BV} BT={BT}"
    if kd is not None:
        _check_pre_gated(k, v, ag, gcum, kd, BT=BT, q=q, o=o, aqk=aqk, hs=hs)
    assert HV % H == 0 and ag.shape == (B, T, HV, BT) and gcum.shape in ((B, T, HV), (B, T, HV, K)) or kd is not None, (
        f"Ag {tuple(ag.shape)} / gcum {tuple(gcum.shape)} do not match v {tuple(v.shape)} with chunk {BT}"
    )
    grid = (cdiv(ncols, BV), layout.num_programs * HV)
    if grid[1] == 0:
        return
    bits = variant_flags(cfg.VARIANT, k, v, o, BT=BT, q=q)
    gdn_fused_state_output_kernel[grid](
        q, k, v, ag, gcum, aqk, kd, h0, ht, m, o, layout.cu_seqlens, layout.chunk_offsets, layout.seq_map, layout.final_idx, need,
        hs, vn, scale, T, H=H, HV=HV, K=K, V=V, BT=BT, BK=head_block(K), BV=BV, EXP2=bits["exp2"], TMA=bits["tma"],
        LOOP_STAGES=cfg.num_stages if bits["pipe"] else None, WS=bits["ws"], num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def _check_pre_gated(k: Tensor, v: Tensor, ag: Tensor, gc: Tensor, kd: Tensor, *, BT: int, q: Tensor | None,
                     o: Tensor | None, aqk: Tensor | None, hs: Tensor | None) -> None:  # fmt: skip
    """The PRE_GATED launch's shapes (KDA's gated Ag pass, `kernels.ops.kda.wy_ag.GatedKeys`): ke, kd (and qg) `[B, T,
    HV, K]`, G_C `[NT_total, HV, K]`, Aqk with the output (the kernel forms no P), no state recompute."""
    B, T, HV, K = v.shape[0], v.shape[1], v.shape[2], k.shape[3]
    assert k.shape == kd.shape == (B, T, HV, K) and (q is None or q.shape == k.shape), (
        f"pre-gated: ke {tuple(k.shape)}, kd {tuple(kd.shape)}, qg {None if q is None else tuple(q.shape)} must be "
        f"[B, T, HV, K] = {(B, T, HV, K)}"
    )
    assert ag.shape == (B, T, HV, BT) and gc.dim() == 3 and gc.shape[1:] == (HV, K) and gc.dtype == torch.float32, (
        f"pre-gated: Ag {tuple(ag.shape)} / G_C {tuple(gc.shape)} {gc.dtype} do not match v {tuple(v.shape)}"
    )
    assert (o is None or aqk is not None) and hs is None, "pre-gated: the output needs Aqk; no STORE_STATES"


def _tma_scratch(size: int, alignment: int, stream: int | None) -> Tensor:
    """The global scratch Triton asks for the kernel's device-side TMA descriptors (`triton.set_allocator`)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def variant_flags(
    variant: int | None, k: Tensor, v: Tensor, o: Tensor | None, *, BT: int, q: Tensor | None = None
) -> dict[str, bool]:
    """The fused pass's variant bits (`FUSED_VARIANTS`) as the kernel's flags; refuses (ValueError, one line) a bit set
    it does not know, ws without tma, and tma where a row of q, k, v, Ag or o or its address is not a multiple of 16
    bytes (TMA's stride and address rules)."""
    bits = variant or 0
    if bits & ~sum(FUSED_VARIANTS.values()):
        raise ValueError(f"gdn fused pass: unknown VARIANT bits {bits}; the bits are {FUSED_VARIANTS}")
    flags = {name: bool(bits & bit) for name, bit in FUSED_VARIANTS.items()}
    if flags["ws"] and not flags["tma"]:
        raise ValueError(
            "gdn fused pass: the ws variant needs tma (Triton 3.6's Hopper warp specialisation fails to "
            "compile the chunk loop's pointer loads: NVGPUWarpSpecialization, sm_90)"
        )
    if flags["tma"]:
        rows = {"k": k.shape[3] * k.element_size(), "v": v.shape[3] * v.element_size(), "Ag": BT * k.element_size()}
        tiles = {"q": q, "k": k, "v": v, "o": o}
        rows.update({name: t.shape[3] * t.element_size() for name, t in tiles.items() if t is not None and name in "qo"})
        bad = {name: b for name, b in rows.items() if b % 16}
        bad.update({f"{name} address": t.data_ptr() % 16 for name, t in tiles.items() if t is not None and t.data_ptr() % 16})
        if bad:
            raise ValueError(f"gdn fused pass: the tma variant needs rows and addresses of a multiple of 16 bytes, got {bad}")
        if k.is_cuda:
            triton.set_allocator(_tma_scratch)
    return flags


def gdn_fused_state_output(
    q: Tensor | None, k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, layout: SeqLayout, BT: int, scale: float = 1.0,
    h0: Tensor | None = None, output_final_state: bool = False, num_states: int | None = None,
    out_dtype: torch.dtype | None = None, launch: LaunchPlan | None = None, aqk: Tensor | None = None,
    hs: Tensor | None = None, vn: Tensor | None = None, kd: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """The pass over the layout's ranges: (o `[B, T, HV, V]` or None without q, final state fp32 or None).

    q, k `[B, T, H, K]`, v `[B, T, HV, V]`, Ag, gcum (GDN `[B, T, HV]`; KDA `[B, T, HV, K]`, the per-key gate) and
    aqk (KDA: the output's intra-chunk matrix; GDN: None, formed here) from the Ag prep; h0 `[layout.num_programs, HV, K, V]` fp32 or
    None; the final states `[num_states or num_programs, HV, K, V]` (at `layout.final_idx` when it has one). hs
    `[NT, HV, K, V]`, vn `[B, T, HV, V]` (k's dtype) or None: filled with the state entering each chunk and v_new
    (STORE_STATES, in the same launch as the output; the launch config and o are those without them). kd: KDA's
    gated keys K exp(G_C - G) (`kernels.ops.kda.wy_ag.GatedKeys`), q, k, gcum then its qg, ke, gc; None: as read.
    """
    K, HV, V = k.shape[3], v.shape[2], v.shape[3]
    mode = "output" if q is not None else "state"
    cfg = _config(launch, k, v, gcum, BT=BT, mode=mode, layout=layout, ncols_limit=head_block(V), kd=kd)
    o = torch.empty(v.shape, dtype=out_dtype or q.dtype, device=v.device) if q is not None else None
    ht = k.new_empty(num_states or layout.num_programs, HV, K, V, dtype=torch.float32) if output_final_state else None
    _launch(
        cfg, V, layout, q=q, k=k, v=v, ag=ag, gcum=gcum, BT=BT, scale=scale, h0=h0, ht=ht, o=o, aqk=aqk, hs=hs, vn=vn, kd=kd
    )
    return o, ht


def gdn_fused_transition(
    k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, layout: SeqLayout, BT: int, launch: LaunchPlan | None = None,
    need: Tensor | None = None, kd: Tensor | None = None, skipped: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Each program's range as an affine map S -> M S + S_ext: (M `[N, HV, K, K]`, S_ext `[N, HV, K, V]`) fp32,
    N = layout.num_programs (M: the recurrence on the identity with V = 0; S_ext: from zero with V). need: bool
    `[N, HV]` on the device, or None (all): the (program, head) pairs whose flag is False walk no chunk and store
    M = 0, S_ext = 0, or their state in skipped fp32 `[N, HV, K, V]` where given (`kernels.common.warm_split`'s
    certified windows and their E_win). kd: as `gdn_fused_state_output`'s."""
    K, HV, V = k.shape[3], v.shape[2], v.shape[3]
    cfg = _config(
        launch, k, v, gcum, BT=BT, mode="transition", layout=layout, ncols_limit=min(head_block(K), head_block(V)), kd=kd
    )
    N = layout.num_programs
    M = k.new_empty(N, HV, K, K, dtype=torch.float32)
    S = k.new_empty(N, HV, K, V, dtype=torch.float32)
    if need is not None:
        assert need.shape == (N, HV) and need.dtype == torch.bool, (
            f"need must be bool [{N}, {HV}], got {need.dtype} {tuple(need.shape)}"
        )
    flags = None if need is None else need.contiguous()  # bool, one byte per (program, head): Triton loads it as int8
    h0 = skipped_states(skipped, need, (N, HV, K, V))
    _launch(cfg, K + V, layout, q=None, k=k, v=v, ag=ag, gcum=gcum, BT=BT, h0=h0, ht=S, m=M, need=flags, kd=kd)
    return M, S


def exact_segment_states(
    k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, h0: Tensor | None, *, plan: SplitPlan, BT: int, launch: LaunchPlan
) -> tuple[Tensor, Tensor]:
    """(M of every segment `[NS, HV, K, K]` fp32, the state entering every segment `[NS, HV, K, V]` fp32): this pass's
    exact transitions over all segments (the last ones too: the backward's reverse chain reads their maps) and
    `seg_chain_fwd` over the non-last ones from h0 `[N, HV, K, V]` fp32 or None. No warm window: a certified segment
    would have no map."""
    M, S_ext = gdn_fused_transition(k, v, ag, gcum, layout=plan.all_segments, BT=BT, launch=launch)
    nonlast = plan.transitions.seq_map
    assert nonlast is not None
    return M, seg_chain_fwd(M.index_select(0, nonlast), S_ext.index_select(0, nonlast), h0, plan, launch=launch)


# ---------------------------------------------------------------------------------------------------------------------
# the forward


def gdn_fused_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan,
    initial_state: Tensor | None = None, output_final_state: bool = False, split_chunks: int | None = None,
    warm: WarmInputs | None = None, ag_prep: AgPrep | None = None, keep: dict[str, Tensor] | None = None,
    keep_states: bool = False, seg_states: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """GDN's forward on the fused pass: (o `[B, T, HV, V]` in q's dtype, final state `[N, HV, K, V]` fp32 or None).

    q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g, beta `[B, T, HV]` (contiguous). split_chunks: as
    `kernels.common.seqsplit.resolve_split` (None automatic, 0 never, n chunks per segment). ag_prep: the Ag pass
    (`(k, g, beta, *, index, launch, bnd, v) -> (Ag, gcum)`; None: GDN's `kernels.ops.gdn.wy_ag.wy_gdn_ag`; the tests
    hand in a torch one). warm: the split's gate-certified
    warmup (`kernels.common.warm_split`, its `chunk_bound` for the Ag pass to fill), or None (exact maps). keep: a dict
    that receives the Ag pass's outputs for the backward ("ag", "gs": `kernels.ops.gdn.ag_bwd`), and with the plan's
    `bwd_warm_for("gdn")` > 0 where the forward may split (`forward_splits`) the q, k side of the reverse bound sums
    it also made (`wy_gdn_ag(rev=)`, kept under `kernels.common.warm_bwd.KEPT_REV_SUMS`), or None.
    keep_states (the policy "ag+states", `LaunchPlan.keeps_ag`; needs keep, and warm=None unless the plan's
    `bwd_warm_for("gdn")` > 0): keep also receives the chunk states, v_new, the split and, with exact maps, the maps of
    every segment (`fused_state_output_keep`). seg_states: a dict that receives the split's segment states for the
    backward (`kernels.common.seqsplit.keep_segment_states`; not with keep_states, which keeps more), or None.
    """
    if keep_states and (keep is None or (warm is not None and not launch.bwd_warm_for("gdn"))):
        raise ValueError(
            "gdn_fused_fwd: keep_states needs a keep dict, and a warm window only with the plan's bwd_warm "
            "(else the backward needs every map)"
        )
    # (session 33) where the forward cannot split (`forward_splits`: split_chunks 0, or the walk's one-wave rule
    # leaving the sequences whole, as at 8x8K on an H200), no warm window: the Ag pass sums no decay bound for it
    # (at 8x8K those sums cost the Triton pass 0.11 ms of 0.29, session 29's `ag_pass_lab_s29_h200.md`). Not under
    # keep_states, whose kept form follows the warm window (`fused_state_output_keep`)
    splits = forward_splits(index, k, v, launch, split_chunks, keep_states)
    warm = warm if splits or keep_states else None
    bnd = warm.chunk_bound if warm is not None else None
    ag_prep = wy_gdn_ag if ag_prep is None else ag_prep
    # the q, k side of the backward's reverse bound sums, for its warm windows (`kernels.common.warm_bwd`, step 2):
    # the Ag pass has the gate, beta and ||k||^2 in registers already, so the backward reads only do for them
    rev: dict[str, Any] = {}
    if keep is not None and launch.bwd_warm_for("gdn") and splits:
        B, T, HV = g.shape
        sums = (torch.empty(B, T, HV, dtype=torch.float32, device=k.device),
                torch.empty(index.num_chunks, HV, 2, dtype=torch.float32, device=k.device))  # fmt: skip
        rev = {"rev": sums, "q": q}
    ag, gcum = ag_prep(k, g, beta, index=index, launch=launch, bnd=bnd, v=v if bnd is not None else None, **rev)
    if keep is not None:
        keep.update(ag=ag, gs=gcum, **(dict(zip(KEPT_REV_SUMS, rev["rev"], strict=True)) if rev else {}))
    opts = {"scale": scale, "index": index, "launch": launch, "initial_state": initial_state,
            "output_final_state": output_final_state, "split_chunks": split_chunks}  # fmt: skip
    if keep_states:
        assert keep is not None
        return fused_state_output_keep(q, k, v, ag, gcum, keep=keep, warm=warm, **opts)
    return fused_state_output_fwd(q, k, v, ag, gcum, warm=warm, seg_states=seg_states, **opts)


def forward_splits(index: ChunkIndex, k: Tensor, v: Tensor, launch: LaunchPlan, split_chunks: int | None,
                   keep_states: bool = False, *, gated: bool = False) -> bool:  # fmt: skip
    """Whether GDN's forward (with `gated`, KDA's two-kernel forward, whose output pass is the walk's gated build where
    it runs) may split the sequences, from shapes, before the Ag pass: False where split_chunks is 0 or where the
    output pass is the TileLang walk (for GDN not under keep_states, whose pass is Triton's; KDA's keeps no states)
    and its one-wave rule leaves them whole (`_walk_split`, as `output_split`); the Triton pass's rule needs the Ag
    pass's launch config, so True there. Where False the Ag pass sums no decay bound for the forward's warm windows
    (session 33) and, with keep, no q, k side of the backward's reverse sums (H200, session 26: at 8x8K, no split,
    those cost the Ag pass 0.11 ms of 0.40 for nothing); a backward that splits without them sums them from q, k, do
    as before."""
    if split_chunks == 0:
        return False
    walk = fwd_walk_wanted(k, v, index.chunk_size, launch, gated=gated)
    if split_chunks is None and walk and (gated or not keep_states or walk_keeps_states(k, v, index.chunk_size, launch)):
        return _walk_split(index, k, v) is not None
    return True


def walk_keeps_states(k: Tensor, v: Tensor, BT: int, launch: LaunchPlan) -> bool:
    """Whether the policy "ag+states" (with the plan's `bwd_warm`) keeps the chunk states the TileLang forward walk
    stores beside o (STORE_H with OUTPUT), and no v_new: where the walk is the output pass and the backward will be the
    reverse walk (`bwd_grads` "reverse", or "auto" where `auto_reverse` takes it), which reads h alone. Else the Triton
    pass keeps h and v_new for the Triton backward."""
    return fwd_walk_wanted(k, v, BT, launch) and (launch.bwd_grads in REVERSE_WALKS or auto_reverse(k, v, BT, launch))


def _walk_split(index: ChunkIndex, k: Tensor, v: Tensor) -> SplitPlan | None:
    """The TileLang walk's automatic split: its one-wave rule (`kernels.ops.gdn.fwd_walk.wave_seg_chunks`)."""
    seg = wave_seg_chunks(index, H=v.shape[2], sms=device_sms(k.device))
    return plan_split(index, seg) if seg is not None else None


def output_split(index: ChunkIndex, k: Tensor, v: Tensor, gcum: Tensor, *, launch: LaunchPlan,
                 split_chunks: int | None, kd: Tensor | None = None, walk: bool = False) -> SplitPlan | None:  # fmt: skip
    """The split of the forward's output pass (None: one program row per sequence): `resolve_split` with the output
    launch's BV, from shapes alone (kd: KDA's gated keys, whose launch config is keyed apart); under the TileLang walk
    (`walk`, which runs on CUDA only) its one-wave rule (`kernels.ops.gdn.fwd_walk.wave_seg_chunks`)."""
    if walk and split_chunks is None:
        return _walk_split(index, k, v)
    V = v.shape[3]
    cfg = _config(launch, k, v, gcum, BT=index.chunk_size, mode="output", layout=whole_sequences(index),
                  ncols_limit=head_block(V), kd=kd)  # fmt: skip
    return resolve_split(index, split_chunks, H=v.shape[2], NV=cdiv(V, cfg.BV or 64), device=k.device)


def fused_state_output_fwd(
    q: Tensor, k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan,
    initial_state: Tensor | None = None, output_final_state: bool = False, split_chunks: int | None = None,
    warm: WarmInputs | None = None, aqk: Tensor | None = None, kd: Tensor | None = None, hs: Tensor | None = None,
    vn: Tensor | None = None, seg_states: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The forward after the Ag pass (both ops; `gdn_fused_fwd`, `kernels.ops.kda.fused.kda_fused_fwd`): plain, or
    split (seqsplit's plan, this kernel's transitions, `seg_chain_fwd`, the output from each segment's entering state),
    with a warm window when `warm` holds the Ag pass's bound sums. Ag, gcum, aqk, kd, hs, vn as
    `gdn_fused_state_output`'s; seg_states as `kernels.common.seqsplit.keep_segment_states`'."""
    BT = index.chunk_size
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    layout = whole_sequences(index)
    # the output pass on the TileLang walk (`LaunchPlan.fwd_pass`): GDN's, or KDA's gated form (kd; not its inline
    # per-key gate); not STORE_STATES (with hs and no vn it also stores the chunk states: "ag+states" ahead of the
    # reverse walk, `walk_keeps_states`)
    gated = kd is not None
    walk = vn is None and (gated or (gcum.dim() == 3 and aqk is None)) and fwd_walk_wanted(k, v, BT, launch, gated=gated)
    if hs is not None and vn is None and not walk:
        raise ValueError("fused_state_output_fwd: chunk states without v_new are the TileLang walk's (not run here)")
    plan = output_split(index, k, v, gcum, launch=launch, split_chunks=split_chunks, kd=kd, walk=walk)
    num_states = None
    if plan is not None:
        pass_args = {"k": k, "v": v, "ag": ag, "gcum": gcum, "BT": BT, "launch": launch, "kd": kd}
        cuts = (list(plan.bounds_cpu), list(plan.chunk_bounds_cpu), list(plan.transitions_cpu))
        wp = None if warm is None else window_plan(index, *cuts, warm.window_chunks, seg_chunks=plan.seg_chunks,
                                                    cache=plan.windows)  # fmt: skip
        drop = None
        if wp is None:
            M, S_ext = gdn_fused_transition(layout=plan.transitions, **pass_args)
        else:
            assert warm is not None

            def window_states(windows: SeqLayout) -> Tensor:  # the windows from zero: this pass, state only
                _, E_win = gdn_fused_state_output(None, layout=windows, output_final_state=True, **pass_args)
                assert E_win is not None
                return E_win

            M, S_ext, drop = certified_transitions(
                warm, wp, h0, window_states=window_states,
                masked_transitions=lambda need, E_win: gdn_fused_transition(
                    layout=plan.transitions, need=need, skipped=E_win, **pass_args
                ),
            )  # fmt: skip
        h0 = seg_chain_fwd(M, S_ext, h0, plan, launch=launch, drop=drop)
        keep_segment_states(seg_states, plan, h0)
        layout, num_states = plan.final, index.num_seqs
    if walk:
        o, ht, _ = fwd_walk_tilelang(q, k, v, ag, gcum, layout=layout, scale=scale, h0=h0, num_states=num_states,
                                     output_final_state=output_final_state, hs=hs, aqk=aqk, kd=kd,
                                     num_chunks=hs.shape[0] if hs is not None else None)  # fmt: skip
    else:
        o, ht = gdn_fused_state_output(q, k, v, ag, gcum, layout=layout, BT=BT, scale=scale, h0=h0,
                                       output_final_state=output_final_state, num_states=num_states, launch=launch,
                                       aqk=aqk, kd=kd, hs=hs, vn=vn)  # fmt: skip
    assert o is not None
    return o, ht


def fused_state_output_keep(
    q: Tensor, k: Tensor, v: Tensor, ag: Tensor, gcum: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan,
    keep: dict[str, Tensor], initial_state: Tensor | None = None, output_final_state: bool = False,
    split_chunks: int | None = None, warm: WarmInputs | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """`fused_state_output_fwd` (same result; GDN's scalar gate) for the policy "ag+states": it fills `keep` with the
    backward's kept states in `kernels.common.state_keep`'s form, h `[NT, HV, K, V]` and v_new `[B, T, HV, V]` (k's
    dtype, stored by the output launch itself: STORE_STATES), the maps M of every segment `[NS, HV, K, K]` fp32 when
    split, and `split` (segment length in chunks, 0 unsplit) as a CPU int64 scalar, so `chunk_bwd` resolves the same
    segments and skips the state recompute (`kernels.ops.gdn.ag_bwd`). Same split as the plain forward (the output
    launch's BV); o equals that forward's with exact maps (warm 0) bit for bit.

    warm None (the plan's `bwd_warm_for("gdn")` is 0): exact maps of every segment, kept, since the backward's exact
    reverse chain (`seg_chain_bwd`) reads them all. warm given (`bwd_warm` > 0: the backward's reverse pass has its own
    certified window, `kernels.common.warm_bwd`, and makes the maps of its uncertified segments itself): the output
    runs as `fused_state_output_fwd` with its warm split and the stores on, and `keep` gets no M; where the TileLang
    walk is the output pass and the backward the reverse walk (`walk_keeps_states`), the walk stores h beside o (its
    one-wave split) and `keep` gets no v_new (the reverse walk forms U itself)."""
    BT, HV, K, V = index.chunk_size, v.shape[2], k.shape[3], v.shape[3]
    walk = warm is not None and walk_keeps_states(k, v, BT, launch)
    plan = output_split(index, k, v, gcum, launch=launch, split_chunks=split_chunks, walk=walk)
    if warm is not None:
        keep["split"] = torch.tensor(plan.seg_chunks if plan is not None else 0, dtype=torch.int64)
        keep["h"] = k.new_empty(index.num_chunks, HV, K, V)
        if not walk:
            keep["v_new"] = torch.empty_like(v, dtype=k.dtype)
        return fused_state_output_fwd(q, k, v, ag, gcum, scale=scale, index=index, launch=launch,
                                      initial_state=initial_state, output_final_state=output_final_state,
                                      split_chunks=split_chunks, warm=warm, hs=keep["h"], vn=keep.get("v_new"))  # fmt: skip
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    layout, num_states = whole_sequences(index), None
    if plan is not None:
        keep["M"], h0 = exact_segment_states(k, v, ag, gcum, h0, plan=plan, BT=BT, launch=launch)
        layout, num_states = plan.final, index.num_seqs
    keep["split"] = torch.tensor(plan.seg_chunks if plan is not None else 0, dtype=torch.int64)
    keep["h"], keep["v_new"] = k.new_empty(index.num_chunks, HV, K, V), torch.empty_like(v, dtype=k.dtype)
    o, ht = gdn_fused_state_output(q, k, v, ag, gcum, layout=layout, BT=BT, scale=scale, h0=h0,
                                   output_final_state=output_final_state, num_states=num_states, launch=launch,
                                   hs=keep["h"], vn=keep["v_new"])  # fmt: skip
    assert o is not None
    return o, ht
