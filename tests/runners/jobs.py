"""Job functions the gang tests send to rank processes (module-level, so they pickle by reference)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from runners.gang import RankContext


def whoami(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Each rank's pid, and a real collective: the sum of (rank + 1) over the gang."""
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=ctx.group)
    ctx.cache["calls"] = ctx.cache.get("calls", 0) + 1
    return {"rank": ctx.rank, "pid": os.getpid(), "sum": float(t[0]), "calls": ctx.cache["calls"], "payload": payload}


def crash_rank(ctx: RankContext, payload: Any) -> None:
    """Rank `payload` dies without a word (as a segfault or the OOM killer would); the others wait in a collective."""
    if ctx.rank == payload:
        os._exit(3)
    dist.barrier(group=ctx.group)


def raise_everywhere(ctx: RankContext, payload: Any) -> None:
    raise ValueError(f"bad input on rank {ctx.rank}: {payload}")
