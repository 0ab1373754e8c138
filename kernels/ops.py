"""The differentiable public ops `chunk_gdn` and `chunk_kda`: drop-in for FLA's `chunk_gated_delta_rule` / `chunk_kda`.

A training job switches with one import (`from kernels import chunk_gdn`). Each validates its inputs (a ValueError
naming the argument, before any launch), resolves the backend and runs: `reference` (autograd through the per-token
fp32 recurrence), `torch` / `triton` (the autograd Function of `kernels.autograd`: our chunked forward and
backward, recompute policy stated there), `fla` (FLA's own autograd op, every option passed on). Every keyword
argument of FLA 0.6.0's two functions is accepted at FLA's default, and at its other values implemented or refused
with a one-line ValueError (the tables in `chunk_gdn`'s and `chunk_kda`'s docstrings; checks in `kernels.fla_args`).
With grad off (`torch.no_grad()`, `torch.inference_mode()`) the forward runs without autograd and saves nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.api import _check_config_names
from kernels.autograd import differentiable_forward
from kernels.backends import fla_forward, resolve_backend
from kernels.common.gate import activate_beta, activate_gate
from kernels.configs import LaunchConfig
from kernels.fla_args import check_fla_backend, check_fla_tensors, parse_fla_args
from kernels.plan import LaunchPlan, plan_with
from kernels.validate import check_backend, check_config, check_inputs
from kernels.vocabulary import KEEP_POLICIES

__all__ = ["chunk_gdn", "chunk_kda"]

def chunk_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    backend: str = "auto",
    use_qk_l2norm_in_kernel: bool = False,
    config: LaunchConfig | Mapping[str, LaunchConfig] | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    plan: LaunchPlan | None = None,
    **kwargs: Any,
) -> tuple[Any, ...]:
    r"""Gated DeltaNet, `S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`, `o_t = scale S_t^T q_t`, differentiable.

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
    """
    return _chunk("gdn", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config, cu_seqlens_cpu=cu_seqlens_cpu,
                  plan=plan, fla_kwargs=kwargs)


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    backend: str = "auto",
    use_qk_l2norm_in_kernel: bool = False,
    config: LaunchConfig | Mapping[str, LaunchConfig] | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    plan: LaunchPlan | None = None,
    **kwargs: Any,
) -> tuple[Any, ...]:
    r"""Kimi Delta Attention, `S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T`, differentiable.

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
    """
    return _chunk("kda", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend,
                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config, cu_seqlens_cpu=cu_seqlens_cpu,
                  plan=plan, fla_kwargs=kwargs)


def _chunk(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None,
    initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None, backend: str,
    use_qk_l2norm_in_kernel: bool, config: Any, cu_seqlens_cpu: Tensor | Sequence[int] | None,
    plan: LaunchPlan | None, fla_kwargs: Mapping[str, Any],
) -> tuple[Any, ...]:
    args = parse_fla_args(op, fla_kwargs)
    if not isinstance(use_qk_l2norm_in_kernel, bool):
        raise ValueError(f"use_qk_l2norm_in_kernel must be a bool, got {use_qk_l2norm_in_kernel!r}")
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    check_fla_backend(op, args, be)
    bounds = check_inputs(op, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, grouped=True,
                          raw_gate=args.use_gate_in_kernel, gate_bound=args.gate_bound,
                          state_v_first=args.state_v_first)
    check_fla_tensors(op, args, k=k, v=v, bounds=bounds)
    configs = check_config(config)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    states: list[Tensor] | None = [] if args.return_intermediate_states else None
    if be == "fla":
        o, ht = fla_forward(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=bounds,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, options=args.given, states=states)
        return (o, ht) if states is None else (o, ht, states[0])
    if be == "triton":
        _check_config_names(configs)
    launch = plan_with(plan, configs)
    if args.disable_recompute:  # FLA keeps every intermediate for the backward: our "wy+states" policy
        launch = launch.replace(keep=KEEP_POLICIES[-1])
    if args.use_gate_in_kernel:  # differentiable: the op sees the activated gate with its graph
        g = activate_gate(op, g, A_log=args.A_log, dt_bias=args.dt_bias, lower_bound=args.lower_bound)
    if args.use_beta_sigmoid_in_kernel:
        beta = activate_beta(beta, allow_neg_eigval=args.allow_neg_eigval)
    if args.state_v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2)
    o, ht = differentiable_forward(op, be, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                   cu_seqlens_cpu=cu_seqlens_cpu, bounds=bounds, plan=launch,
                                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, states=states,
                                   chunk_size=args.chunk_size)
    if args.state_v_first and ht is not None:
        ht = ht.transpose(-1, -2).contiguous()
    if states is None:
        return o, ht
    return o, ht, _intermediate_states(states[0], batch=k.shape[0], dtype=k.dtype, v_first=args.state_v_first)


def _intermediate_states(h: Tensor, *, batch: int, dtype: torch.dtype, v_first: bool) -> Tensor:
    """FLA's layout of the chunk states: `[B, NT, HV, K, V]` (varlen: B = 1, NT all chunks), k's dtype; `[.., V, K]`
    with state_v_first."""
    h = h.reshape(batch, h.shape[0] // batch, *h.shape[1:]).to(dtype)
    return h.transpose(-1, -2).contiguous() if v_first else h
