"""Kimi Delta Attention backward on the Triton backend: the launch sequence of `kernels.common.chunk_bwd` for KDA.

    recompute    WY prep (`kernels.common.wy`), T = (I + A)^{-1} (`wy_inverse`), the chunk states (split across
                 the sequence like the forward)                                   kernels.common.chunk_state
    reverse      the gradient of the state, chunk by chunk from dht (split the same way)  kernels.common.state_bwd
    gradients    dq and the parts of dk / dg (`chunk_bwd_dqk`), the WY backward and the reverse gate cumsum
                 (`wy_bwd`)                                                       kernels.common.chunk_bwd

Inputs as the forward (g [B, T, H, K], raw natural-log gates), plus do `[B, T, H, V]` and dht fp32 `[N, H, K, V]`
or None. Validation happens in `kernels.autograd` before this is called.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from kernels.common.chunk_bwd import chunk_bwd
from kernels.configs import LaunchConfig

__all__ = ["chunk_kda_bwd"]


def chunk_kda_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    do: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None = None,
    dht: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    configs: Mapping[str, LaunchConfig] | None = None,
    split_chunks: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(dq, dk, dv, dg, dbeta, dh0): dq, dk, dv, dbeta in the input dtype, dg in g's, dh0 fp32 or None without an
    initial state. split_chunks: None = automatic sequence split, 0 = never, n = segments of n chunks."""
    return chunk_bwd("kda", q, k, v, g, beta, do, scale=scale, initial_state=initial_state, dht=dht,
                     cu_seqlens=cu_seqlens, configs=configs, split_chunks=split_chunks)
