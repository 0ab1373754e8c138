"""Intra-device sequence splitting: run the serial state pass of few long sequences on many SMs, exactly.

The state pass has one program per (sequence, head, V-block): at B=1, H=16, V=128 that is 32 programs on a
132-SM H200, each walking every chunk. When that is too few (decided on the host from shapes alone), each
long sequence is cut into segments of `seg_chunks` whole chunks and

1. the transition pass computes every non-last segment's map (M, S_ext) from a zero state, all in parallel
   (`chunk_state_transition_fwd` over the segments as a varlen batch; fp32 state);
2. `seg_chain_fwd` folds the maps in order per sequence, S_{s+1} = M_s S_s + S_ext_s from h0 (or 0), giving
   every segment's exact entering state (one small serial kernel, fp32 with tf32x3 products, no host sync);
3. the state+output pass runs all segments in parallel from those states; each sequence's last segment
   stores the final state.

Segments are unions of whole chunks of the original chunking, so the intra-chunk tensors (w, u, gates) are
shared unchanged. The plan (segment bounds, maps between segments and sequences) is built once per chunk
index on the host and cached; launches read only device tensors. `seg_compose_fwd` folds all segment maps of
a sequence into the sequence's map (the split form of the transition primitive).

`state_and_output` is the shared tail of the GDN and KDA forwards: plain or split, fused output or not.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_output import chunk_output_fwd
from kernels.common.chunk_program import heuristics
from kernels.common.chunk_state import (
    CHUNK_STATE_FWD,
    CHUNK_STATE_OUTPUT_FWD,
    SeqLayout,
    chunk_state_fwd,
    chunk_state_output_fwd,
    chunk_state_transition_fwd,
)
from kernels.common.index import ChunkIndex
from kernels.common.state_program import chain_dropped, chain_start
from kernels.common.warm_split import WarmInputs, warm_transitions, window_plan
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.plan import LaunchPlan, launch_config

__all__ = [
    "SEG_CHAIN_FWD",
    "SEG_COMPOSE_FWD",
    "SplitPlan",
    "auto_seg_chunks",
    "device_sms",
    "seg_chunks_for",
    "plan_split",
    "seg_chain_fwd",
    "seg_compose_fwd",
    "split_of",
    "keep_segment_states",
    "state_and_output",
    "whole_sequences",
]

logger = logging.getLogger(__name__)

# Host rule for the automatic split (measured on the H200, see benchmarks/results/kernels_h200.md):
# split only when the plain pass has fewer programs than SPLIT_MIN_FILL x SMs; then aim the segmented
# pass at SPLIT_TARGET x SMs programs, with segments of at least SPLIT_MIN_SEG_CHUNKS chunks.
SPLIT_MIN_FILL = 1.0
SPLIT_TARGET = 4.0
SPLIT_MIN_SEG_CHUNKS = 8

# fp32-accurate products for the chain (tf32x3: three tf32 MMAs; the interpreter computes in fp32 anyway)
CHAIN_DOT_PRECISION = "tf32x3"

SEG_CHAIN_FWD = register(KernelSpec(
    name="seg_chain_fwd",
    key=("H", "K", "V"),
    # N*H*V/BV programs, each S-1 dependent [K,K]x[K,BV] tf32x3 products. The fp32 [K, K] map dominates the
    # registers: BV 32 with 8 warps spills 16 bytes (ptxas sm_90a, K=V=128); BV 64 / 4 warps spills 1.1 KB
    default=LaunchConfig(BV=32, num_warps=8, num_stages=1),
    space={"BV": (16, 32, 64), "num_warps": (4, 8)},
))

SEG_COMPOSE_FWD = register(KernelSpec(
    name="seg_compose_fwd",
    key=("H", "K", "V"),
    # as seg_chain_fwd, over the K+V columns of [M | S_ext]
    default=LaunchConfig(BV=32, num_warps=8, num_stages=1),
    space={"BV": (16, 32, 64), "num_warps": (4, 8)},
))


@heuristics({"USE_INITIAL_STATE": lambda args: args["h0"] is not None,
             "USE_DROP": lambda args: args["drop"] is not None})
@triton.jit
def seg_chain_fwd_kernel(
    m,  # [NS - N, H, K, K] fp32 maps of the non-last segments, in segment order
    s_ext,  # [NS - N, H, K, V] fp32
    h0,  # [N, H, K, V] fp32 or None
    hs,  # out [NS, H, K, V] fp32: the state entering each segment
    seg_ptr,  # [N+1] int32: sequence n owns segments [seg_ptr[n], seg_ptr[n+1])
    drop,  # [NS - N, H] bool or None: 1 = the map's M is zero (a certified warmup window): S = S_ext, no product
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    USE_DROP: tl.constexpr,
):
    i_n, i_h, s0, s1, o_k, o_v, m_kv, m_kk, b_s = chain_start(seg_ptr, h0, H, K, V, BK, BV, USE_INITIAL_STATE)
    for j in range(s0, s1 - 1):
        tl.store(hs + (j * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_s, mask=m_kv)
        i_m = j - i_n  # sequences before n each own one last segment without a map
        b_e = tl.load(s_ext + (i_m * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)
        if chain_dropped(drop, i_m, H, i_h, USE_DROP):
            b_s = b_e
        else:
            b_m = tl.load(m + (i_m * H + i_h) * K * K + o_k[:, None] * K + o_k[None, :], mask=m_kk, other=0.)
            b_s = tl.dot(b_m, b_s, input_precision=PRECISION) + b_e
    tl.store(hs + ((s1 - 1) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], b_s, mask=m_kv)


@heuristics({"USE_NEED": lambda args: args["need"] is not None})
@triton.jit
def seg_compose_fwd_kernel(
    m,  # [NS, H, K, K] fp32 maps of all segments
    s_ext,  # [NS, H, K, V] fp32
    m_out,  # out [N, H, K, K]
    s_out,  # out [N, H, K, V]
    seg_ptr,  # [N+1] int32
    need,  # [N] bool or None: 0 = skip the fold, store zeros
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
    USE_NEED: tl.constexpr,
):
    # the augmented state [K, K+V] from [I | 0]: X <- M_j X + [0 | S_ext_j]
    i_c, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    s0 = tl.load(seg_ptr + i_n).to(tl.int64)
    s1 = tl.load(seg_ptr + i_n + 1).to(tl.int64)
    if USE_NEED:
        b_need = tl.load(need + i_n) != 0
        s1 = tl.where(b_need, s1, s0)
    else:
        b_need = True
    o_k = tl.arange(0, BK)  # K padded to a power of two, the rows past K masked
    m_k = o_k < K
    o_c = i_c * BV + tl.arange(0, BV)
    m_e = m_k[:, None] & ((o_c >= K) & (o_c < K + V))[None, :]  # the S_ext columns
    b_x = tl.where((o_k[:, None] == o_c[None, :]) & (o_c < K)[None, :] & b_need, 1., 0.)
    for j in range(s0, s1):
        b_m = tl.load(m + (j * H + i_h) * K * K + o_k[:, None] * K + o_k[None, :], mask=m_k[:, None] & m_k[None, :],
                      other=0.)
        b_e = tl.load(s_ext + (j * H + i_h) * K * V + o_k[:, None] * V + (o_c - K)[None, :],
                      mask=m_e, other=0.)
        b_x = tl.dot(b_m, b_x, input_precision=PRECISION) + b_e
    tl.store(m_out + (i_n * H + i_h) * K * K + o_k[:, None] * K + o_c[None, :], b_x, mask=m_k[:, None] & (o_c < K)[None, :])
    tl.store(s_out + (i_n * H + i_h) * K * V + o_k[:, None] * V + (o_c - K)[None, :], b_x, mask=m_e)


# ---------------------------------------------------------------------------------------------------------------------
# host plan


@dataclass(eq=False)
class SplitPlan:
    """Segments of whole chunks over the sequences of a `ChunkIndex` (all int32 device tensors built once).

    seg_chunks: chunks per segment (the last segment of a sequence may be shorter).
    all_segments: every segment as a varlen layout (token bounds on the flat token axis, global chunk offsets).
    transitions: the non-last segments (seq_map into all_segments) whose maps the chain needs.
    final: all segments, each sequence's last one storing ht[sequence] (final_idx, -1 elsewhere).
    seg_ptr: int32 `[N+1]`, sequence n owns segments [seg_ptr[n], seg_ptr[n+1]).
    seg_seq: int32 `[NS]`, the sequence of each segment.
    """

    seg_chunks: int
    num_segments: int
    num_seqs: int
    all_segments: SeqLayout
    transitions: SeqLayout
    final: SeqLayout
    seg_ptr: Tensor
    seg_ptr_cpu: list[int]
    seg_seq: Tensor          # int32 `[NS]`: the sequence of each segment (per-segment masks from per-sequence ones)
    bounds_cpu: tuple[int, ...] = ()        # host copies: segment token bounds `[NS+1]`, their global chunk offsets,
    chunk_bounds_cpu: tuple[int, ...] = ()  # and the segments that have a transition (non-last), in order
    transitions_cpu: tuple[int, ...] = ()
    windows: dict[Any, Any] = field(default_factory=dict, repr=False)  # warm windows per length (warm_split, warm_bwd)


_PLAN_CACHE: OrderedDict[tuple[int, int], tuple[ChunkIndex, SplitPlan]] = OrderedDict()
_PLAN_CACHE_SIZE = 64


def plan_split(index: ChunkIndex, seg_chunks: int) -> SplitPlan:
    """The (cached) segment plan of `index` with segments of `seg_chunks` chunks. Host lists only; no sync."""
    if seg_chunks < 1:
        raise ValueError(f"seg_chunks must be >= 1, got {seg_chunks}")
    key = (id(index), seg_chunks)
    hit = _PLAN_CACHE.get(key)
    if hit is not None and hit[0] is index:
        _PLAN_CACHE.move_to_end(key)
        return hit[1]
    C = index.chunk_size
    bounds, offsets = index.cu_seqlens_cpu, index.chunk_offsets_cpu
    cu, co, ptr, trans, final = [bounds[0]], [offsets[0]], [0], [], []
    for n in range(index.num_seqs):
        bos, eos, c0 = bounds[n], bounds[n + 1], offsets[n]
        nt = offsets[n + 1] - c0
        nseg = max(1, -(-nt // seg_chunks))
        for s in range(nseg):
            c_end = min((s + 1) * seg_chunks, nt)
            cu.append(min(bos + c_end * C, eos) if s < nseg - 1 else eos)
            co.append(c0 + c_end if s < nseg - 1 else offsets[n + 1])
            if s < nseg - 1:
                trans.append(len(final))
                final.append(-1)
            else:
                final.append(n)
        ptr.append(len(final))
    dev = index.device

    def t(x: list[int]) -> Tensor:
        return torch.tensor(x, dtype=torch.int32, device=dev)

    cu_t, co_t = t(cu), t(co)
    ns = len(final)
    plan = SplitPlan(
        seg_chunks=seg_chunks,
        num_segments=ns,
        num_seqs=index.num_seqs,
        all_segments=SeqLayout(ns, cu_t, co_t),
        transitions=SeqLayout(ns, cu_t, co_t, seq_map=t(trans)),
        final=SeqLayout(ns, cu_t, co_t, final_idx=t(final)),
        seg_ptr=t(ptr),
        seg_ptr_cpu=ptr,
        seg_seq=t([n for n in range(index.num_seqs) for _ in range(ptr[n], ptr[n + 1])]),
        bounds_cpu=tuple(cu), chunk_bounds_cpu=tuple(co), transitions_cpu=tuple(trans),
    )
    _PLAN_CACHE[key] = (index, plan)
    while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
        _PLAN_CACHE.popitem(last=False)
    return plan


def device_sms(device: torch.device) -> int:
    """The SM count of a CUDA device (the current one for a bare "cuda"), its properties read once per device."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def auto_seg_chunks(index: ChunkIndex, *, H: int, NV: int, device: torch.device) -> int | None:
    """Segment length (chunks) for the automatic split, or None for the plain pass. Shapes only.

    Only on CUDA (`seg_chunks_for` at the device's SM count); the CPU never splits.
    """
    if device.type != "cuda":
        return None
    return seg_chunks_for(index, H=H, NV=NV, sms=device_sms(device))


