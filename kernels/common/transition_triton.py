"""Segment transition `(M, S_ext)` per sequence on the Triton backend (GDN and KDA).

By linearity the state pass on the augmented state [K, K+V] from [I | 0] with right-hand side [0 | u]
ends at [M | S_ext] (`chunk_state_transition_fwd`, fp32 state). A long sequence (few sequences per device,
decided as for the forward) is cut into segments whose maps are computed in parallel and folded in order
by `seg_compose_fwd` (fp32, tf32x3 products), so the map of a 128K-token sequence is not one serial walk.

`need` (bool `[N]` on the device) masks sequences: the state pass and the fold of an unflagged sequence are
skipped inside the kernels (its programs walk no chunk) and its M and S_ext are zeros; the intra-chunk WY
prep skips the chunks of unflagged sequences too (their programs return at once), so the work is
proportional to the flagged tokens.
"""

from __future__ import annotations

from torch import Tensor

from kernels.common.chunk_state import SeqLayout, chunk_state_transition_fwd
from kernels.common.index import prepare_chunk_index
from kernels.common.seqsplit import resolve_split, seg_compose_fwd
from kernels.common.wy import BT_WY, wy_gdn_fwd, wy_kda_fwd
from kernels.configs import cdiv, head_block
from kernels.plan import LaunchPlan, default_plan

__all__ = ["chunk_transition_fwd"]


def chunk_transition_fwd(
    op: str,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    cu_seqlens: Tensor | None = None,
    plan: LaunchPlan | None = None,
    split_chunks: int | None = None,
    need: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(M `[N, H, K, K]`, S_ext `[N, H, K, V]`) fp32 with S_end = M S_start + S_ext per sequence and head.

    split_chunks: None = automatic, 0 = never split, n = segments of n chunks.
    need: bool `[N]` on the device, or None (all sequences): unflagged sequences are skipped and get zeros.
    plan: the launch plan (None: `kernels.plan.default_plan()`).
    """
    B, T, _, K = k.shape
    H, V = v.shape[2], v.shape[-1]
    launch = plan if plan is not None else default_plan()
    k, v, g, beta = (x.contiguous() for x in (k, v, g, beta))
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=BT_WY, device=k.device)
    if op == "gdn":
        w, u, gg, _ = wy_gdn_fwd(None, k, v, g, beta, scale=1.0, index=index, launch=launch,
                                     need=need)
        kk, gate_vector = k, False
    else:
        w, u, kk, gg, _, _ = wy_kda_fwd(None, k, v, g, beta, scale=1.0, index=index, launch=launch,
                                             need=need)
        gate_vector = True
    cfg = launch.configs.get("chunk_state_transition_fwd")
    bv = min(cfg.BV if cfg is not None and cfg.BV else 64, head_block(K), head_block(V))
    split = resolve_split(index, split_chunks, H=H, NV=cdiv(K + V, bv), device=k.device)
    if split is None:
        layout = SeqLayout(index.num_seqs, index.cu_seqlens if index.is_varlen else None,
                           index.chunk_offsets if index.is_varlen else None)
        return chunk_state_transition_fwd(kk, w, u, gg, layout=layout, BT=BT_WY, gate_vector=gate_vector, launch=launch,
                                          need=need)
    seg_need = None if need is None else need.index_select(0, split.seg_seq)
    M, S = chunk_state_transition_fwd(kk, w, u, gg, layout=split.all_segments, BT=BT_WY, gate_vector=gate_vector,
                                      launch=launch, need=seg_need)
    return seg_compose_fwd(M, S, split, launch=launch, need=need)
