"""headwise (Ulysses / CP2TP): all-to-all from sequence-sharded to head-sharded, compute, all-to-all back.

Exactly 2 all-to-all per forward: q, k, v, g, beta are packed byte-wise into ONE buffer
`[W(dst), row_bytes]` (rank d gets heads [d H/W, (d+1) H/W) of every local token), and the output goes
back in one. Each rank then holds H/W heads of the whole sequence in global token order (zigzag shards
are reordered by one index_select over parts) and runs one varlen forward over the global bounds. Needs
H % W == 0 and, with grouped value heads, HV % W == 0 (ValueError otherwise): rank d gets q/k heads
[d H/W, (d+1) H/W) and value heads [d HV/W, (d+1) HV/W), which are exactly the ones they serve.
Option `segment_len` (default None) splits long sequences on each device (forward only).

Training: with inputs that require grad both all-to-alls are `comm_grad.all_to_all_grad`, so the backward
is the two all-to-alls reversed (the output's gradient back to the head owners, then the input gradients
packed into one buffer back to the token owners), around the local chunked backward on H/W heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernels.cp import comm, comm_grad, intra
from kernels.cp.all_gather import to_global_order
from kernels.cp.context import CPContext
from kernels.dispatch import needs_grad
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["forward"]

OPTIONS = MODE_OPTIONS["headwise"]


def check(q: Tensor, v: Tensor, ctx: CPContext) -> None:
    H, HV = q.shape[2], v.shape[2]
    if H % ctx.world_size or HV % ctx.world_size:
        raise ValueError(f"mode 'headwise' needs the head counts divisible by the CP size, got H={H} (q.shape[2]), "
                         f"HV={HV} (v.shape[2]) and world_size={ctx.world_size}")


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    check(q, v, ctx)
    W, Tl, HV = ctx.world_size, ctx.local_len, v.shape[2]
    train = needs_grad(q, k, v, g, beta)
    # [1, Tl, H, *r] -> [W(dst), Tl, H/W, *r] views; the packing copy is the only copy on the way out
    blocks = [x[0].reshape(Tl, W, x.shape[2] // W, *x.shape[3:]).transpose(0, 1) for x in (q, k, v, g, beta)]
    got = comm_grad.all_to_all_grad(blocks, group) if train else comm.all_to_all_packed(blocks, group)
    qf, kf, vf, gf, bf = (to_global_order(x, ctx) for x in got)                    # [1, T, H/W, *r]
    cu = ctx.cu_seqlens
    seg = None if train else intra.resolve_segment_len(
        options["segment_len"], [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)], HV // W, q.device)
    o = intra.split_forward(op, qf, kf, vf, gf, bf, cu, seg_len=seg, backend=backend, launch=launch,
                            scale=scale)  # [1, T, HV/W, V]
    send = _to_rank_order(o[0], ctx)                                               # [W(dst), Tl, HV/W, V]
    back = comm_grad.all_to_all_grad([send], group)[0] if train else comm.all_to_all(send, group)
    return back.permute(1, 0, 2, 3).reshape(1, Tl, HV, o.shape[-1])               # [Tl, W(src heads), HV/W, V]


def _to_rank_order(o: Tensor, ctx: CPContext) -> Tensor:
    """`[T, ...]` in global order -> `[W, local_len, ...]`: each rank's shard (a view for contiguous)."""
    W, P, S = ctx.world_size, ctx.part_len, ctx.slots_per_rank
    rest = o.shape[1:]
    if S == 1:
        return o.reshape(W, P, *rest)
    rows = [p for r in range(W) for p in ctx.parts_of(r)]
    idx = ctx.index("rank_parts", rows, o.device)
    return torch.index_select(o.reshape(ctx.num_parts, P, *rest), 0, idx).reshape(W, S * P, *rest)
