"""Contiguous and zigzag partitions of the token axis: cut a global tensor into a rank's shard and put shards back.

The token axis is dim 1 (`[1, T, ...]`, B = 1 varlen). A rank's shard is its slots' parts concatenated in
slot order (zigzag: `[part r; part 2W-1-r]`). These helpers copy at most once and never read values, so
they are safe outside and inside a step (the schemes use the index helpers below on packed buffers).

    shards = [cp.shard(x, cp.build_context(cu, W, r, "zigzag")) for r in range(W)]
    x_again = cp.unshard(shards, ctx)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kernels.cp.context import CPContext

__all__ = ["shard", "unshard"]


def _check_token_dim(name: str, x: object, expected: int) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2 or x.shape[0] != 1:
        raise ValueError(f"{name} must be [1, T, ...] (B = 1, tokens on dim 1), got {name}.shape={tuple(x.shape)}")
    if x.shape[1] != expected:
        raise ValueError(f"{name}.shape[1] must be {expected} tokens, got {name}.shape={tuple(x.shape)}")
    return x


def shard(x: Tensor, ctx: CPContext) -> Tensor:
    """The rank's shard `[1, local_len, ...]` of a global tensor `[1, T, ...]` (a view for contiguous, one copy for zigzag)."""
    _check_token_dim("x", x, ctx.total_len)
    P = ctx.part_len
    parts = [x[:, s.part * P:(s.part + 1) * P] for s in ctx.slots]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def unshard(shards: Sequence[Tensor], ctx: CPContext) -> Tensor:
    """The global tensor `[1, T, ...]` from the W shards `[1, local_len, ...]` (rank order); `ctx` of any rank."""
    if not isinstance(shards, Sequence) or len(shards) != ctx.world_size:
        n = len(shards) if isinstance(shards, Sequence) else type(shards).__name__
        raise ValueError(f"shards must be a sequence of world_size={ctx.world_size} tensors, got {n}")
    for r, s in enumerate(shards):
        _check_token_dim(f"shards[{r}]", s, ctx.local_len)
    P = ctx.part_len
    parts: list[Tensor | None] = [None] * ctx.num_parts
    for r, s in enumerate(shards):
        for slot, p in enumerate(ctx.parts_of(r)):
            parts[p] = s[:, slot * P:(slot + 1) * P]
    return torch.cat(parts, 1)  # type: ignore[arg-type]
