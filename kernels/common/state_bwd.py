"""The reverse state pass of the backward (GDN and KDA), plain or split across the sequence like the forward.

With dS the fp32 gradient reaching the state at the END of chunk t (dht, or zeros, at the sequence end):

    dh[t]   = dS                                               (stored, for the chunk-parallel gradient kernels)
    dv_new  = Aqk^T dO + K~ dS                                 (stored; Aqk includes the scale)
    dS      <- Diag(gamma_C) dS + Qg^T dO - w^T dv_new        (Qg = scale Q exp(G); after chunk 0: dh0 = dS)

GDN passes the raw q, k and the fp32 in-chunk gate cumsum [B, T, H] (K~ = K exp(G_C - G), Qg and gamma_C are
formed here); KDA passes qg, kg and the per-chunk last-row gate gc [NT_total, H, K] (`kernels.common.wy`).

Split (few long sequences, the same host rule and segment plan as the forward, `kernels.common.seqsplit`): a
segment maps the gradient at its end to the gradient at its start, dS_start = M^T dS_end + dS_ext, where M is the
forward's segment map (`chunk_state_transition_fwd`) and dS_ext is this pass from dS_end = 0 over the segment. So

1. `chunk_state_bwd` in "ext" mode runs every non-first segment from zero in parallel (dS_ext only, no stores);
2. `seg_chain_bwd` walks each sequence's segments from the last one down, dS_end(s) = M_{s+1}^T dS_end(s+1) +
   dS_ext_{s+1} from dht (one small serial kernel, fp32 with tf32x3 products);
3. the pass runs every segment in parallel from its dS_end, storing dh and dv_new; the first segment of each
   sequence stores dh0.

The gate-certified warm window of step 1 (`kernels.common.warm_bwd`) masks the ext pass per (program, head)
(`need`: a masked program walks no chunk and stores zeros) and has the chain take dS_ext alone where a window is
certified (`seg_chain_bwd(drop=...)`: no [K, K] product).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import given, group_heads, heuristics
from kernels.common.chunk_state import SeqLayout, skipped_states
from kernels.common.seqsplit import CHAIN_DOT_PRECISION, SplitPlan
from kernels.common.state_program import chain_dropped, chain_start, range_of_program
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.plan import LaunchPlan, launch_config

__all__ = ["CHUNK_STATE_BWD", "SEG_CHAIN_BWD", "chunk_state_bwd", "first_segments", "seg_chain_bwd"]

CHUNK_STATE_BWD = register(KernelSpec(
    name="chunk_state_bwd",
    key=("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype"),
    # as the forward's state pass (FLA's bwd_dhu: BV 32/64, 2-4 warps, 2-4 stages); an fp32 [K, BV] gradient state
    default=LaunchConfig(BV=64, num_warps=4, num_stages=1),
    space={"BV": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
    # 8 warps spill ~10x less than the default's 4 (benchmarks/results/ptxas_bwd_sm90.md); BV=32 is a known
    # Hopper crasher (runners/tuner/miscompiles.py)
    hints=(LaunchConfig(BV=64, num_warps=8, num_stages=1), LaunchConfig(BV=64, num_warps=8, num_stages=2)),
))

SEG_CHAIN_BWD = register(KernelSpec(
    name="seg_chain_bwd",
    key=("H", "K", "V"),
    # the mirror of seg_chain_fwd (same registers: an fp32 [K, K] map and a [K, BV] state)
    default=LaunchConfig(BV=32, num_warps=8, num_stages=1),
    space={"BV": (16, 32, 64), "num_warps": (4, 8)},
))


@heuristics({
    **given(USE_DHT="dht", STORE_DS="ds_out", STORE_DH="dh", STORE_DV="dv_new", IS_VARLEN="cu_seqlens",
            USE_SEQ_MAP="seq_map", USE_FINAL_IDX="final_idx", USE_NEED="need", USE_DS_SKIP="ds_skip"),
    "G": group_heads("do"),
})
@triton.jit(do_not_specialize=["T"])
def chunk_state_bwd_kernel(
    q,  # [B, T, H, K]: raw q (GDN) or qg (KDA, scaled)
    k,  # [B, T, H, K]: raw k (GDN) or kg (KDA)
    w,  # [B, T, H, K]
    g,  # GDN: gate cumsum [B, T, H] fp32; KDA: last-row gate per chunk [NT_total, H, K] fp32
    aqk,  # [B, T, H, BT] scaled, lower incl. diagonal (the blocks above are not read)
    do,  # [B, T, H, V]
    dht,  # [N_programs, H, K, V] fp32 gradient at the end of each program's range, or None (zeros)
    dh,  # out [NT_total, H, K, V] or None (ext mode)
    dv_new,  # out [B, T, H, V] or None (ext mode; and where the gradients form dU themselves, KDA's "tilelang")
    ds_out,  # out [N*, H, K, V] fp32: the gradient at the start of the range, or None
    cu_seqlens,
    chunk_offsets,
    seq_map,  # [N_programs] int32 or None: program n walks range seq_map[n]
    final_idx,  # [N_programs] int32 or None: program n stores ds_out[final_idx[n]] (nowhere if < 0)
    need,  # [N_programs, H] bool or None: 0 = walk no chunk (ds_out gets dht or zeros; the warm window's mask)
    ds_skip,  # [N_programs, H, K, V] fp32 or None: added to the start of the pairs need skips (their certified
    # windows' gradients, session 32: no torch `where` after the launch)
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, USE_DHT: tl.constexpr, STORE_DS: tl.constexpr, STORE_DH: tl.constexpr,
    STORE_DV: tl.constexpr, IS_VARLEN: tl.constexpr, USE_SEQ_MAP: tl.constexpr, USE_FINAL_IDX: tl.constexpr,
    USE_NEED: tl.constexpr, USE_DS_SKIP: tl.constexpr, G: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    i_s, bos, T, boc, NT = range_of_program(i_n, seq_map, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN, USE_SEQ_MAP)
    b_need = True
    if USE_NEED:
        b_need = tl.load(need + i_n * H + i_h) != 0
        NT = tl.where(b_need, NT, 0)
    dt = w.dtype.element_ty

    o_k = tl.arange(0, BK)  # K padded to a power of two, the rows past K masked
    m_k = o_k < K
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    m_causal_T = o_t[None, :] >= o_t[:, None]  # [j, i]: i >= j

    b_ds = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_ds += tl.load(dht + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)
    if USE_DS_SKIP:  # a skipped pair's gradient (it walks no chunk: stored as it is)
        b_ds += tl.load(ds_skip + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv & (b_need == 0),
                        other=0.)

    for i_r in range(NT):
        i_t = NT - 1 - i_r
        o_r = i_t * BT + o_t
        m_r = o_r < T
        p_row = (bos + o_r) * H + i_h
        p_qk = (bos + o_r) * (H // G) + i_h // G  # the rows of q and k (grouped heads: the shared head)
        if STORE_DH:
            tl.store(dh + ((boc + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_ds.to(dh.dtype.element_ty),
                     mask=m_kv)
        b_do = tl.load(do + p_row[:, None] * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.)
        b_aT = tl.load(aqk + p_row[None, :] * BT + o_t[:, None], mask=m_r[None, :] & m_causal_T, other=0.)  # [j, i]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)  # [BT, BK]
        b_qT = tl.load(q + p_qk[None, :] * K + o_k[:, None], mask=m_r[None, :] & m_k[:, None], other=0.)  # [BK, BT]
        b_wT = tl.load(w + p_row[None, :] * K + o_k[:, None], mask=m_r[None, :] & m_k[:, None], other=0.)  # [BK, BT]
        if GATE_VECTOR:
            b_gl = tl.load(g + ((boc + i_t) * H + i_h) * K + o_k, mask=m_k, other=0.)  # [BK]
            b_kt = b_k
            b_qgT = b_qT
            b_gam = tl.exp(b_gl)[:, None]
        else:
            b_g = tl.load(g + p_row, mask=m_r, other=0.)  # [BT]
            b_gl = tl.load(g + (bos + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h)
            b_kt = (b_k * tl.where(m_r, tl.exp(b_gl - b_g), 0.)[:, None]).to(dt)
            b_qgT = (b_qT * (tl.exp(b_g) * scale)[None, :]).to(dt)
            b_gam = tl.exp(b_gl)
        b_dv = tl.dot(b_aT.to(dt), b_do) + tl.dot(b_kt, b_ds.to(dt))  # [BT, BV]
        if STORE_DV:
            tl.store(dv_new + p_row[:, None] * V + o_v[None, :], b_dv.to(dv_new.dtype.element_ty),
                     mask=m_r[:, None] & m_v[None, :])
        b_ds = b_ds * b_gam + tl.dot(b_qgT, b_do) - tl.dot(b_wT, b_dv.to(dt))

    if STORE_DS:
        if USE_FINAL_IDX:
            i_f = tl.load(final_idx + i_n).to(tl.int64)
            if i_f >= 0:
                tl.store(ds_out + (i_f * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_ds, mask=m_kv)
        else:
            tl.store(ds_out + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_ds, mask=m_kv)


@heuristics({"USE_DHT": lambda args: args["dht"] is not None,
             "USE_DROP": lambda args: args["drop"] is not None})
@triton.jit
def seg_chain_bwd_kernel(
    m,  # [NS, H, K, K] fp32 forward maps of all segments, or [NS - N, ...] of the non-first ones (M_REST)
    ds_ext,  # [NS, H, K, V] fp32 (rows of first segments unused), or [NS - N, ...] of the non-first ones (EXT_REST)
    dht,  # [N, H, K, V] fp32 or None
    ds_end,  # out [NS, H, K, V] fp32: the gradient at the end of each segment
    seg_ptr,  # [N+1] int32
    drop,  # [NS - N, H] bool or None (needs EXT_REST): 1 = a certified warm window, dS = dS_ext without the product
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
    USE_DHT: tl.constexpr, USE_DROP: tl.constexpr, M_REST: tl.constexpr, EXT_REST: tl.constexpr,
):
    i_n, i_h, s0, s1, o_k, o_v, m_kv, m_kk, b_s = chain_start(seg_ptr, dht, H, K, V, BK, BV, USE_DHT)
    for i_r in range(0, s1 - s0 - 1):
        j = s1 - 1 - i_r
        tl.store(ds_end + (j * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_s, mask=m_kv)
        i_x = j - i_n - 1  # the row of segment j among the non-first segments (each earlier sequence owns one first)
        if EXT_REST:
            i_e = i_x
        else:
            i_e = j
        b_e = tl.load(ds_ext + (i_e * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)
        if chain_dropped(drop, i_x, H, i_h, USE_DROP):
            b_s = b_e
        else:
            if M_REST:
                i_m = i_x
            else:
                i_m = j
            b_mT = tl.load(m + (i_m * H + i_h) * K * K + o_k[None, :] * K + o_k[:, None], mask=m_kk, other=0.)  # M_j^T
            b_s = tl.dot(b_mT, b_s, input_precision=PRECISION) + b_e
    tl.store(ds_end + (s0 * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_s, mask=m_kv)


# ---------------------------------------------------------------------------------------------------------------------
# launchers

_FIRST_CACHE: dict[int, tuple[SplitPlan, Tensor, Tensor]] = {}


def first_segments(plan: SplitPlan) -> tuple[Tensor, Tensor]:
    """(non-first segment ids int32, first-segment map int32 [NS]: sequence n at its first segment, -1 elsewhere)."""
    hit = _FIRST_CACHE.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1], hit[2]
    ptr = plan.seg_ptr_cpu
    firsts = [-1] * plan.num_segments
    for n in range(plan.num_seqs):
        firsts[ptr[n]] = n
    rest = [s for s in range(plan.num_segments) if firsts[s] < 0]
    dev = plan.seg_ptr.device
    out = (torch.tensor(rest, dtype=torch.int32, device=dev), torch.tensor(firsts, dtype=torch.int32, device=dev))
    if len(_FIRST_CACHE) > 64:
        _FIRST_CACHE.clear()
    _FIRST_CACHE[id(plan)] = (plan, *out)
    return out


def state_bwd_config(H: int, K: int, V: int, BT: int, gate_vector: bool, varlen: bool, dtype: torch.dtype,
                     launch: LaunchPlan | None) -> LaunchConfig:
    key = {"H": H, "K": K, "V": V, "BT": BT, "GATE": "vector" if gate_vector else "scalar", "IS_VARLEN": varlen,
           "dtype": str(dtype).removeprefix("torch.")}
    return launch_config(launch, CHUNK_STATE_BWD, key, bv_limit=head_block(V))


def chunk_state_bwd(
    q: Tensor, k: Tensor, w: Tensor, g: Tensor, aqk: Tensor, do: Tensor, *, layout: SeqLayout, BT: int,
    gate_vector: bool, scale: float, dht: Tensor | None, ds_out: Tensor | None, dh: Tensor | None = None,
    dv_new: Tensor | None = None, launch: LaunchPlan | None = None, need: Tensor | None = None,
    skipped: Tensor | None = None,
) -> None:
    """Launch the reverse pass over `layout`'s ranges (see the module docstring); writes dh, dv_new, ds_out.

    need: bool `[N_programs, H]` on the device, or None (all): the (program, head) pairs whose flag is False walk no
    chunk (their ds_out is dht's row, or zeros, plus skipped's row where given: fp32 `[N_programs, H, K, V]`, the
    warm windows' gradients of the certified pairs, `kernels.common.warm_bwd`)."""
    H, K, V = do.shape[2], k.shape[3], do.shape[-1]  # H: the value heads (q, k may have H / G: grouped)
    cfg = state_bwd_config(H, K, V, BT, gate_vector, layout.cu_seqlens is not None, k.dtype, launch)
    BV = cfg.BV
    assert BV is not None and BV >= 16, f"bad tiles BV={BV} K={K} V={V}"
    grid = (cdiv(V, BV), layout.num_programs * H)
    if grid[1] == 0:
        return
    flags = None
    if need is not None:
        assert need.shape == (layout.num_programs, H) and need.dtype == torch.bool, \
            f"need must be bool [{layout.num_programs}, {H}], got {need.dtype} {tuple(need.shape)}"
        flags = need.contiguous()  # bool: Triton loads it as int8
    ds_skip = skipped_states(skipped, need, (layout.num_programs, H, K, V))
    chunk_state_bwd_kernel[grid](
        q, k, w, g, aqk, do, dht, dh, dv_new, ds_out,
        layout.cu_seqlens, layout.chunk_offsets, layout.seq_map, layout.final_idx, flags, ds_skip,
        scale, k.shape[1], H=H, K=K, V=V, BT=BT, BK=head_block(K), BV=BV, GATE_VECTOR=gate_vector,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def seg_chain_bwd(M: Tensor, ds_ext: Tensor, dht: Tensor | None, plan: SplitPlan, *,
                  launch: LaunchPlan | None = None, drop: Tensor | None = None) -> Tensor:
    """The gradient at the end of every segment, [NS, H, K, V] fp32, from the segments' forward maps M, the non-first
    segments' dS_ext and dht [N, H, K, V] (or None: zeros). M and ds_ext hold a row per segment (`[NS, ...]`, the rows
    of first segments unused) or per non-first segment in order (`[NS - N, ...]`), each told by its row count.

    drop: bool `[NS - N, H]` on the device, or None (ds_ext then per non-first segment): where True, the segment's
    map is dropped (a certified warm window, `kernels.common.warm_bwd`): the chain takes dS_ext without the product."""
    H, K, V = ds_ext.shape[1], ds_ext.shape[2], ds_ext.shape[3]
    NS, NR = plan.num_segments, plan.num_segments - plan.num_seqs
    assert M.shape[0] in (NS, NR) and ds_ext.shape[0] in (NS, NR), f"rows {M.shape[0]}, {ds_ext.shape[0]}: {NS} or {NR}"
    assert drop is None or (tuple(drop.shape) == (NR, H) and ds_ext.shape[0] == NR), \
        f"drop must be [{NR}, {H}] with ds_ext per non-first segment, got {None if drop is None else tuple(drop.shape)}"
    cfg = launch_config(launch, SEG_CHAIN_BWD, {"H": H, "K": K, "V": V}, bv_limit=head_block(V))
    BV = cfg.BV
    assert BV is not None and BV >= 16, f"bad tiles BV={BV} K={K} V={V}"
    ds_end = ds_ext.new_empty(NS, H, K, V)
    flags = None if drop is None else drop.contiguous()
    seg_chain_bwd_kernel[(cdiv(V, BV), plan.num_seqs * H)](
        M, ds_ext, dht, ds_end, plan.seg_ptr, flags, H=H, K=K, V=V, BK=head_block(K), BV=BV,
        PRECISION=CHAIN_DOT_PRECISION, M_REST=M.shape[0] != NS, EXT_REST=ds_ext.shape[0] != NS,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return ds_end
