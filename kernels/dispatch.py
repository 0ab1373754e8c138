"""The differentiable chunked op: one `torch.autograd.Function` for GDN and KDA on the torch and triton backends.

    ChunkFunction          forward = `chunk_forward` (the backend's chunked forward); backward = `chunk_backward_impl`
    chunk_backward         the functional backward (validated): (dq, dk, dv, dg, dbeta, dh0) from do and dht
    differentiable_forward grouped heads + in-op l2norm + dispatch (reference: autograd through the per-token
                           recurrence; torch / triton: ChunkFunction, or `chunk_forward` alone when grad is off:
                           inference saves nothing). FLA's own autograd op is `kernels.ops`' job.

Recompute policy (`LaunchPlan.keep` of the call's launch plan, `kernels.plan`; triton backend), what the forward holds
until the backward:
    "inputs"      (default, FLA's policy) only the inputs (q, k, v, g, beta and the initial state); the backward
                  recomputes the WY factors (w, u), the chunk states, v_new and the segment maps
    "wy"          also the WY factors (w, u, Aqk, the gate cumsum; KDA: the gated k and q): the backward skips the
                  WY prep, for [B, T, H, 2K + V + 64] (GDN: + [B, T, H] fp32; KDA: [B, T, H, 4K + V + 64] and
                  [NT, H, K] fp32) held per call
    "wy+states"   also the chunk states h [NT, H, K, V] and v_new [B, T, H, V] (k's dtype) and the maps of every
                  segment [NS, H, K, K] fp32: the backward skips the forward state pass and the transition pass
                  (per call 2.9x v's bytes more than "wy" at K = V = 128: 785 MB at T=64K, H=16; "wy" holds
                  2.4x v's bytes for GDN, 4.3x for KDA)
The figures of each policy on the H200 (time and the bytes held): `benchmarks/results/kernels_train_h200.md`.
A caller passes it in its plan (`kernels.forward(..., plan=LaunchPlan(keep="wy"))`; ChunkFunction keeps the plan of
its forward for its backward); a sweep sets it per point with `mode_options: {triton: {keep: ...}}` (`TRITON_OPTIONS`,
the triton backend's options; runners.backend_options turns them into the point's plan).
Extra memory of the backward: O(chunks x H x K x V) (the chunk states and their gradients,
`kernels.common.chunk_bwd_torch`); never `[T, K, K]` or per-token states.
The final state's incoming gradient (`dht`) is honoured; the Function always produces the final state (one
`[N, H, K, V]` tensor) and the entries drop it when it was not asked for (its gradient is then None).

Grouped value heads (v, g, beta and the state with HV = G * H heads; q/k head h // G serves value head h):
q and k are expanded with `repeat_interleave(G, dim=2)` before the Function, so every backend computes with HV
heads and autograd sums the G gradients of each q/k head (memory: one `[B, T, HV, K]` copy of q and of k).
`use_qk_l2norm_in_kernel` normalises q and k (`kernels.common.l2norm`) before that, differentiably.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from kernels.common.chunk_bwd_torch import chunk_bwd_torch
from kernels.common.chunk_torch import chunk_fwd_torch
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.l2norm import l2norm
from kernels.configs import LaunchConfig
from kernels.plan import LaunchPlan, default_plan, plan_with
from kernels.validate import check_backend, check_config, check_grad_outputs, check_inputs
from kernels.vocabulary import BACKEND_OPTIONS, KEEP_POLICIES

__all__ = ["KEEP_POLICIES", "TRITON_OPTIONS", "ChunkFunction", "chunk_backward", "chunk_backward_impl", "chunk_forward",
           "chunk_state_gradient", "differentiable_forward", "needs_grad"]

_TRITON_FWD = {"gdn": ("kernels.gdn.chunk", "chunk_gdn_fwd"), "kda": ("kernels.kda.chunk", "chunk_kda_fwd")}
_TRITON_BWD = {"gdn": ("kernels.gdn.chunk_bwd", "chunk_gdn_bwd"), "kda": ("kernels.kda.chunk_bwd", "chunk_kda_bwd")}
# the triton backend's options a sweep may set (`mode_options: {triton: {...}}`): name -> its allowed values, the first
# the default
TRITON_OPTIONS = BACKEND_OPTIONS["triton"]


def needs_grad(*xs: Tensor | None) -> bool:
    """True when autograd is on and one of the tensors requires a gradient."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


