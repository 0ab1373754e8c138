"""Gated DeltaNet forward on the Triton backend: the launchers in order, nothing else.

    wy_gdn_fwd            per (chunk, head): gate cumsum, (I + A)^{-1}, w, u, Aqk     kernels.common.wy
    state_and_output      serial state pass (split across SMs for few long sequences)
                          with the output fused in, or followed by the output pass    kernels.common.seqsplit

Inputs in FLA's layout (DESIGN.md §1): q, k `[B, T, H, K]`, v `[B, T, H, V]`, g and beta `[B, T, H]`, varlen
via `cu_seqlens` with B == 1. Validation happens in `kernels.api` before this is called.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from kernels.common.index import prepare_chunk_index
from kernels.common.seqsplit import state_and_output
from kernels.common.state_keep import state_and_output_keep
from kernels.common.wy import BT_WY, wy_gdn_fwd
from kernels.plan import LaunchPlan, default_plan

__all__ = ["FUSE_OUTPUT", "chunk_gdn_fwd"]

# the output fused into the state pass (no per-chunk states in memory); measured faster, see kernels.bench
FUSE_OUTPUT = True


def chunk_gdn_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    plan: LaunchPlan | None = None,
    split_chunks: int | None = None,
    fuse_output: bool | None = None,
    keep: dict[str, Tensor] | None = None,
    keep_states: bool = False,
    chunk_size: int = BT_WY,
) -> tuple[Tensor, Tensor | None]:
    """GDN chunked forward: (o `[B, T, H, V]` in q's dtype, final state `[N, H, K, V]` fp32 or None).

    plan: the launch plan (`kernels.plan`; None: `default_plan()`). split_chunks: None = automatic sequence
    splitting,
    0 = never, n = segments of n chunks. fuse_output: None = FUSE_OUTPUT. keep: a dict that receives the WY
    factors the backward would recompute (`kernels.common.chunk_bwd.chunk_bwd(wy=...)`); keep_states: and the chunk
    states, new values and segment maps (`kernels.common.state_keep`). chunk_size: the tokens per chunk, one of
    `kernels.common.wy.CHUNK_SIZES` (FLA's `chunk_size`; the backward must use the same).
    """
    B, T, H, _ = k.shape
    launch = plan if plan is not None else default_plan()
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    w, u, gcum, aqk = wy_gdn_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
    assert aqk is not None
    if keep is not None:
        keep.update(w=w, u=u, gs=gcum, aqk=aqk)
    state_pass = state_and_output if keep is None or not keep_states else partial(state_and_output_keep, keep=keep)
    return state_pass(
        index=index, k=k, w=w, u=u, g=gcum, q=q, aqk=aqk, gate_vector=False, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state, out_dtype=q.dtype, launch=launch,
        split_chunks=split_chunks, fuse_output=FUSE_OUTPUT if fuse_output is None else fuse_output,
    )
