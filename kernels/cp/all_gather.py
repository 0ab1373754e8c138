"""all_gather: gather the whole sequence to every rank (ONE packed all-gather), compute it, keep the local slice.

q, k, v, g, beta of the shard are packed byte-wise into one buffer (mixed dtypes allowed), all-gathered,
reordered into global token order (zigzag parts come back in rank order, so one index_select on parts),
and every rank runs the full varlen forward (redundantly: never faster than one device, the cost model's
`t_AG + Phi(T, H)`). Option `segment_len` (default None) splits long sequences exactly on each device
(forward only).

Training: with inputs that require grad the all-gather is `comm_grad.all_gather_grad`: every rank runs the
chunked backward of the whole sequence from the gradient of its own slice (zeros elsewhere), and one
reduce-scatter sums the W partial input gradients in fp32 (cast to the input dtypes once, at the end).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from kernels.cp import comm, comm_grad, intra
from kernels.cp.context import CPContext
from kernels.cp.layout import shard
from kernels.dispatch import needs_grad
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["forward", "to_global_order"]

OPTIONS = MODE_OPTIONS["all_gather"]


def to_global_order(x: Tensor, ctx: CPContext) -> Tensor:
    """`[W(src), local_len, ...]` (each rank's shard) -> `[1, T, ...]` in global token order (one copy)."""
    W, P, S = ctx.world_size, ctx.part_len, ctx.slots_per_rank
    rest = x.shape[2:]
    parts = x.reshape(W * S, P, *rest)
    if S == 1:
        return parts.reshape(1, W * P, *rest)
    order = [2 * r + s for r, s in ctx.part_owner]
    idx = ctx.index("part_rows", order, x.device)
    return parts.index_select(0, idx).reshape(1, ctx.total_len, *rest)


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    train = needs_grad(q, k, v, g, beta)
    xs = [x[0] for x in (q, k, v, g, beta)]
    got = comm_grad.all_gather_grad(xs, group) if train else comm.all_gather_packed(xs, group)  # each [W, local_len, ...]
    qf, kf, vf, gf, bf = (to_global_order(x, ctx) for x in got)
    cu = ctx.cu_seqlens
    seg = None if train else intra.resolve_segment_len(
        options["segment_len"], [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)], v.shape[2], q.device)
    o = intra.split_forward(op, qf, kf, vf, gf, bf, cu, seg_len=seg, backend=backend, launch=launch, scale=scale)
    return shard(o, ctx)
