"""Calls of the kernel primitives (forward, backward, transition) with host bounds: cached device bounds, no sync.

`kernels.forward`/`kernels.transition` read varlen bounds on the host; handing them `cu_seqlens_cpu` (our
host tuple) and the same cached device tensor every step keeps their index caches warm and sync-free. `launch`: the
launch plan of the scheme's step (`kernels.plan`; None: the default plan), handed to the primitive as `plan=`.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

import kernels
from kernels.plan import LaunchPlan

__all__ = ["bounds_tensor", "bwd", "fwd", "state_grad", "trans"]


@functools.lru_cache(maxsize=1024)
def _bounds_tensor(bounds: tuple[int, ...], device: str) -> Tensor:
    return torch.tensor(bounds, dtype=torch.int32, device=device)


def bounds_tensor(bounds: tuple[int, ...], device: torch.device) -> Tensor:
    """The int32 device copy of host bounds, made once per (bounds, device) and reused (one identity per step)."""
    return _bounds_tensor(tuple(bounds), str(device))


def fwd(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, bounds: tuple[int, ...], *,
        h0: Tensor | None = None, final: bool = False, backend: str = "auto", scale: float | None = None,
        launch: LaunchPlan | None = None) -> tuple[Tensor, Tensor | None]:
    """`kernels.forward` over the varlen batch `bounds` (host tuple over q's token axis)."""
    return kernels.forward(op, q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=final,
                           cu_seqlens=bounds_tensor(bounds, k.device), cu_seqlens_cpu=bounds, backend=backend,
                           plan=launch)


def trans(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, bounds: tuple[int, ...], *,
          backend: str = "auto", need: Tensor | None = None, launch: LaunchPlan | None = None) -> tuple[Tensor, Tensor]:
    """`kernels.transition` (M `[N,H,K,K]`, S_ext `[N,H,K,V]`, fp32) of the sequences of `bounds`.

    need: bool `[N]` device mask (None: all); unflagged sequences get zeros (triton: their pass is skipped).
    """
    return kernels.transition(op, k, v, g, beta, cu_seqlens=bounds_tensor(bounds, k.device), cu_seqlens_cpu=bounds,
                              backend=backend, need=need, plan=launch)


def state_grad(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, bounds: tuple[int, ...], *,
               dht: Tensor | None = None, backend: str = "auto", scale: float | None = None,
               launch: LaunchPlan | None = None) -> Tensor:
    """dh0 `[N, H, K, V]` fp32 of `bwd` alone over the varlen batch `bounds` (`kernels.api.chunk_state_gradient`):
    on triton the WY prep and the reverse state pass, not the whole backward."""
    from kernels.api import chunk_state_gradient

    return chunk_state_gradient(op, q, k, v, g, beta, do, scale=scale, dht=dht, cu_seqlens=bounds_tensor(bounds, k.device),
                                cu_seqlens_cpu=bounds, backend=backend, plan=launch)


def bwd(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, bounds: tuple[int, ...], *,
        h0: Tensor | None = None, dht: Tensor | None = None, backend: str = "auto", scale: float | None = None,
        launch: LaunchPlan | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """`kernels.backward` over the varlen batch `bounds`: (dq, dk, dv, dg, dbeta, dh0) from do (and dht `[N, H, K, V]`)."""
    return kernels.backward(op, q, k, v, g, beta, do, scale=scale, initial_state=h0, dht=dht,
                            cu_seqlens=bounds_tensor(bounds, k.device), cu_seqlens_cpu=bounds, backend=backend,
                            plan=launch)
