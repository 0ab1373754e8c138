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


def hang_rank(ctx: RankContext, payload: Any) -> None:
    """Rank 1 sleeps far past the watchdog; rank 0 waits for it in a barrier."""
    import time

    if ctx.rank == 1:
        time.sleep(payload)
    dist.barrier(group=ctx.group)


def raise_on_rank(ctx: RankContext, payload: Any) -> None:
    """Rank `payload` raises before a collective the others are already waiting in."""
    if ctx.rank == payload:
        raise RuntimeError(f"rank {ctx.rank} gave up")
    dist.barrier(group=ctx.group)


def profile_collectives(ctx: RankContext, payload: Any) -> dict[str, Any]:
    """Profile one step with one call each of all_gather (into tensor), all_to_all_single, all_reduce, and a
    send 0 -> 1; rank 0 writes the trace to `payload` (a path) when given."""
    from runners.profile import profile_step

    W = ctx.world_size
    x = torch.randn(256)
    gathered = torch.empty(W * 256)
    a2a = torch.empty(256)
    msg = torch.randn(64, dtype=torch.float64)

    def step() -> None:
        dist.all_gather_into_tensor(gathered, x, group=ctx.group)
        dist.all_to_all_single(a2a, x, group=ctx.group)
        dist.all_reduce(x, group=ctx.group)
        if ctx.rank == 0:
            dist.send(msg, 1, group=ctx.group)
        elif ctx.rank == 1:
            dist.recv(msg, 0, group=ctx.group)

    step()  # warm
    trace = payload if ctx.rank == 0 else None
    return profile_step(step, device=ctx.device, trace_path=trace).as_dict()
