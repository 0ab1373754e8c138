"""Rank-side test cases run by the engine's gloo gang (`runners.gang.Gang`, see conftest.py): `fn(ctx, payload)`
with the case's keyword arguments in `payload`; each builds the same global inputs on every rank."""

from __future__ import annotations

from typing import Any

import torch

import kernels.cp as cp
from runners.gang import RankContext
from runners.profile import profile_step
from tests.utils import make_inputs


def _inputs(op: str, lengths: tuple[int, ...], H: int, K: int, V: int, lb: float, seed: int) -> tuple[Any, ...]:
    return make_inputs(op, lengths, H=H, K=K, V=V, lb=lb, seed=seed)


def schemes(ctx: RankContext, payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every (mode, options) of `runs` on this rank's shard: {run label: o_local}."""
    return _schemes(rank=ctx.rank, world_size=ctx.world_size, **payload)


def _schemes(*, rank: int, world_size: int, op: str, lengths: tuple[int, ...], layout: str, runs: list[tuple[str, Any]],
             H: int = 4, K: int = 16, V: int = 32, lb: float = -1.0, seed: int = 0) -> dict[str, torch.Tensor]:
    q, k, v, g, beta, cu = _inputs(op, lengths, H, K, V, lb, seed)
    ctx = cp.build_context(cu, world_size, rank, layout)
    xs = [cp.shard(x, ctx) for x in (q, k, v, g, beta)]
    out = {}
    for i, (mode, options) in enumerate(runs):
        out[f"{i}:{mode}"] = cp.forward(mode, op, *xs, group=None, ctx=ctx, backend="torch", options=options)
    return out


def profile(ctx: RankContext, payload: dict[str, Any]) -> dict[str, Any]:
    """One warm-up step, then one profiled step of `mode` (`runners.profile`): its summary as a dict, plus
    `expected`, what the context predicts."""
    return _profile(rank=ctx.rank, world_size=ctx.world_size, **payload)


def _profile(*, rank: int, world_size: int, op: str, lengths: tuple[int, ...], layout: str, mode: str,
             options: dict[str, Any] | None = None, H: int = 4, K: int = 16, V: int = 16) -> dict[str, Any]:
    q, k, v, g, beta, cu = _inputs(op, lengths, H, K, V, -1.0, 1)
    ctx = cp.build_context(cu, world_size, rank, layout)
    xs = [cp.shard(x, ctx) for x in (q, k, v, g, beta)]

    def step() -> torch.Tensor:
        return cp.forward(mode, op, *xs, group=None, ctx=ctx, backend="torch", options=options)

    step()
    res = profile_step(step, device=torch.device("cpu")).as_dict()
    res["expected"] = cp.expected_collectives(mode, ctx, options)
    return res


def bad_group(ctx: RankContext, payload: None = None) -> str:
    """cp.forward with a context of another world size must refuse before any collective."""
    rank, world_size = ctx.rank, ctx.world_size
    q, k, v, g, beta, cu = _inputs("gdn", (256,), 2, 16, 16, -1.0, 0)
    ctx = cp.build_context(cu, 2 * world_size, rank)
    xs = [cp.shard(x, ctx) for x in (q, k, v, g, beta)]
    try:
        cp.forward("true_cp", "gdn", *xs, group=None, ctx=ctx, backend="torch")
    except ValueError as err:
        return str(err)
    return "no error"
