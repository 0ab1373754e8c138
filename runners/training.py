"""Training points (`direction: fwd+bwd`): the timed step is forward + backward with a fixed output gradient.

`train_run(fwd, leaves, do, gather)` turns a mode's forward into a training step: the inputs become leaves that
require grad (made once, outside the step), `do` is fixed for the point (drawn from its seed over the whole
output, then sharded like the output), and each step resets the gradients (`grad = None`), runs the forward
and `o.backward(do)`, each inside its profiler range (`cpbench::fwd`, `cpbench::bwd`: the profile of the step
counts collectives and host syncs per direction, `runners.profile`); no host read. `full_grads()` runs one step and returns the input gradients gathered to
rank 0 in the global layout, for the correctness gate (`grad_errors`): every input gradient against `none`'s
(autograd through `kernels.forward` on the whole batch) and against autograd through the fp32 reference on the
reduced shape, as the forward's output is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from runners.point import PointSpec
from runners.profile import direction_range

__all__ = ["GRAD_NAMES", "global_do", "grad_names", "grads_of", "is_training", "leaves", "reference_grads", "train_step"]

GRAD_NAMES = ("dq", "dk", "dv", "dg", "dbeta")
PARAM_GRAD_NAMES = ("dA_log", "ddt_bias")  # a real-model gate's parameters (`runners.workload.PARAM_NAMES`)


def grad_names(n_params: int) -> tuple[str, ...]:
    """The names of a step's input gradients: the op's five, then those of its `n_params` gate parameters."""
    return GRAD_NAMES + PARAM_GRAD_NAMES[:n_params]


def is_training(point: PointSpec) -> bool:
    return point.direction == "fwd+bwd"


def global_do(point: PointSpec, like: Tensor) -> Tensor:
    """The point's fixed output gradient, shaped like the whole output `like` (dense or flat), from its seed."""
    gen = torch.Generator().manual_seed(point.seed + 7919)
    return torch.randn(like.shape, generator=gen).to(device=like.device, dtype=like.dtype)


def leaves(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Copies of the inputs that require grad (the step's leaves)."""
    return [x.detach().clone().requires_grad_() for x in tensors]


def train_step(fwd: Callable[[], Tensor], xs: Sequence[Tensor], do: Tensor) -> Callable[[], Tensor]:
    """The timed training step: reset the gradients, forward, backward with `do` (no host read); the forward and
    the backward each in their profiler range while profiled (the backward's range encloses the autograd engine's
    work, on CUDA's autograd thread too: `o.backward` returns when it is done)."""

    def step() -> Tensor:
        for x in xs:
            x.grad = None
        with direction_range("fwd"):
            o = fwd()
        with direction_range("bwd"):
            o.backward(do)
        return o.detach()

    return step


def grads_of(step: Callable[[], Tensor], xs: Sequence[Tensor], gather: Callable[[Tensor], Tensor]) -> list[Tensor]:
    """Run one step and gather each input gradient (`gather`: local -> global on rank 0)."""
    step()
    return [gather(x.grad if x.grad is not None else torch.zeros_like(x)) for x in xs]


def reference_grads(op: str, tensors: Sequence[Tensor], do: Tensor, *, cu_seqlens: Tensor | None,
                    backend: str | None, params: Sequence[Tensor] = (),
                    activation: Callable[[Sequence[Tensor]], Sequence[Tensor]] | None = None) -> list[Tensor]:
    """Input gradients of `kernels.forward` (backend) or, with backend None, of `kernels.reference`, for `do`; with a
    real-model gate those of the gate's `params` too, through `activation` (`runners.workload.Activation`)."""
    import kernels

    xs = leaves([*tensors, *params])
    ins = activation(xs) if activation is not None else xs
    if backend is None:
        o = kernels.reference(op, *ins, cu_seqlens=cu_seqlens)[0]
    else:
        o = kernels.forward(op, *ins, cu_seqlens=cu_seqlens, backend=backend)[0]
    o.backward(do.reshape(o.shape))
    return [x.grad if x.grad is not None else torch.zeros_like(x) for x in xs]
