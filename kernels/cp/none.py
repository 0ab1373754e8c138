"""none: the single-device baseline, the whole sequence on one device (0 collectives).

`cp.forward("none", ...)` takes the WHOLE batch (a context built with world_size=1) and runs one varlen
forward over it; it refuses a context with W > 1, because a rank's shard alone is not the sequence. The
engine times `none` with W = 1, and every other scheme is checked against it. Option `segment_len`
(default None: plain forward) splits long sequences exactly inside the device (kernels.cp.intra); forward only:
with inputs that require grad the step is the plain differentiable forward (`kernels.forward`'s autograd op).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from kernels.cp import intra
from kernels.cp.context import CPContext
from kernels.dispatch import needs_grad
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["forward"]

OPTIONS = MODE_OPTIONS["none"]


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    if ctx.world_size != 1:
        raise ValueError(f"mode 'none' is the single-device baseline: build its context with world_size=1 and pass the "
                         f"whole batch, got ctx.world_size={ctx.world_size}")
    cu = ctx.cu_seqlens
    seg = None if needs_grad(q, k, v, g, beta) else intra.resolve_segment_len(
        options["segment_len"], [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)], v.shape[2], q.device)
    return intra.split_forward(op, q, k, v, g, beta, cu, seg_len=seg, backend=backend, launch=launch, scale=scale)
