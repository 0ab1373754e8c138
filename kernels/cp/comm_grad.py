"""Differentiable collectives: autograd Functions over `kernels.cp.comm` for the schemes that run on plain autograd.

    blocks = all_to_all_grad([q_by_dst, k_by_dst, ...], group)   # forward: ONE packed all-to-all; backward: ONE
    full = all_gather_grad([q, k, v, g, beta], group)            # forward: ONE packed all-gather; backward: ONE
                                                                 # reduce-scatter of the gradients in fp32

An all-to-all is its own adjoint (block src -> dst forward, its gradient dst -> src backward), so the backward
of `all_to_all_grad` is one more packed all-to-all of the gradients, in their own dtypes. The adjoint of an
all-gather is a reduce-scatter: every rank holds a gradient of every rank's inputs (the loss of its own
tokens through the whole sequence), and rank r's input gradient is the SUM over ranks of block r. The sum is
taken in fp32 whatever the input dtype (FLA's all-gather CP sums bf16 partials and loses 3-5e-5; this does
not), in one reduce-scatter of every gradient packed into one fp32 buffer, and cast once at the end.
Nothing here reads a tensor value on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from kernels.cp import comm

__all__ = ["all_gather_grad", "all_to_all_grad"]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: Any, *blocks: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        ctx.group = group
        ctx.like = [(b.shape, b.dtype) for b in blocks]
        ctx.device = blocks[0].device
        return tuple(comm.all_to_all_packed(list(blocks), group))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        full = [g if g is not None else torch.zeros(s, dtype=dt, device=ctx.device) for g, (s, dt) in zip(grads, ctx.like, strict=True)]
        back = comm.all_to_all_packed(full, ctx.group)
        return (None, *back)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: Any, *xs: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        ctx.group = group
        ctx.like = [(x.shape, x.dtype) for x in xs]
        return tuple(comm.all_gather_packed(list(xs), group))

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        W = comm.group_size(ctx.group)
        ref = next(g for g in grads if g is not None)
        flat = [(g.float() if g is not None else ref.new_zeros((W, *s), dtype=torch.float32)).reshape(W, -1)
                for g, (s, _) in zip(grads, ctx.like, strict=True)]
        mine = comm.reduce_scatter(torch.cat(flat, 1) if len(flat) > 1 else flat[0], ctx.group)   # fp32 sums
        out, off = [], 0
        for f, (s, dt) in zip(flat, ctx.like, strict=True):
            n = f.shape[1]
            out.append(mine[off:off + n].view(s).to(dt))
            off += n
        return (None, *out)


def all_to_all_grad(blocks: Sequence[Tensor], group: Any) -> list[Tensor]:
    """`comm.all_to_all_packed` with a gradient: the backward is one packed all-to-all of the gradients."""
    return list(_AllToAll.apply(group, *blocks))


def all_gather_grad(xs: Sequence[Tensor], group: Any) -> list[Tensor]:
    """`comm.all_gather_packed` with a gradient: the backward is one fp32 reduce-scatter of all gradients."""
    return list(_AllGather.apply(group, *xs))
