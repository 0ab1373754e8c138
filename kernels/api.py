"""Public entries of the kernel suite by op name, and the op table `OPS` they dispatch through (`kernels.dispatch`).

`forward` (chunked forward with optional initial/final state, varlen), `transition` (a segment's affine
state map (M, S_ext)), `reference` (the per-token fp32 ground truth), `chunk_backward` / `chunk_state_gradient` (the
gradients without autograd), and `compose`/`chain` to fold maps. `forward` and `reference` are `kernels.dispatch.run`
on the op's entry (`kernels/ops/<op>/chunk.py`), like `kernels.chunk_gdn` / `kernels.chunk_kda`.
Shapes and conventions are DESIGN.md §1 (FLA layout). Triton modules are imported only when the triton
backend is asked for, so the torch path works on machines without Triton.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.backends import resolve_backend
from kernels.common.chunk_bwd_torch import chunk_bwd_torch
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.transition import chain, chunk_transition_torch, compose, mask_maps
from kernels.configs import LaunchConfig
from kernels.dispatch import ChunkOp, check_config_names, chunk_backward_impl, import_triton, run
from kernels.ops.gdn.chunk import GDN
from kernels.ops.kda.chunk import KDA
from kernels.ops.kda.naive import naive_transition
from kernels.plan import LaunchPlan, default_plan, plan_with
from kernels.validate import check_backend, check_config, check_grad_outputs, check_inputs, check_op

__all__ = ["OPS", "chain", "chunk_backward", "chunk_state_gradient", "compose", "forward", "reference", "transition"]

logger = logging.getLogger(__name__)

ConfigArg = LaunchConfig | Mapping[str, LaunchConfig] | None
OPS: Mapping[str, ChunkOp] = {"gdn": GDN, "kda": KDA}  # the op table: name -> its entry


def forward(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, cu_seqlens: Tensor | None = None,
    backend: str = "auto", config: ConfigArg = None, cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
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
    `kernels.dispatch` (gradients for q, k, v, g, beta, initial_state; the final state's gradient is honoured), as
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
    o, ht = run(_op(op), q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend, config=config,
                cu_seqlens_cpu=cu_seqlens_cpu, plan=plan)
    return o, ht


def transition(
    op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, cu_seqlens: Tensor | None = None,
    backend: str = "auto", config: ConfigArg = None, cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    need: Tensor | None = None, plan: LaunchPlan | None = None,
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
    bounds = check_inputs(op, None, k, v, g, beta, backend=be, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                          grouped=be == "triton")  # triton reads the shared key head of grouped value heads
    configs = check_config(config)
    B, T = k.shape[:2]
    _check_need(need, len(bounds) - 1 if bounds is not None else B, k)
    if be == "reference":
        return mask_maps(*naive_transition(k, v, OPS[op].per_key_gate(g), beta, cu_seqlens_cpu=bounds), need)
    if be == "torch":
        index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, device=k.device, cu_seqlens_cpu=cu_seqlens_cpu)
        return mask_maps(*chunk_transition_torch(k, v, OPS[op].per_key_gate(g), beta, index=index), need)
    fwd = import_triton("kernels.common.transition_triton", "chunk_transition_fwd")
    check_config_names(configs)
    return fwd(op, k, v, g, beta, cu_seqlens=cu_seqlens, plan=plan_with(plan, configs), need=need)


def reference(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    r"""The per-token fp32 recurrence (ground truth; slow: a Python loop over tokens).

    Same arguments, shapes and returns as `forward` (without `backend`/`config`; grouped value heads too); computes
    in fp32 (fp64 for fp64 inputs) and returns o in q's dtype and the final state in fp32. Differentiable by autograd.

    Examples::
        >>> o_ref, ht_ref = kernels.reference("kda", q, k, v, g, beta, cu_seqlens=cu_seqlens, output_final_state=True)
    """
    o, ht = run(_op(op), q, k, v, g, beta, scale=scale, initial_state=initial_state,
                output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend="reference")
    return o, ht


def _op(op: str) -> ChunkOp:
    """The op's entry (a ValueError naming the ops for an unknown name)."""
    return OPS[check_op(op)]


