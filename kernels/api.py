"""Public entries of the kernel suite: validate -> resolve the backend -> run the op's path.

`forward` (chunked forward with optional initial/final state, varlen), `transition` (a segment's affine
state map (M, S_ext)), `reference` (the per-token fp32 ground truth), and `compose`/`chain` to fold maps.
Shapes and conventions are DESIGN.md §1 (FLA layout). Triton modules are imported only when the triton
backend is asked for, so the torch path works on machines without Triton.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.autograd import _import_triton, _per_key_gate, differentiable_forward, needs_grad
from kernels.backends import fla_forward, resolve_backend
from kernels.common.chunk_torch import chunk_fwd_torch
from kernels.common.index import prepare_chunk_index
from kernels.common.naive import naive_recurrent_kda
from kernels.common.transition import chain, chunk_transition_torch, compose, mask_maps, naive_transition
from kernels.configs import KERNELS, LaunchConfig
from kernels.gdn.naive import naive_recurrent_gdn
from kernels.plan import LaunchPlan, plan_with
from kernels.validate import check_backend, check_config, check_inputs

__all__ = ["chain", "compose", "forward", "reference", "transition"]

logger = logging.getLogger(__name__)

ConfigArg = LaunchConfig | Mapping[str, LaunchConfig] | None


def forward(
    op: str,
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
    config: ConfigArg = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    plan: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor | None]:
    r"""Chunked forward of a gated delta rule, `S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T`, `o_t = scale S_t^T q_t`.

    Args:
        op (str):
            `"gdn"` (Gated DeltaNet, scalar gate per head) or `"kda"` (Kimi Delta Attention, gate per key dim).
        q (torch.Tensor):
            queries of shape `[B, T, H, K]`, fp32/bf16/fp16.
        k (torch.Tensor):
            keys of shape `[B, T, H, K]`, same dtype as q (L2-normalised per head, as FLA's callers do).
        v (torch.Tensor):
            values of shape `[B, T, HV, V]`, same dtype as q. HV = H, or a multiple of H (grouped value heads:
            query/key head `h // (HV / H)` serves value head h; then g, beta and the state have HV heads).
        g (torch.Tensor):
            natural-log decay, `g <= 0`: `[B, T, HV]` for gdn, `[B, T, HV, K]` for kda.
        beta (torch.Tensor):
            write strengths of shape `[B, T, HV]` (already post-sigmoid).
        scale (Optional[float]):
            output scale. Default: `None`, meaning `K ** -0.5`.
        initial_state (Optional[torch.Tensor]):
            state entering each sequence, `[N, HV, K, V]` (N = B, or the number of sequences in `cu_seqlens`);
            used in fp32. Default: `None` (zeros).
        output_final_state (Optional[bool]):
            whether to return the final state `[N, HV, K, V]` in fp32. Default: `False`.
        cu_seqlens (Optional[torch.LongTensor]):
            int32/int64 `[N + 1]` cumulative sequence lengths of a varlen batch (FLA convention); then B must be 1.
            Its values are read on the host once per tensor (cached by identity). Default: `None`.
        backend (Optional[str]):
            `"reference"` (per-token fp32), `"torch"` (chunked, any device), `"triton"` (our kernels), `"fla"`
            (flash-linear-attention, when installed) or `"auto"` (triton on CUDA, torch elsewhere). Default: `"auto"`.
        config (Optional[LaunchConfig | Mapping[str, LaunchConfig]]):
            Triton launch configs: one `LaunchConfig` (for the chunk-state kernel) or `{kernel name: LaunchConfig}`.
            Only the triton backend uses it; merged on top of the plan's configs. Default: `None`.
        cu_seqlens_cpu (Optional[torch.Tensor | Sequence[int]]):
            host copy of `cu_seqlens`; pass it with a GPU `cu_seqlens` that changes every step to avoid any
            device-to-host sync. Default: `None`.
        plan (Optional[LaunchPlan]):
            the launch plan of the call (`kernels.plan`): explicit and tuned configs of the Triton kernels, the
            recompute policy of a training step (kept for its backward), a recorder of what launched. Default:
            `None`, meaning `kernels.default_plan()` (`use_autotune` / `CPBENCH_AUTOTUNE`).

    Differentiable: with inputs that require grad (and grad enabled) the call runs through the autograd Function of
    `kernels.autograd` (gradients for q, k, v, g, beta, initial_state; the final state's gradient is honoured), as
    `kernels.chunk_gdn` / `kernels.chunk_kda` do; the fla backend uses FLA's own autograd op.

    Returns:
        o (torch.Tensor):
            outputs of shape `[B, T, HV, V]` in q's dtype.
        final_state (Optional[torch.Tensor]):
            fp32 `[N, HV, K, V]` if `output_final_state=True`, else `None`.

    Raises:
        ValueError: bad op/backend/config, shapes, dtypes, devices, cu_seqlens, initial_state, a positive gate
            (checked on CPU tensors), or head dims the triton kernels do not handle. Raised before any launch.
        ImportError: backend `"fla"` without flash-linear-attention, or `"triton"` without Triton.

    Examples::
        >>> import torch, torch.nn.functional as F
        >>> import kernels
        >>> B, T, H, K, V = 4, 2048, 4, 128, 128
        >>> q = torch.randn(B, T, H, K, dtype=torch.bfloat16, device="cuda")
        >>> k = F.normalize(torch.randn(B, T, H, K, device="cuda"), p=2, dim=-1).bfloat16()
        >>> v = torch.randn(B, T, H, V, dtype=torch.bfloat16, device="cuda")
        >>> g = F.logsigmoid(torch.randn(B, T, H, device="cuda"))            # gdn gate; [B, T, H, K] for kda
        >>> beta = torch.rand(B, T, H, device="cuda").sigmoid()
        >>> h0 = torch.randn(B, H, K, V, device="cuda")
        >>> o, ht = kernels.forward("gdn", q, k, v, g, beta, initial_state=h0, output_final_state=True)
        # for variable-length inputs, flatten the batch into one sequence and give the bounds
        >>> q, k, v, g, beta = (x.flatten(0, 1).unsqueeze(0) for x in (q, k, v, g, beta))
        >>> cu_seqlens = q.new_tensor([0, 2048, 4096, 6144, 8192], dtype=torch.int32)
        >>> o_var, ht_var = kernels.forward("gdn", q, k, v, g, beta, initial_state=h0, output_final_state=True,
        ...                                 cu_seqlens=cu_seqlens)
        >>> assert torch.allclose(o.flatten(0, 1), o_var[0], atol=1e-2)
    """
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    bounds = check_inputs(op, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, grouped=True)
    configs = check_config(config)
    B, T, H, K = k.shape
    scale = K**-0.5 if scale is None else float(scale)
    if be != "fla" and (v.shape[2] != H or needs_grad(q, k, v, g, beta, initial_state)):
        # grouped value heads or a training step: the differentiable op (kernels.autograd)
        if be == "triton":
            _check_config_names(configs)
        return differentiable_forward(op, be, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                      cu_seqlens_cpu=cu_seqlens_cpu, bounds=bounds, plan=plan_with(plan, configs))
    if be == "reference":
        return _naive(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, bounds=bounds)
    if be == "torch":
        index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, device=k.device, cu_seqlens_cpu=cu_seqlens_cpu)
        return chunk_fwd_torch(q, k, v, _per_key_gate(op, g), beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, index=index)
    if be == "fla":
        return fla_forward(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=bounds)
    if op == "gdn":
        fwd = _import_triton("kernels.gdn.chunk", "chunk_gdn_fwd")
    else:
        fwd = _import_triton("kernels.kda.chunk", "chunk_kda_fwd")
    _check_config_names(configs)
    return fwd(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
               cu_seqlens=cu_seqlens, plan=plan_with(plan, configs))


def transition(
    op: str,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    cu_seqlens: Tensor | None = None,
    backend: str = "auto",
    config: ConfigArg = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    need: Tensor | None = None,
    plan: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The affine state map of each sequence: `S_end = M @ S_start + S_ext` (per sequence and head).

    `M` acts on the key dim of the state: `S_end[n, h] = M[n, h] @ S_start[n, h] + S_ext[n, h]`, and `S_ext`
    is the state reached from `S_start = 0`. Both are accumulated and returned in fp32.

    Args:
        op (str):
            `"gdn"` or `"kda"`.
        k (torch.Tensor):
            keys of shape `[B, T, H, K]`.
        v (torch.Tensor):
            values of shape `[B, T, H, V]`, same dtype as k.
        g (torch.Tensor):
            natural-log decay, `g <= 0`: `[B, T, H]` for gdn, `[B, T, H, K]` for kda.
        beta (torch.Tensor):
            write strengths of shape `[B, T, H]`.
        cu_seqlens (Optional[torch.LongTensor]):
            int32/int64 `[N + 1]` bounds of a varlen batch (B must be 1). Default: `None` (N = B).
        backend (Optional[str]):
            `"reference"`, `"torch"`, `"triton"` or `"auto"`; `"fla"` has no transition primitive (ValueError).
            Default: `"auto"`.
        config (Optional[LaunchConfig | Mapping[str, LaunchConfig]]):
            Triton launch configs, as in `forward`. Default: `None`.
        cu_seqlens_cpu (Optional[torch.Tensor | Sequence[int]]):
            host copy of `cu_seqlens`. Default: `None`.
        need (Optional[torch.Tensor]):
            bool `[N]` on k's device: which sequences' maps are wanted; the others come back as zeros (M = 0,
            S_ext = 0). Decided on the device, never read on the host. On the triton backend the serial state
            pass of an unflagged sequence is skipped inside the kernel (the saving); the torch and reference
            backends compute every sequence and mask. Default: `None` (all).
        plan (Optional[LaunchPlan]):
            the launch plan, as in `forward`. Default: `None` (`kernels.default_plan()`).

    Returns:
        M (torch.Tensor):
            fp32 `[N, H, K, K]`.
        S_ext (torch.Tensor):
            fp32 `[N, H, K, V]`.

    Examples::
        >>> M, S_ext = kernels.transition("kda", k, v, g, beta, cu_seqlens=cu_seqlens)
        >>> S_end = M @ S0 + S_ext           # == kernels.forward(..., initial_state=S0, output_final_state=True)[1]
        # fold the maps of consecutive segments (e.g. CP ranks) of one sequence, in order
        >>> S = kernels.chain(M_per_rank[:, 0], S_ext_per_rank[:, 0])   # [H, K, V]
    """
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    if be == "fla":
        raise ValueError("backend='fla' has no transition primitive (FLA exposes only its CP pre-process); "
                         "use backend='triton', 'torch' or 'reference'")
    bounds = check_inputs(op, None, k, v, g, beta, backend=be, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    configs = check_config(config)
    B, T = k.shape[:2]
    _check_need(need, len(bounds) - 1 if bounds is not None else B, k)
    if be == "reference":
        return mask_maps(*naive_transition(k, v, _per_key_gate(op, g), beta, cu_seqlens_cpu=bounds), need)
    if be == "torch":
        index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, device=k.device, cu_seqlens_cpu=cu_seqlens_cpu)
        return mask_maps(*chunk_transition_torch(k, v, _per_key_gate(op, g), beta, index=index), need)
    fwd = _import_triton("kernels.common.transition_triton", "chunk_transition_fwd")
    _check_config_names(configs)
    return fwd(op, k, v, g, beta, cu_seqlens=cu_seqlens, plan=plan_with(plan, configs), need=need)


def reference(
    op: str,
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
) -> tuple[Tensor, Tensor | None]:
    r"""The per-token fp32 recurrence (ground truth; slow: a Python loop over tokens).

    Same arguments, shapes and returns as `forward` (without `backend`/`config`; grouped value heads too); computes
    in fp32 (fp64 for fp64 inputs) and returns o in q's dtype and the final state in fp32. Differentiable by autograd.

    Examples::
        >>> o_ref, ht_ref = kernels.reference("kda", q, k, v, g, beta, cu_seqlens=cu_seqlens, output_final_state=True)
    """
    bounds = check_inputs(op, q, k, v, g, beta, backend="reference", scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, grouped=True)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    group = v.shape[2] // k.shape[2]
    if group > 1:  # grouped value heads: q/k head h // group serves value head h
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    return _naive(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                  output_final_state=output_final_state, bounds=bounds)


def _naive(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float,
           initial_state: Tensor | None, output_final_state: bool, bounds: list[int] | None) -> tuple[Tensor, Tensor | None]:
    fn = naive_recurrent_gdn if op == "gdn" else naive_recurrent_kda
    return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
              cu_seqlens_cpu=bounds)


def _check_need(need: Any, N: int, k: Tensor) -> None:
    """Metadata checks of a sequence mask (shape, dtype, device; its values are never read)."""
    if need is None:
        return
    if not isinstance(need, Tensor) or need.dtype != torch.bool or tuple(need.shape) != (N,):
        got = f"{need.dtype} {tuple(need.shape)}" if isinstance(need, Tensor) else type(need).__name__
        raise ValueError(f"need must be a bool tensor of shape [{N}] (one flag per sequence), got need={got}")
    if need.device != k.device:
        raise ValueError(f"need is on {need.device} but k is on {k.device}")


def _check_config_names(configs: Mapping[str, LaunchConfig]) -> None:
    unknown = sorted(set(configs) - set(KERNELS))
    if unknown and KERNELS:
        raise ValueError(f"config names unknown kernel(s) {unknown}; registered kernels: {sorted(KERNELS)}")

