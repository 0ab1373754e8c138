"""Kimi Delta Attention backward on the Triton backend: `kernels.common.chunk_bwd.chunk_bwd` for op "kda" (g [B, T, H, K]).

`chunk_kda_bwd(q, k, v, g, beta, do, *, scale, initial_state=None, dht=None, cu_seqlens=None, plan=None,
split_chunks=None) -> (dq, dk, dv, dg, dbeta, dh0)`: the launch sequence (recompute, reverse state pass, gradients)
and the arguments are documented there. Validation happens in `kernels.autograd` before this is called.
"""

from __future__ import annotations

import functools

from kernels.common.chunk_bwd import chunk_bwd

__all__ = ["chunk_kda_bwd"]

chunk_kda_bwd = functools.partial(chunk_bwd, "kda")
