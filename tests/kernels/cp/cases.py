"""Rank-side test cases run by the engine's gloo gang (`runners.gang.Gang`, see conftest.py): `fn(ctx, payload)`
with the case's keyword arguments in `payload`; each builds the same global inputs on every rank."""

from __future__ import annotations

from typing import Any

import torch

import kernels.cp as cp
from runners.gang import RankContext
from runners.profile import profile_step
from runners.training import train_step
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


def train_inputs(op: str, lengths: tuple[int, ...], H: int, HV: int, K: int, V: int, lb: float,
                 seed: int) -> tuple[Any, ...]:
    """(q, k, v, g, beta, cu, do): fp32 global inputs with HV value heads (HV = H: plain) and the output gradient."""
    q, k, v, g, beta, cu = make_inputs(op, lengths, H=H, K=K, V=V, lb=lb, seed=seed)
    if HV != H:
        _, _, v, g, beta, _ = make_inputs(op, lengths, H=HV, K=K, V=V, lb=lb, seed=seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    do = torch.randn(1, sum(lengths), HV, V, generator=gen)
    return q, k, v, g, beta, cu, do


def grads(ctx: RankContext, payload: dict[str, Any]) -> dict[str, list[torch.Tensor]]:
    """`_grads` on this rank of the gang."""
    return _grads(rank=ctx.rank, world_size=ctx.world_size, **payload)


def _grads(*, rank: int, world_size: int, op: str, lengths: tuple[int, ...], layout: str, runs: list[tuple[str, Any]],
          H: int = 4, HV: int | None = None, K: int = 16, V: int = 16, lb: float = -1.0,
          seed: int = 0, backend: str = "torch") -> dict[str, list[torch.Tensor]]:
    """Every (mode, options) of `runs`: o_local.backward(shard(do)) on this rank; {label: [o, dq, dk, dv, dg, dbeta]}."""
    q, k, v, g, beta, cu, do = train_inputs(op, lengths, H, HV or H, K, V, lb, seed)
    ctx = cp.build_context(cu, world_size, rank, layout)
    out = {}
    for i, (mode, options) in enumerate(runs):
        xs = [cp.shard(x, ctx).clone().requires_grad_() for x in (q, k, v, g, beta)]
        o = cp.forward(mode, op, *xs, group=None, ctx=ctx, backend=backend, options=options)
        o.backward(cp.shard(do, ctx))
        out[f"{i}:{mode}"] = [o.detach(), *(x.grad for x in xs)]
    return out


def profile_train(ctx: RankContext, payload: dict[str, Any]) -> dict[str, Any]:
    """`_profile_train` on this rank of the gang."""
    return _profile_train(rank=ctx.rank, world_size=ctx.world_size, **payload)


def _profile_train(*, rank: int, world_size: int, op: str, lengths: tuple[int, ...], layout: str, mode: str,
                  options: dict[str, Any] | None = None, H: int = 4, K: int = 16, V: int = 16) -> dict[str, Any]:
    """One warm-up training step, then profiles of one backward alone and of one whole step (the engine's
    `runners.training.train_step`: forward + backward, each in its profiler range)."""
    q, k, v, g, beta, cu, do = train_inputs(op, lengths, H, H, K, V, -1.0, 1)
    ctx = cp.build_context(cu, world_size, rank, layout)
    xs = [cp.shard(x, ctx).clone().requires_grad_() for x in (q, k, v, g, beta)]
    do_l = cp.shard(do, ctx)

    def fwd() -> torch.Tensor:
        return cp.forward(mode, op, *xs, group=None, ctx=ctx, backend="torch", options=options)

    step = train_step(fwd, xs, do_l)
    step()
    o = fwd()
    cpu = torch.device("cpu")
    res = {"bwd": profile_step(lambda: o.backward(do_l), device=cpu).as_dict(), "step": profile_step(step, device=cpu).as_dict()}
    res["expected"] = {d: cp.expected_collectives(mode, ctx, options, d) for d in ("fwd", "bwd", "fwd+bwd")}
    return res
