"""The differentiable public ops `chunk_gdn` and `chunk_kda`: drop-in for FLA's `chunk_gated_delta_rule` / `chunk_kda`.

A training job switches with one import (`from kernels import chunk_gdn`). Each validates its inputs (a ValueError
naming the argument, before any launch), resolves the backend and runs: `reference` (autograd through the per-token
fp32 recurrence), `torch` / `triton` (the autograd Function of `kernels.autograd`: our chunked forward and
backward, recompute policy stated there), `fla` (FLA's own autograd op). FLA options we do not implement are
accepted only at their default values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from kernels.api import _check_config_names
from kernels.autograd import differentiable_forward
from kernels.backends import fla_forward, resolve_backend
from kernels.configs import LaunchConfig
from kernels.plan import LaunchPlan, plan_with
from kernels.validate import check_backend, check_config, check_inputs

__all__ = ["chunk_gdn", "chunk_kda"]

# FLA keyword arguments accepted at these values only (anything else is a ValueError naming the argument)
_FLA_DEFAULTS: dict[str, Any] = {
    "chunk_size": 64, "use_beta_sigmoid_in_kernel": False, "allow_neg_eigval": False, "state_v_first": False,
    "use_gate_in_kernel": False, "safe_gate": False, "lower_bound": None, "disable_recompute": False,
    "return_intermediate_states": False, "cp_context": None, "chunk_indices": None, "transpose_state_layout": False,
}


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
) -> tuple[Tensor, Tensor | None]:
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
            FLA's other options, accepted at their defaults only (`chunk_size=64`, `use_gate_in_kernel=False`, ...).

    Returns:
        o (torch.Tensor):
            outputs of shape `[B, T, HV, V]` in q's dtype.
        final_state (Optional[torch.Tensor]):
            fp32 `[N, HV, K, V]` if `output_final_state=True`, else `None`.

    Raises:
        ValueError: a bad argument (shapes, dtypes, devices, cu_seqlens, initial_state, HV % H, an FLA option we
            do not implement), before any launch; in the backward, a `do` / `dht` of the wrong shape or dtype.

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
) -> tuple[Tensor, Tensor | None]:
    r"""Kimi Delta Attention, `S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T`, differentiable.

    Arguments and returns as `chunk_gdn`, except the gate: g (torch.Tensor) is the natural-log decay per key dim,
    `g <= 0`, of shape `[B, T, HV, K]`. The Triton kernels need `g >= -5.5` per token (README); the torch backend
    has no such limit.

    Examples::
        >>> from kernels import chunk_kda
        >>> g = F.logsigmoid(torch.randn(B, T, HV, K, device="cuda")).clamp_min(-5).requires_grad_()
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
) -> tuple[Tensor, Tensor | None]:
    for name, value in fla_kwargs.items():
        if name not in _FLA_DEFAULTS:
            raise ValueError(f"chunk_{op} got an unexpected argument {name}={value!r}")
        default = _FLA_DEFAULTS[name]
        if not (value is default or (type(value) is type(default) and value == default)):
            raise ValueError(f"{name}={value!r} is not supported by cpbench's chunk_{op} "
                             f"(only the default {name}={default!r})")
    if not isinstance(use_qk_l2norm_in_kernel, bool):
        raise ValueError(f"use_qk_l2norm_in_kernel must be a bool, got {use_qk_l2norm_in_kernel!r}")
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    bounds = check_inputs(op, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, grouped=True)
    configs = check_config(config)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    if be == "fla":
        return fla_forward(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=bounds,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if be == "triton":
        _check_config_names(configs)
    return differentiable_forward(op, be, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                  cu_seqlens_cpu=cu_seqlens_cpu, bounds=bounds, plan=plan_with(plan, configs),
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
