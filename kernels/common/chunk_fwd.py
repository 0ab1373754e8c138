"""The Triton forward shared by GDN and KDA after the op's WY prep: the state pass with the output.

    chunk_fwd(wy_prep, ...)   the op's WY prep (`kernels.common.wy`: `wy_gdn_fwd` / `wy_kda_fwd`, through the op's
                              adapter in `kernels/ops/<op>/chunk.py`), then `state_and_output` (serial state pass,
                              split across SMs for few long sequences, with the output fused in or followed by the
                              output pass; `kernels.common.seqsplit`), or `state_and_output_keep` when the plan keeps
                              the chunk states for the backward (`kernels.common.state_keep`)
    fwd_path="fused"          the op's two-kernel forward (`kernels.ops.<op>.fused`: the Ag
                              prep, then one fused state+output pass forming w S and u from Ag); the default "auto"
                              takes it wherever it runs (GDN, KDA; the plan keeps nothing for the backward, output fused),
                              "wy" the WY prep and state pass above
    warm_chunks               the split's gate-certified warmup (`kernels.common.warm_split`), on either path: the WY or
                              Ag prep sums the decay bound per chunk (`bnd=`), the state pass drops the certified
                              segment maps

Inputs in FLA's layout (DESIGN.md §1), validated by `kernels.dispatch` before this is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import Tensor

from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.seqsplit import state_and_output
from kernels.common.state_keep import state_and_output_keep
from kernels.common.warm_split import warm_inputs, with_chunk_bound
from kernels.common.wy import BT_WY
from kernels.plan import LaunchPlan, default_plan
from kernels.vocabulary import AUTO_FWD_PATH

__all__ = ["FUSE_OUTPUT", "WyPrep", "chunk_fwd"]

# the op's two-kernel forward (`ChunkOp.fused_fwd`: `kernels.ops.gdn.fused.gdn_fused_fwd`, `ops.kda.fused.kda_fused_fwd`):
# (q, k, v, g, beta, *, scale, index, launch, initial_state, output_final_state, split_chunks, warm) -> (o, final state)
FusedFwd = Callable[..., tuple[Tensor, Tensor | None]]

# the forward paths of `chunk_fwd(fwd_path=...)`: "auto" (the default: "fused" where the op has a two-kernel forward,
# `ChunkOp.fused_fwd`, its `kernels.vocabulary.AUTO_FWD_PATH` is "fused", or "walk" and its state+output pass runs on
# the TileLang walk (`ChunkOp.fwd_walk`), the output is fused and no WY factors are kept; else "wy"), "wy" (the WY
# prep writing w, u, Aqk, then the state pass) or "fused" (the op's two-kernel forward;
# GDN, KDA). On the H200 (kernels/NOTES.md, session 10): GDN's two-kernel forward is 21-40 % faster than the WY one.
FWD_PATHS = ("auto", "wy", "fused")


def check_fwd_path(fwd_path: str, *, op: str, fused_fwd: FusedFwd | None, keep_wy: bool, keep_states: bool,
                   unfused_output: bool = False, tilelang: bool = False, walk: bool = False) -> bool:  # fmt: skip
    """True for the fused path, False for the WY path; "auto" picks the fused one where the op's `AUTO_FWD_PATH`
    names it ("fused"; "walk" where walk is True: the two-kernel forward's state+output pass runs on the TileLang
    walk under the plan) or the plan asks for a TileLang pass of the two-kernel forward (tilelang: `LaunchPlan.fwd_pass`
    or `ag_pass` "tilelang", which only the fused path runs), it can run, the output
    pass is fused (unfused_output: the caller asked for the separate output pass,
    which only the WY path has) and nothing is kept for the backward (keep_wy: the plan keeps the WY factors, which
    only the WY path makes), with or without a warm window (both paths run the warm split); a one-line ValueError
    for a path it cannot run (the fused one needs the op's two-kernel forward, GDN's or KDA's, and keeps no states)."""
    if fwd_path not in FWD_PATHS:
        raise ValueError(f"fwd_path must be one of {', '.join(FWD_PATHS)}, got {fwd_path!r}")
    if fwd_path == "auto":
        auto = AUTO_FWD_PATH.get(op)
        auto_fused = (auto == "fused" or (auto == "walk" and walk) or tilelang) and fused_fwd is not None
        return auto_fused and not keep_wy and not keep_states and not unfused_output
    if fwd_path == "wy":
        return False
    if fused_fwd is None or keep_states:
        raise ValueError(f"fwd_path='fused' runs without kept states (GDN, KDA), got op={op!r}, keep_states={keep_states}")
    return True


# the output fused into the state pass (no per-chunk states in memory); measured faster, see kernels.bench
FUSE_OUTPUT = True


@dataclass(frozen=True)
class WyPrep:
    """What the op's WY prep hands the state pass: the keys and queries it reads (GDN: raw; KDA: gated), the gate in
    its form (GDN: fp32 cumsum `[B, T, H]`; KDA: per-chunk last-row gate), w, u, Aqk, and what the backward may keep."""

    k: Tensor
    q: Tensor
    g: Tensor
    w: Tensor
    u: Tensor
    aqk: Tensor
    kept: dict[str, Tensor] = field(default_factory=dict)


# (q, k, v, g, beta, *, scale, index: ChunkIndex, launch: LaunchPlan, bnd: Tensor | None) -> WyPrep
WyFn = Callable[..., WyPrep]
# (k, v, chunk_size, launch) -> whether the two-kernel forward's state+output pass runs on the TileLang walk
WalkFn = Callable[[Tensor, Tensor, int, LaunchPlan], bool]


def chunk_fwd(
    wy_prep: WyFn,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    op: str,
    gate_vector: bool,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    chunk_size: int = BT_WY,
    plan: LaunchPlan | None = None,
    keep: dict[str, Tensor] | None = None,
    keep_states: bool = False,
    split_chunks: int | None = None,
    fuse_output: bool | None = None,
    warm_chunks: int | None = None,
    warm_report: dict[str, Tensor] | None = None,
    fwd_path: str = FWD_PATHS[0],
    fused_fwd: FusedFwd | None = None,
    seg_states: dict[str, Any] | None = None,
    fwd_walk: WalkFn | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked forward: (o `[B, T, H, V]` in q's dtype, final state `[N, H, K, V]` fp32 or None).

    plan: the launch plan (`kernels.plan`; None: `default_plan()`). split_chunks: None = automatic sequence
    splitting, 0 = never, n = segments of n chunks. fuse_output: None = FUSE_OUTPUT. keep: a dict that receives the
    WY factors the backward would recompute (`kernels.common.chunk_bwd.chunk_bwd(wy=...)`; under the plan's keep "ag"
    the fused path's Ag and gate cumsum instead, `kernels.ops.gdn.ag_bwd`, and under "ag+states" its chunk states,
    v_new and split as well, with the maps of every segment from exact transitions unless the plan's
    `bwd_warm_for(op)` > 0, when the forward keeps its warm split and no maps); keep_states: and the WY path's
    chunk states, new values and segment maps (`kernels.common.state_keep`). chunk_size: the tokens per chunk, one of
    `kernels.common.wy.CHUNK_SIZES` (FLA's `chunk_size`; the backward must use the same). op: the op's name ("gdn",
    "kda"; the warmup's bound reads its gate). warm_chunks: the gate-certified warmup window of the split
    (`kernels.common.warm_split`; None = its WARM_DEFAULT for the path taken, 0 = exact maps); warm_report: a dict
    that receives its device tensor `certified` (read it after the call). fwd_path: one of FWD_PATHS ("auto": fused
    where it runs and the plan keeps no WY factors for the backward; "fused": the op's two-kernel forward, not with
    keep_states; it keeps no WY factors, so the backward recomputes them). fused_fwd: the op's two-kernel forward
    for the fused path (the op table's `ChunkOp.fused_fwd`; GDN's `gdn_fused_fwd`, KDA's `kda_fused_fwd`).
    seg_states: a dict that receives the split's segment entering states for the backward (`chunk_bwd(seg_states=)`,
    `kernels.common.seqsplit.keep_segment_states`; where the split runs and the plan keeps no chunk states), or None.
    fwd_walk: whether the two-kernel forward's state+output pass runs on the TileLang walk for these inputs under the
    plan (`ChunkOp.fwd_walk`; AUTO_FWD_PATH "walk" reads it), or None.
    """
    B, T, H, _ = k.shape
    launch = plan if plan is not None else default_plan()
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    index: ChunkIndex = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    # the fused path keeps its Ag pass's outputs ("ag", "ag+states"; the WY path: none) and under "ag+states" its chunk
    # states; not when the caller asked for the WY path's states (keep_states: `kernels.dispatch.chunk_forward(states=)`,
    # "wy+states"), which then keeps the WY factors with them whatever the policy
    keep_ag, ag_states = (keep is not None and not keep_states and x for x in launch.keeps_ag(op))
    walk = fwd_path == "auto" and AUTO_FWD_PATH.get(op) == "walk" and fwd_walk is not None
    fused_path = check_fwd_path(
        fwd_path,
        op=op,
        fused_fwd=fused_fwd,
        keep_wy=keep is not None and not keep_ag,
        keep_states=keep is not None and keep_states,
        unfused_output=fuse_output is False,
        tilelang="tilelang" in (launch.fwd_pass, launch.ag_pass),
        walk=walk and fwd_walk(k, v, chunk_size, launch),
    )
    path = "fused" if fused_path else "wy"
    fused_states = fused_path and ag_states  # "ag+states" on the fused path
    # kept states need the maps of every segment, which the warm split does not make, unless the backward's reverse
    # state pass runs its own certified window (`launch.bwd_warm_for(op)`, kernels.common.warm_bwd: it makes the maps it needs):
    # "ag+states" then keeps the forward's warm split and no maps
    warm = (
        None
        if (keep is not None and keep_states) or (fused_states and not launch.bwd_warm_for(op))
        else warm_inputs(op, k, v, g, beta, warm_chunks, path=path, report=warm_report)
    )
    warm = with_chunk_bound(warm, index.num_chunks)  # the WY (or Ag) pass sums the bound's terms per chunk
    if fused_path:
        assert fused_fwd is not None
        fused = {"initial_state": initial_state, "output_final_state": output_final_state, "split_chunks": split_chunks}
        fused.update({"keep": keep} if keep_ag else {})
        if fused_states:
            fused["keep_states"] = True
        else:  # (the backward from Ag, `kernels.ops.gdn.ag_bwd`, too recomputes its chunk states from these)
            fused["seg_states"] = seg_states
        return fused_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch, warm=warm, **fused)
    bnd = warm.chunk_bound if warm is not None else None
    wy = wy_prep(q, k, v, g, beta, scale=scale, index=index, launch=launch, bnd=bnd)
    if keep is not None and not keep_ag:
        keep.update(wy.kept)
    state_pass = state_and_output if keep is None or not keep_states else partial(state_and_output_keep, keep=keep)
    extra = {} if state_pass is not state_and_output else {"warm": warm, "seg_states": seg_states}
    return state_pass(
        index=index,
        k=wy.k,
        w=wy.w,
        u=wy.u,
        g=wy.g,
        q=wy.q,
        aqk=wy.aqk,
        gate_vector=gate_vector,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        out_dtype=q.dtype,
        launch=launch,
        split_chunks=split_chunks,
        fuse_output=FUSE_OUTPUT if fuse_output is None else fuse_output,
        **extra,
    )
