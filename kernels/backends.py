"""Backend names, the "auto" rule, and the adapter to flash-linear-attention (the `fla` backend).

`auto` resolves to `triton` when the inputs are on a CUDA device and to `torch` elsewhere. The FLA adapter
calls FLA's public chunk forwards on our inputs unchanged: the same `scale`, `initial_state`, `output_final_state`,
`cu_seqlens`, and FLA's options as the caller gave them (in-kernel gate, in-kernel l2norm, beta sigmoid, state
layout, ...; `kernels.chunk_gdn` / `kernels.chunk_kda`). FLA is imported only when asked for; without it the backend raises ImportError naming the package.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.validate import BACKENDS, check_backend

__all__ = ["BACKENDS", "fla_forward", "fla_op", "resolve_backend"]

logger = logging.getLogger(__name__)

_FLA_MISSING = (
    "backend 'fla' needs the flash-linear-attention package (pip install flash-linear-attention), "
    "which could not be imported: {err}"
)


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend of a call: `auto` becomes `triton` on CUDA, `torch` elsewhere."""
    check_backend(backend)
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return backend


@functools.lru_cache(maxsize=256)
def _host_bounds(bounds: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return torch.tensor(bounds, dtype=dtype)


def fla_op(op: str) -> Any:
    """FLA's public chunk op of `op`: `chunk_gated_delta_rule` (gdn) or `chunk_kda` (kda), imported now."""
    try:
        if op == "gdn":
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        else:
            from fla.ops.kda import chunk_kda as fla_chunk
    except ImportError as err:
        raise ImportError(_FLA_MISSING.format(err=err)) from err
    return fla_chunk


def fla_forward(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None,
    output_final_state: bool,
    cu_seqlens: Tensor | None,
    cu_seqlens_cpu: Sequence[int] | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    options: Mapping[str, Any] | None = None,
    states: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """FLA's `chunk_gated_delta_rule` (gdn) or `chunk_kda` (kda) on our inputs (FLA's own autograd op; grouped value
    heads and the in-kernel l2norm are FLA's too). options: FLA's other keyword arguments, passed as they are
    (`kernels.fla_args`: the in-kernel gate, beta sigmoid, state_v_first, ...); with return_intermediate_states
    FLA's intermediate states h go to the list `states`."""
    fla_chunk = fla_op(op)
    kwargs: dict[str, object] = dict(options or {})
    if use_qk_l2norm_in_kernel:
        kwargs["use_qk_l2norm_in_kernel"] = True
    if cu_seqlens is not None:
        # FLA reads the bounds on the device; the host copy spares it a device-to-host sync
        kwargs["cu_seqlens"] = cu_seqlens.to(q.device, non_blocking=True)
        if cu_seqlens_cpu is not None:
            # one host tensor per bounds (FLA caches its varlen indices on tensor identity)
            kwargs["cu_seqlens_cpu"] = _host_bounds(tuple(int(x) for x in cu_seqlens_cpu), cu_seqlens.dtype)
    # FLA's KDA asserts an fp32 initial state; GDN accepts it too
    h0 = initial_state.float() if initial_state is not None else None
    o, ht, *h = fla_chunk(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=output_final_state,
                          **kwargs)
    if states is not None:
        states.extend(h)
    return o, (ht if output_final_state else None)

