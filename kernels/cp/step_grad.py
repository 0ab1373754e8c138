"""The autograd Function of the schemes whose backward is written by hand: ring, true_cp, tail_exchange, warmup_correct.

    o = step_grad.apply(scheme, q, k, v, g, beta, op=op, group=group, ctx=ctx, backend=be, launch=plan, scale=scale,
                        options=opts)

`scheme` is a module (or object) with `forward_saved(op, q, k, v, g, beta, *, group, ctx, backend, launch, scale,
options) -> (o, saved)` (the scheme's forward, run without autograd, returning what its backward needs) and
`backward_saved(op, q, k, v, g, beta, do, saved, *, group, ctx, backend, launch, scale, options) -> (dq, dk, dv, dg,
dbeta)`. These schemes move computed STATES between ranks or segments, so their backward moves state
GRADIENTS the other way (the mirror of the forward, kernels/cp/README.md §7) and calls the chunked backward
(`kernels.backward`) on the local pieces with the entering states saved by the forward: nothing is
differentiated through a transition map. Every rank of the group must run the backward, as every rank runs
the forward (the backward issues collectives). `launch` (the step's `kernels.plan.LaunchPlan`) is held with the other
arguments, so the backward launches with the forward's plan.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["apply"]


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, scheme: Any, kw: dict[str, Any], q: Tensor, k: Tensor, v: Tensor, g: Tensor,  # type: ignore[override]
                beta: Tensor) -> Tensor:
        o, saved = scheme.forward_saved(kw["op"], q, k, v, g, beta, group=kw["group"], ctx=kw["ctx"],
                                        backend=kw["backend"], launch=kw["launch"], scale=kw["scale"],
                                        options=kw["options"])
        ctx.scheme, ctx.kw, ctx.saved = scheme, kw, saved
        ctx.save_for_backward(q, k, v, g, beta)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, do: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, g, beta = ctx.saved_tensors
        kw = ctx.kw
        grads = ctx.scheme.backward_saved(kw["op"], q, k, v, g, beta, do.contiguous(), ctx.saved, group=kw["group"],
                                          ctx=kw["ctx"], backend=kw["backend"], launch=kw["launch"], scale=kw["scale"],
                                          options=kw["options"])
        ctx.saved = None
        return (None, None, *grads)


def apply(scheme: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, **kw: Any) -> Tensor:
    """The scheme's output with its hand-written backward attached (see the module docstring)."""
    return _Step.apply(scheme, kw, q, k, v, g, beta)
