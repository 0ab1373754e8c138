"""Kimi Delta Attention, chunked, with a gate per key dim: g `[B, T, HV, K]` (q, k `[B, T, H, K]`, v `[B, T, HV, V]`,
beta `[B, T, HV]`). Its forward is two kernels where the TileLang walk runs (`fused.py`: the Ag pass of `wy_ag.py`,
then the walk's gated build, `kernels.ops.gdn.fwd_walk`; `kernels.vocabulary.AUTO_FWD_PATH` "walk"), else the WY prep
and the shared state pass; the WY prep `wy_kda_fwd` (also where the plan keeps the WY factors, for the transition
primitive and the backward) is KDA's own pass: per-key gate cumsum, (I + A)^{-1}, w, u and the gated
tensors (kg, qg, Aqk, the chunk's last-row gate gc), so the shared passes never read the per-key gate again. The public
op is `chunk_kda` (FLA's `chunk_kda`); `KDA` is the op-table entry, `chunk_kda_fwd` / `chunk_kda_bwd` the Triton paths.
The layout of an op's file: `kernels/ops/__init__.py`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from kernels.dispatch import ChunkOp, public_op
from kernels.ops.kda.naive import naive_recurrent_kda
from kernels.plan import LaunchPlan

__all__ = ["KDA", "chunk_kda", "chunk_kda_bwd", "chunk_kda_fwd"]


def _wy_prep(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: Any, launch: LaunchPlan,
            bnd: Tensor | None = None) -> Any:
    """KDA's WY prep (`wy_kda_fwd`: per-key gate cumsum, (I + A)^{-1}, w, u, and the gated kg, qg, Aqk and per-chunk
    last-row gate gc): the state pass reads those, never the per-key gate again."""
    from kernels.common.chunk_fwd import WyPrep
    from kernels.common.wy import wy_kda_fwd

    w, u, kg, gc, qg, aqk = wy_kda_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch, bnd=bnd)
    assert qg is not None and aqk is not None
    kept = {"w": w, "u": u, "ks": kg, "gs": gc, "qs": qg, "aqk": aqk}
    return WyPrep(k=kg, q=qg, g=gc, w=w, u=u, aqk=aqk, kept=kept)


def _fused_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **options: Any) -> Any:
    """KDA's two-kernel forward (`kernels.ops.kda.fused.kda_fused_fwd`: the Ag pass `wy_kda_ag`, then the fused
    state+output pass), the default forward where the pass runs on the TileLang walk (`_fwd_walk`)."""
    from kernels.ops.kda.fused import kda_fused_fwd

    return kda_fused_fwd(q, k, v, g, beta, **options)


def _fwd_walk(k: Tensor, v: Tensor, chunk_size: int, launch: LaunchPlan) -> bool:
    """Whether KDA's two-kernel forward runs its state+output pass on the TileLang walk's gated build under the plan
    (`kernels.ops.gdn.fwd_walk.fwd_walk_wanted`): where it does, "auto" takes the two-kernel forward
    (`kernels.vocabulary.AUTO_FWD_PATH` "walk")."""
    from kernels.ops.gdn.fwd_walk import fwd_walk_wanted

    return fwd_walk_wanted(k, v, chunk_size, launch, gated=True)


def _ag_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, **options: Any) -> Any:
    """KDA's backward from the forward's kept gated Ag (keep "ag": `kernels.ops.kda.ag_bwd`)."""
    from kernels.ops.kda.ag_bwd import chunk_kda_bwd_ag

    return chunk_kda_bwd_ag(q, k, v, g, beta, do, **options)


KDA = ChunkOp("kda", gate_vector=True, naive=naive_recurrent_kda, wy_prep=_wy_prep, fused_fwd=_fused_fwd,
              ag_bwd=_ag_bwd, fwd_walk=_fwd_walk)
chunk_kda_fwd = KDA.triton_fwd  # the forward on Triton: the two-kernel path (fused.py), or the WY prep above and the shared state pass
chunk_kda_bwd = KDA.triton_bwd  # the backward on Triton: `kernels.common.chunk_bwd.chunk_bwd` for "kda"


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
