"""The only module of the suite that calls torch.distributed: packed all-to-all, packed all-gather, reduce-scatter, send/recv.

Every collective moves ONE buffer: tensors of mixed dtypes (bf16 q/k/v with fp32 g, say) are packed
byte-wise into a `[rows, row_bytes]` uint8 buffer, each field at a 16-byte aligned offset, so one
all_to_all / all_gather carries all of them; unpacking returns dtype views into the received buffer
(no copy). Nothing here reads tensor values on the host.

    q_all, k_all = all_gather_packed([q, k], group)          # each [W, *shape]
    recv_blocks = all_to_all_packed([q_by_dst, g_by_dst], group)   # [W(dst), ...] -> [W(src), ...]
    mine = reduce_scatter(partials_by_dst, group)             # [W(dst), ...] summed over ranks -> [...]
    work, buf = isend_packed([k_tail, v_tail, g_tail, b_tail], dst, group)   # one message for several tensors
    work, (k_t, v_t, g_t, b_t) = irecv_packed([(shape, dtype), ...], src, group, device)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from kernels.configs import cdiv

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Work

__all__ = [
    "all_gather",
    "all_gather_packed",
    "all_to_all",
    "all_to_all_packed",
    "group_rank",
    "group_size",
    "irecv",
    "irecv_packed",
    "isend",
    "isend_packed",
    "pack_rows",
    "reduce_scatter",
    "unpack_rows",
    "wait_all",
]

logger = logging.getLogger(__name__)

# torch >= 2.12 names it reduce_scatter_single (reduce_scatter_tensor deprecated); the same c10d op underneath
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALIGN = 16  # byte alignment of every packed field (>= the largest element size, keeps dtype views legal)


def group_size(group: ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def group_rank(group: ProcessGroup | None) -> int:
    return dist.get_rank(group)


def _global(group: ProcessGroup | None, group_rank_: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank_
    return dist.get_global_rank(group, group_rank_)


def _aligned(n: int) -> int:
    return cdiv(n, _ALIGN) * _ALIGN


def _field_bytes(x: Tensor, rows: int) -> int:
    return (x.numel() // rows) * x.element_size()


def pack_rows(tensors: Sequence[Tensor], rows: int) -> Tensor:
    """`[rows, row_bytes]` uint8 holding each tensor `[rows, ...]` byte-wise at an aligned offset of every row."""
    sizes = [_field_bytes(t, rows) for t in tensors]
    row_bytes = sum(_aligned(s) for s in sizes)
    buf = torch.empty(rows, row_bytes, dtype=torch.uint8, device=tensors[0].device)
    off = 0
    for t, s in zip(tensors, sizes, strict=True):
        if t.shape[0] != rows:
            raise ValueError(f"packed tensors need {rows} leading rows, got shape {tuple(t.shape)}")
        buf[:, off:off + s].view(t.dtype).view(t.shape).copy_(t)
        off += _aligned(s)
    return buf


def unpack_rows(buf: Tensor, like: Sequence[Tensor], rows: int) -> list[Tensor]:
    """Views of a received `[rows', row_bytes]` buffer shaped `[rows', *t.shape[1:]]` in each `like` tensor's dtype."""
    out = []
    off = 0
    for t in like:
        s = _field_bytes(t, rows)
        out.append(buf[:, off:off + s].view(t.dtype).view(buf.shape[0], *t.shape[1:]))
        off += _aligned(s)
    return out


def all_gather(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """`[W, *x.shape]`: every rank's `x` in rank order (one all_gather_into_tensor)."""
    W = group_size(group)
    x = x.contiguous().view(1, *x.shape) if x.dim() == 0 else x.contiguous()
    # the dim-0 concatenation is the output layout every backend accepts (gloo rejects a new leading dim)
    out = x.new_empty(W * x.shape[0], *x.shape[1:])
    dist.all_gather_into_tensor(out, x, group=group)
    return out.view(W, *x.shape)


def all_gather_packed(tensors: Sequence[Tensor], group: ProcessGroup | None) -> list[Tensor]:
    """One all-gather for several tensors of any dtypes: returns each as `[W, *t.shape]` (views of one buffer)."""
    if len(tensors) == 1:
        return [all_gather(tensors[0], group)]
    flat = [t.reshape(1, -1) for t in tensors]
    buf = pack_rows(flat, 1)                                          # [1, row_bytes]
    got = all_gather(buf[0], group)                                   # [W, row_bytes]
    return [f.view(got.shape[0], *t.shape) for f, t in zip(unpack_rows(got, flat, 1), tensors, strict=True)]


def reduce_scatter(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """`x [W, ...]` (one block per destination rank) summed over ranks: this rank's block `[...]` (one reduce-scatter)."""
    x = x.contiguous()
    out = x.new_empty(x[0].numel())
    _REDUCE_SCATTER(out, x.view(-1), group=group)
    return out.view(x.shape[1:])


def all_to_all(x: Tensor, group: ProcessGroup | None) -> Tensor:
    """`x [W, ...]` holds one block per destination rank; returns `[W, ...]` with one block per source rank."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def all_to_all_packed(blocks: Sequence[Tensor], group: ProcessGroup | None) -> list[Tensor]:
    """One all-to-all for several tensors `[W(dst), ...]` of any dtypes; returns each as `[W(src), ...]` views."""
    if len(blocks) == 1:
        return [all_to_all(blocks[0], group)]
    W = blocks[0].shape[0]
    buf = pack_rows(blocks, W)                                        # [W(dst), row_bytes]
    got = all_to_all(buf, group)                                      # [W(src), row_bytes]
    return unpack_rows(got, blocks, W)


def isend(x: Tensor, dst: int, group: ProcessGroup | None) -> Work:
    """Start sending `x` to group rank `dst`; wait on the returned work (or pass it to `wait_all`)."""
    return dist.isend(x.contiguous(), _global(group, dst), group=group)


def irecv(x: Tensor, src: int, group: ProcessGroup | None) -> Work:
    """Start receiving into `x` (contiguous) from group rank `src`."""
    return dist.irecv(x, _global(group, src), group=group)


def wait_all(works: Sequence[Work]) -> None:
    for w in works:
        w.wait()


def isend_packed(tensors: Sequence[Tensor], dst: int, group: ProcessGroup | None) -> tuple[Work, Tensor]:
    """One isend of several tensors of any dtypes, packed byte-wise; keep the returned buffer alive until the work ends."""
    buf = pack_rows([t.reshape(1, -1) for t in tensors], 1)[0]
    return isend(buf, dst, group), buf


def irecv_packed(like: Sequence[tuple[tuple[int, ...], torch.dtype]], src: int, group: ProcessGroup | None,
                 device: torch.device) -> tuple[Work, list[Tensor]]:
    """Post the receive of an `isend_packed` message of tensors with the given (shape, dtype): views valid after wait."""
    metas = [torch.empty(1, math.prod(shape), dtype=dt, device="meta") for shape, dt in like]
    row_bytes = sum(_aligned(_field_bytes(m, 1)) for m in metas)
    buf = torch.empty(1, row_bytes, dtype=torch.uint8, device=device)
    work = irecv(buf[0], src, group)
    views = [x.view(shape) for x, (shape, _) in zip(unpack_rows(buf, metas, 1), like, strict=True)]
    return work, views
