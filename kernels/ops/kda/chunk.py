"""Kimi Delta Attention (gate per key dim), chunked: read top to bottom, the Triton forward, the Triton backward, the op-table entry `KDA`
and the public op `chunk_kda` (FLA's `chunk_kda`, differentiable).

    chunk_kda_fwd     WY prep per (chunk, head): per-key gate cumsum, (I + A)^{-1}, w, u, kg, qg, Aqk   kernels.common.wy
                      then the state pass with the output                              kernels.common.chunk_fwd
    chunk_kda_bwd     recompute, reverse state pass, gradients (op "kda")             kernels.common.chunk_bwd
    KDA             the op's entry of the dispatch table (`kernels.api.OPS`): reference, Triton forward and backward
    chunk_kda          the public op: FLA's signature (`kernels.dispatch.public_op`, one signature for both ops), then
                      `kernels.dispatch.run` (validate -> backend -> op table); its autograd Function is
                      `kernels.dispatch.ChunkFunction`, one class for both ops

Inputs in FLA's layout (DESIGN.md §1): q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g `[B, T, HV, K]`, beta `[B, T, HV]`, varlen via `cu_seqlens` with
B == 1. The Triton modules load on the first Triton call, so the torch and reference backends run without Triton.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from kernels.dispatch import ChunkOp, import_triton, public_op
from kernels.ops.kda.naive import naive_recurrent_kda
from kernels.plan import LaunchPlan

__all__ = ["KDA", "chunk_kda", "chunk_kda_bwd", "chunk_kda_fwd"]


def chunk_kda_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float,
                  **options: Any) -> tuple[Tensor, Tensor | None]:
    """KDA forward on the Triton backend: (o `[B, T, H, V]` in q's dtype, final state `[N, H, K, V]` fp32 or None).
    options: those of `kernels.common.chunk_fwd.chunk_fwd` (initial_state, output_final_state, cu_seqlens, plan,
    split_chunks, fuse_output, keep, keep_states, chunk_size)."""
    chunk_fwd = import_triton("kernels.common.chunk_fwd", "chunk_fwd")
    return chunk_fwd(_wy_prep, q, k, v, g, beta, gate_vector=True, scale=scale, **options)


def _wy_prep(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: Any, launch: LaunchPlan) -> Any:
    """KDA's WY prep (`wy_kda_fwd`: per-key gate cumsum, (I + A)^{-1}, w, u, and the gated kg, qg, Aqk and per-chunk
    last-row gate gc): the state pass reads those, never the per-key gate again."""
    from kernels.common.chunk_fwd import WyPrep
    from kernels.common.wy import wy_kda_fwd

    w, u, kg, gc, qg, aqk = wy_kda_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
    assert qg is not None and aqk is not None
    return WyPrep(k=kg, q=qg, g=gc, w=w, u=u, aqk=aqk, kept=dict(w=w, u=u, ks=kg, gs=gc, qs=qg, aqk=aqk))


def chunk_kda_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor,
                  **options: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, dg, dbeta, dh0) on the Triton backend: `kernels.common.chunk_bwd.chunk_bwd` for op "kda" (its
    launch sequence and options: scale, initial_state, dht, cu_seqlens, plan, wy, split_chunks, chunk_size)."""
    return import_triton("kernels.common.chunk_bwd", "chunk_bwd")("kda", q, k, v, g, beta, do, **options)


KDA = ChunkOp("kda", gate_vector=True, naive=naive_recurrent_kda, triton_fwd=chunk_kda_fwd, triton_bwd=chunk_kda_bwd)


chunk_kda = public_op(KDA, r"""Kimi Delta Attention, `S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T`, differentiable.

Arguments and returns as `chunk_gdn`, except the gate: g (torch.Tensor) is the natural-log decay per key dim,
`g <= 0`, of shape `[B, T, HV, K]`. Any `g <= 0` works on every backend, forward and backward, -1000 and -inf
masks included (the chunked backends floor g at -112, `kernels/common/decay.py`; a floored gate's gradient is 0).

FLA's keyword arguments (chunk_kda, FLA 0.6.0) and what chunk_kda does with each (as chunk_gdn's table for
use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first / transpose_state_layout, use_qk_l2norm_in_kernel,
cu_seqlens_cpu, chunk_indices, cp_context; the fla backend passes every accepted one to FLA):

    use_gate_in_kernel, A_log [HV], dt_bias [HV * K]   implemented: g is raw, g = -exp(A_log) * softplus(g +
                              dt_bias.view(HV, K)); with lower_bound set: lower_bound * sigmoid(exp(A_log) * (g +
                              dt_bias)), or lower_bound * sigmoid(g + dt_bias) with A_log None (FLA applies
                              lower_bound whenever given); differentiable: dg, dA_log, ddt_bias
    safe_gate, lower_bound    implemented: with use_gate_in_kernel, lower_bound required in [-5, 0) (FLA's rule);
                              with a precomputed gate, safe_gate promises g >= lower_bound (checked on CPU tensors,
                              never on CUDA; exact for any gate here: no fast path depends on it); lower_bound
                              finite <= 0, refused when neither gate reads it
    disable_recompute         implemented: the triton backend keeps WY factors and chunk states for the backward
                              (the plan's keep "wy+states", `kernels.plan`); torch and reference recompute anyway
    return_intermediate_states   implemented on torch, triton and fla: returns (o, final_state, h), h the state
                              entering each chunk (of chunk_size), `[B, NT, HV, K, V]` in k's dtype (varlen: B = 1, NT the
                              chunks of all sequences; `[..., V, K]` with state_v_first); FLA's rules: only under
                              torch.inference_mode() and not with disable_recompute, else refused; refused on the
                              reference backend
    chunk_size                32, 64 (FLA's) implemented on torch, triton and fla
    use_graph                 False only (our varlen index is built on the host: not CUDA-graph capturable)
    max_num_seqs              None or a positive int, unused (FLA reads it only with use_graph)

Examples::
    >>> from kernels import chunk_kda
    >>> g = F.logsigmoid(torch.randn(B, T, HV, K, device="cuda")).requires_grad_()
    >>> o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
""")