class ChunkFunction(torch.autograd.Function):
    """(o, final_state) of the chunked op with gradients for q, k, v, g, beta and the initial state."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, op: str, backend: str, index: ChunkIndex, cu_seqlens: Tensor | None, plan: LaunchPlan, scale: float,
        q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        keep_wy, keep_states = plan.keeps
        keep: dict[str, Tensor] | None = {} if backend == "triton" and keep_wy else None
        o, ht = chunk_forward(op, backend, index, cu_seqlens, plan, scale, q, k, v, g, beta, initial_state,
                              keep=keep, keep_states=keep_states)
        names = tuple(sorted(keep)) if keep else ()
        ctx.save_for_backward(q, k, v, g, beta, initial_state, *(keep[n] for n in names))  # type: ignore[index]
        ctx.meta = (op, backend, index, cu_seqlens, plan, scale, names)  # the backward launches with the same plan
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, do: Tensor | None, dht: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, g, beta, h0, *kept = ctx.saved_tensors
        op, backend, index, cu_seqlens, plan, scale, names = ctx.meta
        if do is None:  # only the final state was used
            do = q.new_zeros(v.shape)
        dq, dk, dv, dg, dbeta, dh0 = chunk_backward_impl(
            op, backend, q, k, v, g, beta, do, scale=scale, initial_state=h0, dht=dht, index=index,
            cu_seqlens=cu_seqlens, plan=plan, wy=dict(zip(names, kept, strict=True)) if names else None)
        if dh0 is not None and h0 is not None:
            dh0 = dh0.to(h0.dtype)
        return None, None, None, None, None, None, dq, dk, dv, dg, dbeta, dh0


def chunk_forward(
    op: str, backend: str, index: ChunkIndex, cu_seqlens: Tensor | None, plan: LaunchPlan, scale: float,
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None, *,
    keep: dict[str, Tensor] | None = None, keep_states: bool = False, states: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """ChunkFunction's forward without autograd: (o, final state), the final state always computed. keep /
    keep_states: what the triton forward holds for the backward (the plan's policy); states: a list that receives
    the chunk states `[NT, H, K, V]` (the state entering each chunk; fp32 on torch, k's dtype on triton)."""
    if backend == "torch":
        return chunk_fwd_torch(q, k, v, _per_key_gate(op, g), beta, scale=scale,  # type: ignore[return-value]
                               initial_state=initial_state, output_final_state=True, index=index, states=states)
    if states is not None:
        keep, keep_states = ({} if keep is None else keep), True
    fwd = _import_triton(*_TRITON_FWD[op])
    o, ht = fwd(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                cu_seqlens=cu_seqlens, plan=plan, keep=keep, keep_states=keep_states, chunk_size=index.chunk_size)
    if states is not None and keep is not None:
        states.append(keep["h"])
    return o, ht


def chunk_backward_impl(
    op: str, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *,
    scale: float, initial_state: Tensor | None, dht: Tensor | None, index: ChunkIndex, cu_seqlens: Tensor | None,
    plan: LaunchPlan, wy: Mapping[str, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The backend's backward on checked inputs (same heads everywhere); checks do / dht first. wy: the forward's
    WY factors and with "wy+states" its chunk states (triton, the plan's `keep`)."""
    check_grad_outputs(do, dht, q=q, v=v, num_seqs=index.num_seqs)
    do = do.contiguous()
    dht = dht.contiguous() if dht is not None else None
    if backend == "torch":
        dq, dk, dv, dg, dbeta, dh0 = chunk_bwd_torch(q, k, v, _per_key_gate(op, g), beta, do, scale=scale,
                                                     initial_state=initial_state, dht=dht, index=index)
        return dq, dk, dv, (dg.squeeze(-1) if op == "gdn" else dg), dbeta, dh0
    if backend != "triton":
        raise ValueError(f"backend {backend!r} has no chunked backward here (use 'torch' or 'triton')")
    bwd = _import_triton(*_TRITON_BWD[op])
    return bwd(q, k, v, g, beta, do, scale=scale, initial_state=initial_state, dht=dht, cu_seqlens=cu_seqlens,
               plan=plan, wy=wy, chunk_size=index.chunk_size)


def chunk_backward(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    do: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    dht: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    backend: str = "auto",
    config: LaunchConfig | Mapping[str, LaunchConfig] | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    plan: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The gradients of `kernels.forward` without autograd: (dq, dk, dv, dg, dbeta, dh0) from do (and dht).

    Same inputs as `kernels.forward` (one head count H for q, k, v; expand grouped heads first), plus `do`
    `[B, T, H, V]` in q's dtype and `dht` `[N, H, K, V]` fp32 (the final state's gradient) or None. Backends
    `torch` and `triton` (`auto`: triton on CUDA). Returns dq, dk, dv, dbeta in the input's dtype, dg in g's,
    dh0 fp32 or None when there is no initial state. Raises ValueError naming a bad argument before any launch.
    plan: the launch plan (`kernels.plan`; None: `default_plan()`), `config` merged on top.
    """
    be, index, s = _checked(op, q, k, v, g, beta, backend=backend, scale=scale, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    launch = plan_with(plan, check_config(config))
    return chunk_backward_impl(op, be, q, k, v, g, beta, do, scale=s, initial_state=initial_state, dht=dht,
                               index=index, cu_seqlens=cu_seqlens, plan=launch)


def _checked(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, backend: str, scale: float | None,
    initial_state: Tensor | None, cu_seqlens: Tensor | None, cu_seqlens_cpu: Tensor | Sequence[int] | None,
) -> tuple[str, ChunkIndex, float]:
    """The backward entries' checks before any launch: (resolved backend, torch or triton; chunk index; scale)."""
    from kernels.backends import resolve_backend

    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    if be not in ("torch", "triton"):
        raise ValueError(f"backend must be 'torch', 'triton' or 'auto' for the chunked backward, got backend={backend!r}")
    check_inputs(op, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                 cu_seqlens_cpu=cu_seqlens_cpu)
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
        zero = q.new_zeros(index.num_seqs, k.shape[2], k.shape[3], v.shape[-1], dtype=torch.float32)
        dh0 = chunk_bwd_torch(q, k, v, _per_key_gate(op, g), beta, do.contiguous(), scale=s, initial_state=zero,
                              dht=dht, index=index)[5]
        assert dh0 is not None
        return dh0
    from kernels.common.chunk_bwd import chunk_state_grad

    return chunk_state_grad(op, q, k, v, g, beta, do, scale=s, dht=dht, cu_seqlens=cu_seqlens,
                            plan=plan if plan is not None else default_plan())


def differentiable_forward(
    op: str, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float,
    initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None, bounds: list[int] | None, plan: LaunchPlan,
    use_qk_l2norm_in_kernel: bool = False, states: list[Tensor] | None = None, chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """(o, final state or None) on checked inputs (`backend` resolved, not fla), grouped heads allowed.

    With grad off (`torch.no_grad()`, `torch.inference_mode()`) or no input requiring grad, the torch / triton forward
    runs directly: no autograd node, nothing saved. states: a list that receives the chunk states (`chunk_forward`;
    torch and triton only). chunk_size: the chunk of both backends (16, 32 or 64; `kernels.fla_args`)."""
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[2] // k.shape[2]
    if group > 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    if backend == "reference":
        from kernels.common.naive import naive_recurrent_kda
        from kernels.gdn.naive import naive_recurrent_gdn

        fn = naive_recurrent_gdn if op == "gdn" else naive_recurrent_kda
        return fn(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens_cpu=bounds)
    B, T = k.shape[:2]
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device,
                                cu_seqlens_cpu=cu_seqlens_cpu)
    args = (op, backend, index, cu_seqlens, plan, scale, q, k, v, g, beta, initial_state)
    if needs_grad(q, k, v, g, beta, initial_state):
        o, ht = ChunkFunction.apply(*args)
    else:
        o, ht = chunk_forward(*args, states=states)
    return o, (ht if output_final_state else None)


def _per_key_gate(op: str, g: Tensor) -> Tensor:
    """The torch path works on a `[B, T, H, Kg]` gate: GDN's scalar gate is Kg = 1 and broadcasts over K."""
    return g.unsqueeze(-1) if op == "gdn" else g


def _import_triton(module: str, name: str) -> Callable[..., Any]:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"backend 'triton' could not load {module}.{name}: {err}") from err