def _check_need(need: Any, N: int, k: Tensor) -> None:
    """Metadata checks of a sequence mask (shape, dtype, device; its values are never read)."""
    if need is None:
        return
    if not isinstance(need, Tensor) or need.dtype != torch.bool or tuple(need.shape) != (N,):
        got = f"{need.dtype} {tuple(need.shape)}" if isinstance(need, Tensor) else type(need).__name__
        raise ValueError(f"need must be a bool tensor of shape [{N}] (one flag per sequence), got need={got}")
    if need.device != k.device:
        raise ValueError(f"need is on {need.device} but k is on {k.device}")


def chunk_backward(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, dht: Tensor | None = None, cu_seqlens: Tensor | None = None,
    backend: str = "auto", config: LaunchConfig | Mapping[str, LaunchConfig] | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None, plan: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The gradients of `kernels.forward` without autograd: (dq, dk, dv, dg, dbeta, dh0) from do (and dht).

    Same inputs as `kernels.forward` (one head count H for q, k, v on torch; triton also takes grouped value heads
    and returns dq, dk with q's heads), plus `do`
    `[B, T, H, V]` in q's dtype and `dht` `[N, H, K, V]` fp32 (the final state's gradient) or None. Backends
    `torch` and `triton` (`auto`: triton on CUDA). Returns dq, dk, dv, dbeta in the input's dtype, dg in g's,
    dh0 fp32 or None when there is no initial state. Raises ValueError naming a bad argument before any launch.
    plan: the launch plan (`kernels.plan`; None: `default_plan()`), `config` merged on top.
    """
    be, index, s = _checked(op, q, k, v, g, beta, backend=backend, scale=scale, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    launch = plan_with(plan, check_config(config))
    return chunk_backward_impl(_op(op), be, q, k, v, g, beta, do, scale=s, initial_state=initial_state, dht=dht,
                               index=index, cu_seqlens=cu_seqlens, plan=launch)


def _checked(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, backend: str, scale: float | None,
    initial_state: Tensor | None, cu_seqlens: Tensor | None, cu_seqlens_cpu: Tensor | Sequence[int] | None,
) -> tuple[str, ChunkIndex, float]:
    """The backward entries' checks before any launch: (resolved backend, torch or triton; chunk index; scale)."""
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    if be not in ("torch", "triton"):
        raise ValueError(f"backend must be 'torch', 'triton' or 'auto' for the chunked backward, got backend={backend!r}")
    check_inputs(op, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                 cu_seqlens_cpu=cu_seqlens_cpu, grouped=be == "triton")  # triton: grouped heads, dq/dk per q/k head
    B, T, _, K = k.shape
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, device=k.device, cu_seqlens_cpu=cu_seqlens_cpu)
    return be, index, K**-0.5 if scale is None else float(scale)


def chunk_state_gradient(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float | None = None,
    dht: Tensor | None = None, cu_seqlens: Tensor | None = None, backend: str = "auto",
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None, plan: LaunchPlan | None = None,
) -> Tensor:
    """dh0 of `chunk_backward` alone (`[N, H, K, V]` fp32; fp64 for fp64 inputs on torch): the gradient of each
    sequence's entering state from do (and dht); it does not depend on the entering state. On triton only the WY prep and the reverse state pass run
    (`kernels.common.chunk_bwd.chunk_state_grad`); torch runs its whole chunked backward. Same checks as
    `chunk_backward`."""
    be, index, s = _checked(op, q, k, v, g, beta, backend=backend, scale=scale, initial_state=None,
                            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    check_grad_outputs(do, dht, q=q, v=v, num_seqs=index.num_seqs)
    if be == "torch":
        zero = q.new_zeros(index.num_seqs, v.shape[2], k.shape[3], v.shape[-1], dtype=torch.float32)
        dh0 = chunk_bwd_torch(q, k, v, OPS[op].per_key_gate(g), beta, do.contiguous(), scale=s, initial_state=zero,
                              dht=dht, index=index)[5]
        assert dh0 is not None
        return dh0
    from kernels.common.chunk_bwd import chunk_state_grad

    return chunk_state_grad(op, q, k, v, g, beta, do, scale=s, dht=dht, cu_seqlens=cu_seqlens,
                            plan=plan if plan is not None else default_plan())
