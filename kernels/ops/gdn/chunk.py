"""Gated DeltaNet (one scalar gate per head and token), chunked. Its forward is two kernels by default (`fused.py`: the
Ag pass of `wy_ag.py`, then one fused state+output pass); its WY prep (`wy_gdn_fwd`: the gate's in-chunk cumsum,
(I + A)^{-1}, w, u, Aqk, then the shared state pass on the raw q and k) runs where the plan keeps the WY factors and
for the transition primitive and the backward. `GDN` is its op-table entry,
`chunk_gdn_fwd` / `chunk_gdn_bwd` its Triton forward and backward, `chunk_gdn` the public op (FLA's
`chunk_gated_delta_rule`, differentiable). Inputs: q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g and beta `[B, T, HV]`.
How an op's file reads, and why the Triton modules load late: `kernels/ops/__init__.py`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from kernels.dispatch import ChunkOp, public_op
from kernels.ops.gdn.naive import naive_recurrent_gdn
from kernels.plan import LaunchPlan

__all__ = ["GDN", "chunk_gdn", "chunk_gdn_bwd", "chunk_gdn_fwd"]


def _wy_prep(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: Any, launch: LaunchPlan,
            bnd: Tensor | None = None) -> Any:
    """GDN's WY prep (`wy_gdn_fwd`: gate cumsum, (I + A)^{-1}, w, u, Aqk): the state pass reads the raw q, k and the
    fp32 gate cumsum."""
    from kernels.common.chunk_fwd import WyPrep
    from kernels.common.wy import wy_gdn_fwd

    w, u, gcum, aqk = wy_gdn_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch, bnd=bnd)
    assert aqk is not None
    return WyPrep(k=k, q=q, g=gcum, w=w, u=u, aqk=aqk, kept={"w": w, "u": u, "gs": gcum, "aqk": aqk})


def _fused_fwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **options: Any) -> Any:
    """GDN's two-kernel forward (`kernels.ops.gdn.fused.gdn_fused_fwd`: the Ag pass `wy_gdn_ag`, then the fused
    state+output pass), the default Triton forward (`kernels.common.chunk_fwd`'s fwd_path "auto")."""
    from kernels.ops.gdn.fused import gdn_fused_fwd

    return gdn_fused_fwd(q, k, v, g, beta, **options)


def _ag_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, **options: Any) -> Any:
    """GDN's backward from the forward's kept Ag and gate cumsum (keep "ag": `kernels.ops.gdn.ag_bwd`)."""
    from kernels.ops.gdn.ag_bwd import chunk_gdn_bwd_ag

    return chunk_gdn_bwd_ag(q, k, v, g, beta, do, **options)


GDN = ChunkOp("gdn", gate_vector=False, naive=naive_recurrent_gdn, wy_prep=_wy_prep, fused_fwd=_fused_fwd,
              ag_bwd=_ag_bwd)
chunk_gdn_fwd = GDN.triton_fwd  # the forward on Triton: the two-kernel path (fused.py), or the WY prep above and the shared state pass
chunk_gdn_bwd = GDN.triton_bwd  # the backward on Triton: `kernels.common.chunk_bwd.chunk_bwd` for "gdn"