def seg_chunks_for(index: ChunkIndex, *, H: int, NV: int, sms: int) -> int | None:
    """The automatic split's rule on a GPU of `sms` SMs: split when N*H*NV programs fill less than SPLIT_MIN_FILL x
    SMs, aiming at SPLIT_TARGET x SMs; None: the plain pass."""
    if index.num_seqs * H * NV >= SPLIT_MIN_FILL * sms:
        return None
    seg = max(SPLIT_MIN_SEG_CHUNKS, -(-index.num_chunks * H * NV // int(SPLIT_TARGET * sms)))
    if seg >= index.max_chunks:
        return None
    return seg


def resolve_split(index: ChunkIndex, split_chunks: int | None, *, H: int, NV: int, device: torch.device) -> SplitPlan | None:
    """split_chunks: None = automatic, 0 = never, n > 0 = segments of n chunks (when some sequence is longer)."""
    if split_chunks is None:
        seg = auto_seg_chunks(index, H=H, NV=NV, device=device)
    elif split_chunks < 0:
        raise ValueError(f"split_chunks must be None or >= 0, got {split_chunks}")
    else:
        seg = split_chunks or None
    if seg is None or seg >= index.max_chunks:
        return None
    return plan_split(index, seg)


# ---------------------------------------------------------------------------------------------------------------------
# launchers


def seg_chain_fwd(M: Tensor, S_ext: Tensor, h0: Tensor | None, plan: SplitPlan, *,
                  launch: LaunchPlan | None = None, drop: Tensor | None = None) -> Tensor:
    """Entering state of every segment, [NS, H, K, V] fp32, from the non-last segments' maps and h0.

    drop: bool `[NS - N, H]` on the device, or None: where True, M is zero (`kernels.common.warm_split`'s certified
    windows) and the chain takes S_ext without the product."""
    return seg_chain_states(M, S_ext, h0, plan.seg_ptr, num_segments=plan.num_segments, launch=launch, drop=drop)


def seg_chain_states(M: Tensor, S_ext: Tensor, h0: Tensor | None, seg_ptr: Tensor, *, num_segments: int,
                     launch: LaunchPlan | None = None, drop: Tensor | None = None) -> Tensor:
    """`seg_chain_fwd` for any grouping of segments into chains: sequence n owns segments [seg_ptr[n], seg_ptr[n+1]).

    M `[NS - N, H, K, K]`, S_ext `[NS - N, H, K, V]` are the maps of the non-last segments in segment order;
    h0 `[N, H, K, V]` or None (zeros). Returns the entering state of every segment `[NS, H, K, V]` fp32, in one
    launch (one program per sequence, head and V block, walking its chain serially).
    """
    H, K, V = S_ext.shape[1], S_ext.shape[2], S_ext.shape[3]
    N = seg_ptr.shape[0] - 1
    assert M.shape[0] == S_ext.shape[0] == num_segments - N, f"need {num_segments - N} maps, got {M.shape[0]}"
    cfg = launch_config(launch, SEG_CHAIN_FWD, {"H": H, "K": K, "V": V}, bv_limit=head_block(V))
    BV = cfg.BV
    assert BV is not None and BV >= 16, f"bad tiles BV={BV} K={K} V={V}"
    hs = S_ext.new_empty(num_segments, H, K, V)
    flags = None if drop is None else drop.contiguous()
    seg_chain_fwd_kernel[(cdiv(V, BV), N * H)](
        M.contiguous(), S_ext.contiguous(), h0, hs, seg_ptr, flags, H=H, K=K, V=V, BK=head_block(K), BV=BV,
        PRECISION=CHAIN_DOT_PRECISION,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return hs


def seg_compose_fwd(M: Tensor, S_ext: Tensor, plan: SplitPlan, *, launch: LaunchPlan | None = None,
                    need: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Fold all segment maps of each sequence: (M [N, H, K, K], S_ext [N, H, K, V]) fp32.

    need: bool `[N]` on the device, or None: sequences whose flag is False skip the fold and get zeros.
    """
    H, K, V = S_ext.shape[1], S_ext.shape[2], S_ext.shape[3]
    cfg = launch_config(launch, SEG_COMPOSE_FWD, {"H": H, "K": K, "V": V}, bv_limit=min(head_block(K), head_block(V)))
    BV = cfg.BV
    assert BV is not None and BV >= 16, f"BV={BV} must be >= 16"
    m_out = M.new_empty(plan.num_seqs, H, K, K)
    s_out = S_ext.new_empty(plan.num_seqs, H, K, V)
    flags = None if need is None else need.contiguous()
    seg_compose_fwd_kernel[(cdiv(K + V, BV), plan.num_seqs * H)](
        M, S_ext, m_out, s_out, plan.seg_ptr, flags, H=H, K=K, V=V, BK=head_block(K), BV=BV, PRECISION=CHAIN_DOT_PRECISION,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return m_out, s_out


def keep_segment_states(seg_states: dict[str, Any] | None, plan: SplitPlan, hs: Tensor) -> None:
    """Hand the split's segment entering states to the backward: `seg_states` (a dict, or None: nothing kept)
    receives hs fp32 `[NS, H, K, V]` and the segment length `seg_chunks` (an int), so that `chunk_bwd(seg_states=)`
    runs the same segments from them instead of the warm split (or transitions) and chain again. NS is at most
    SPLIT_TARGET x SMs / (H x NV) per sequence: about 17 MB at K = V = 128 whatever T is."""
    if seg_states is not None:
        seg_states.update(hs=hs, seg_chunks=plan.seg_chunks)


def state_and_output(
    *,
    index: ChunkIndex,
    k: Tensor,
    w: Tensor,
    u: Tensor,
    g: Tensor,
    q: Tensor,
    aqk: Tensor,
    gate_vector: bool,
    scale: float,
    initial_state: Tensor | None,
    output_final_state: bool,
    out_dtype: torch.dtype,
    launch: LaunchPlan,
    split_chunks: int | None,
    fuse_output: bool,
    warm: WarmInputs | None = None,
    seg_states: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """State pass + output for GDN (k raw, g = gate cumsum, q raw) or KDA (k = kg, g = gc, q = qg); aqk from wy.

    warm: the op's raw inputs and window for the gate-certified warmup of the split's transitions
    (`kernels.common.warm_split`), or None (exact maps everywhere); it acts only when the split runs.
    seg_states: a dict that receives the split's segment states for the backward (`keep_segment_states`), or None.
    Returns (o [B, T, H, V] in out_dtype, final state [N, H, K, V] fp32 or None).
    """
    BT = index.chunk_size
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    plan = split_of(index, k, u, launch=launch, gate_vector=gate_vector, split_chunks=split_chunks, fuse_output=fuse_output)
    if plan is None:
        layout, h0_run, num_states = whole_sequences(index), h0, None
    else:
        # 1. maps of the non-last segments (certified warmup windows where the gates allow)  2. chain them into
        # every segment's entering state
        wp = None if warm is None else window_plan(index, list(plan.bounds_cpu), list(plan.chunk_bounds_cpu),
                                                    list(plan.transitions_cpu), warm.window_chunks,
                                                    seg_chunks=plan.seg_chunks, cache=plan.windows)
        drop = None
        if wp is None:
            M, S_ext = chunk_state_transition_fwd(k, w, u, g, layout=plan.transitions, BT=BT, gate_vector=gate_vector,
                                                  launch=launch)
        else:
            M, S_ext, drop = warm_transitions(k, w, u, g, transitions=plan.transitions, wp=wp, BT=BT,
                                              gate_vector=gate_vector, x=warm, h0=h0, launch=launch)
        h0_run = seg_chain_fwd(M, S_ext, h0, plan, launch=launch, drop=drop)
        keep_segment_states(seg_states, plan, h0_run)
        layout, num_states = plan.final, index.num_seqs
    if fuse_output:
        return chunk_state_output_fwd(k, w, u, g, q, layout=layout, BT=BT, gate_vector=gate_vector, scale=scale,
                                      aqk=aqk, h0=h0_run, output_final_state=output_final_state,
                                      num_states=num_states, out_dtype=out_dtype, launch=launch)
    h, v_new, ht = chunk_state_fwd(k, w, u, g, layout=layout, num_chunks=index.num_chunks, BT=BT,
                                   gate_vector=gate_vector, h0=h0_run, output_final_state=output_final_state,
                                   num_states=num_states, launch=launch)
    o = chunk_output_fwd(q, v_new, h, None if gate_vector else g, aqk, index=index, scale=scale,
                         gate_vector=gate_vector, out_dtype=out_dtype, launch=launch)
    return o, ht


def split_of(index: ChunkIndex, k: Tensor, u: Tensor, *, launch: LaunchPlan, gate_vector: bool, split_chunks: int | None,
             fuse_output: bool) -> SplitPlan | None:
    """The split plan of the forward's state pass (None: one program per sequence), from shapes alone."""
    H, K, V = u.shape[2], k.shape[3], u.shape[-1]
    bv = _state_bv(launch, H=H, K=K, V=V, BT=index.chunk_size, gate_vector=gate_vector, dtype=k.dtype, fuse=fuse_output,
                   varlen=index.is_varlen)
    return resolve_split(index, split_chunks, H=H, NV=-(-V // bv), device=k.device)


def whole_sequences(index: ChunkIndex) -> SeqLayout:
    """The layout of an unsplit state pass: one program row per sequence of the index."""
    return SeqLayout(index.num_seqs, index.cu_seqlens if index.is_varlen else None,
                     index.chunk_offsets if index.is_varlen else None)


def _state_bv(launch: LaunchPlan, *, H: int, K: int, V: int, BT: int, gate_vector: bool,
              dtype: torch.dtype, fuse: bool, varlen: bool) -> int:
    """The BV the state pass will use (the split rule counts its programs); the launch itself re-picks it."""
    spec = CHUNK_STATE_OUTPUT_FWD if fuse else CHUNK_STATE_FWD
    key = {"H": H, "K": K, "V": V, "BT": BT, "GATE": "vector" if gate_vector else "scalar", "IS_VARLEN": varlen,
           "dtype": str(dtype).removeprefix("torch.")}
    cfg = launch.config_for(spec, key)
    return min(int(cfg.BV or 64), head_block(V))
