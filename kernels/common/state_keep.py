"""The forward's state pass + output that also keeps what the backward's state recompute would produce.

Used by the recompute policy "wy+states" (`LaunchPlan.keep`, kernels.dispatch; "ag+states" keeps the same names from
GDN's fused pass, `kernels.ops.gdn.fused.fused_state_output_keep`): the same launches as
`kernels.common.seqsplit.state_and_output` (same kernels, same configs, same split), except that

    - the transition pass covers every segment, the last ones too (the backward's reverse chain needs their maps;
      the forward chain reads the non-last ones), and
    - the state pass also stores the chunk states h and the new values v_new.

It lives apart from `seqsplit` and `chunk_state` so that those modules' source (which keys the tuned configs of
their kernels in a shipped autotune file) stays as tuned; it launches their kernels through their launchers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.chunk_output import chunk_output_fwd
from kernels.common.chunk_state import (
    CHUNK_STATE_OUTPUT_FWD,
    _key,
    _launch,
    chunk_state_fwd,
    chunk_state_transition_fwd,
)
from kernels.common.index import ChunkIndex
from kernels.common.seqsplit import seg_chain_fwd, split_of, whole_sequences
from kernels.configs import head_block
from kernels.plan import LaunchPlan

__all__ = ["KEPT_STATES", "state_and_output_keep"]

# the kept states' names (`chunk_bwd(wy=...)` reads them when "h" is there): h, v_new, M (split runs only), split
KEPT_STATES: tuple[str, ...] = ("h", "v_new", "M", "split")


def state_and_output_keep(
    *, index: ChunkIndex, k: Tensor, w: Tensor, u: Tensor, g: Tensor, q: Tensor, aqk: Tensor, gate_vector: bool,
    scale: float, initial_state: Tensor | None, output_final_state: bool, out_dtype: torch.dtype,
    launch: LaunchPlan, split_chunks: int | None, fuse_output: bool, keep: dict[str, Tensor],
) -> tuple[Tensor, Tensor | None]:
    """`state_and_output` (same arguments and result) that fills `keep` with the chunk states `h` [NT, H, K, V] and
    new values `v_new` (k's dtype), the maps `M` of every segment [NS, H, K, K] fp32 (split runs) and `split`, the
    segment length in chunks (0: not split) as a CPU int64 scalar, so that the backward (`chunk_bwd(wy=keep)`)
    rebuilds the same plan without reading the device."""
    H, K = u.shape[2], k.shape[3]
    V = u.shape[-1]
    BT = index.chunk_size
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    plan = split_of(index, k, u, launch=launch, gate_vector=gate_vector, split_chunks=split_chunks, fuse_output=fuse_output)
    if plan is None:
        layout, h0_run, num_states = whole_sequences(index), h0, None
    else:
        M, S_ext = chunk_state_transition_fwd(k, w, u, g, layout=plan.all_segments, BT=BT, gate_vector=gate_vector,
                                              launch=launch)
        nonlast = plan.transitions.seq_map
        assert nonlast is not None
        h0_run = seg_chain_fwd(M.index_select(0, nonlast), S_ext.index_select(0, nonlast), h0, plan, launch=launch)
        layout, num_states = plan.final, index.num_seqs
        keep["M"] = M
    keep["split"] = torch.tensor(plan.seg_chunks if plan is not None else 0, dtype=torch.int64)
    if not fuse_output:
        h, v_new, ht = chunk_state_fwd(k, w, u, g, layout=layout, num_chunks=index.num_chunks, BT=BT,
                                       gate_vector=gate_vector, h0=h0_run, output_final_state=output_final_state,
                                       num_states=num_states, launch=launch)
        keep.update(h=h, v_new=v_new)
        o = chunk_output_fwd(q, v_new, h, None if gate_vector else g, aqk, index=index, scale=scale,
                             gate_vector=gate_vector, out_dtype=out_dtype, launch=launch)
        return o, ht
    # the fused pass of `chunk_state_output_fwd`, with the state and new-value stores switched on
    cfg = launch.config_for(CHUNK_STATE_OUTPUT_FWD, _key(H, K, V, BT, gate_vector, layout, k.dtype),
                            bv_limit=head_block(V))
    h, v_new = k.new_empty(index.num_chunks, H, K, V), torch.empty_like(u)
    keep.update(h=h, v_new=v_new)
    o = torch.empty(u.shape, dtype=out_dtype, device=u.device)
    ht = k.new_empty(num_states or layout.num_seqs, H, K, V, dtype=torch.float32) if output_final_state else None
    _launch(cfg, V, layout, H, k=k, w=w, u=u, g=g, BT=BT, gate_vector=gate_vector, q=q, aqk=aqk, h0=h0_run, ht=ht, o=o,
            h=h, v_new=v_new, scale=scale)
    return o, ht