chunk_gdn = public_op(GDN, r"""Gated DeltaNet, `S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`, `o_t = scale S_t^T q_t`, differentiable.

Args:
    q (torch.Tensor):
        queries of shape `[B, T, H, K]`, fp32/bf16/fp16 (fp64 on the reference and torch backends).
    k (torch.Tensor):
        keys of shape `[B, T, H, K]`, same dtype as q.
    v (torch.Tensor):
        values of shape `[B, T, HV, V]`; HV a multiple of H (grouped value heads: query/key head
        `h // (HV / H)` serves value head h, e.g. Qwen3-Next's H=16, HV=32).
    g (torch.Tensor):
        natural-log decay per head, `g <= 0`, of shape `[B, T, HV]`.
    beta (torch.Tensor):
        write strengths of shape `[B, T, HV]` (already post-sigmoid).
    scale (Optional[float]):
        output scale. Default: `None`, meaning `K ** -0.5`.
    initial_state (Optional[torch.Tensor]):
        state entering each sequence, `[N, HV, K, V]`, used in fp32; differentiable. Default: `None`.
    output_final_state (Optional[bool]):
        whether to return the final state `[N, HV, K, V]` fp32 (its incoming gradient is honoured). Default: `False`.
    cu_seqlens (Optional[torch.LongTensor]):
        int32/int64 `[N + 1]` bounds of a varlen batch (B must be 1). Default: `None`.
    backend (Optional[str]):
        `"reference"`, `"torch"`, `"triton"`, `"fla"` or `"auto"` (triton on CUDA, torch elsewhere). Default: `"auto"`.
    use_qk_l2norm_in_kernel (Optional[bool]):
        L2-normalise q and k per head over K inside the op (eps 1e-6, with its backward). Default: `False`.
    config (Optional[LaunchConfig | Mapping[str, LaunchConfig]]):
        Triton launch configs `{kernel name: LaunchConfig}` (triton backend only). Default: `None`.
    cu_seqlens_cpu (Optional[torch.Tensor | Sequence[int]]):
        host copy of `cu_seqlens` (spares the one device-to-host read of a new GPU `cu_seqlens`). Default: `None`.
    plan (Optional[LaunchPlan]):
        the launch plan (`kernels.plan`: configs, recompute policy, recorder; kept for the backward). Default:
        `None` (`kernels.default_plan()`).
    kwargs:
        FLA's other keyword arguments, by FLA's names (the table below).

FLA's keyword arguments (chunk_gated_delta_rule, FLA 0.6.0) and what chunk_gdn does with each; "refused" is a
one-line ValueError naming the argument, the value and why; the fla backend passes every accepted one to FLA:

    use_gate_in_kernel, A_log [HV], dt_bias [HV]   implemented: g is raw, g = -exp(A_log) * softplus(g + dt_bias)
                              (`kernels.common.gate.activate_gate`, fp32, differentiable: dg, dA_log, ddt_bias);
                              A_log required; A_log / dt_bias without use_gate_in_kernel refused (FLA ignores them)
    use_beta_sigmoid_in_kernel, allow_neg_eigval   implemented: beta = sigmoid(beta), times 2 with
                              allow_neg_eigval (which needs use_beta_sigmoid_in_kernel, FLA's rule)
    state_v_first (and its deprecated alias transpose_state_layout, with FLA's DeprecationWarning)
                              implemented: initial and final state `[N, HV, V, K]` (a transpose at the boundary)
    use_qk_l2norm_in_kernel   implemented (eps 1e-6, with its backward)
    cu_seqlens_cpu            implemented: the host bounds (no device read)
    chunk_indices             validated, then unused (our index is built from cu_seqlens): FLA's [NT, 2]
                              (sequence, chunk) pairs; shape always, values when a CPU tensor; refused without
                              cu_seqlens
    chunk_size                16, 32, 64 (FLA's) implemented on torch, triton (the WY prep's 16-row blocks stop at
                              the chunk's end) and fla; intermediate states at that size; other values refused
    cp_context                None only; our CP is kernels.cp (refused: use kernels.cp.forward)
    head_first                refused at any value (FLA raises for it too)
    chunk_kda's own options (safe_gate, lower_bound, disable_recompute, return_intermediate_states, use_graph,
                              max_num_seqs): accepted at their defaults (FLA's GDN ignores them), else refused
    any other name            refused (FLA would ignore a misspelt option)

Returns:
    o (torch.Tensor):
        outputs of shape `[B, T, HV, V]` in q's dtype.
    final_state (Optional[torch.Tensor]):
        fp32 `[N, HV, K, V]` (`[N, HV, V, K]` with state_v_first) if `output_final_state=True`, else `None`.

Raises:
    ValueError: a bad argument (shapes, dtypes, devices, cu_seqlens, initial_state, HV % H, an FLA option
        refused above), before any launch; in the backward, a `do` / `dht` of the wrong shape or dtype.

Examples::
    >>> import torch, torch.nn.functional as F
    >>> from kernels import chunk_gdn
    >>> B, T, H, HV, K, V = 1, 4096, 16, 32, 128, 128
    >>> q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    >>> k = torch.randn(B, T, H, K, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    >>> v = torch.randn(B, T, HV, V, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    >>> g = F.logsigmoid(torch.randn(B, T, HV, device="cuda")).requires_grad_()
    >>> beta = torch.rand(B, T, HV, dtype=torch.bfloat16, device="cuda").sigmoid().requires_grad_()
    >>> o, ht = chunk_gdn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    >>> (o.float().square().sum() + ht.sum()).backward()
    # variable-length sequences: B = 1 and the bounds
    >>> cu_seqlens = torch.tensor([0, 1000, 4096], dtype=torch.int32, device="cuda")
    >>> o, _ = chunk_gdn(q, k, v, g, beta, cu_seqlens=cu_seqlens)
""")
