"""ring: the state travels along the chain of parts; rank r waits for its predecessor's final state (serial).

Per slot (part) of the rank, in slot order: pieces that start in this part do not wait: they run first
(zero entering state) and, if the part's last piece carries its sequence on, its final state is sent to
the next part's owner at once; then the continued first piece waits for the state of the previous part,
runs from it, and (when it is also the last piece) sends its final state on. Zigzag: a rank holds two
links of the chain, and rank W-1 hands its front part's state to its back part locally. Point-to-point
count: one send per boundary a sequence crosses between parts on different ranks (W-1 for one sequence
over contiguous shards, 2W-2 for zigzag). The critical path is the whole chain: no speedup by design.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernels.cp import comm, prims
from kernels.cp.context import CPContext, Slot

__all__ = ["forward", "p2p_counts"]

OPTIONS: dict[str, Any] = {}


def p2p_counts(ctx: CPContext) -> tuple[int, int]:
    """(sends, recvs) this rank posts in one step."""
    sends = sum(1 for s in ctx.slots if s.last.carries and ctx.part_owner[s.part + 1][0] != ctx.rank)
    recvs = sum(1 for s in ctx.slots if s.first.cont and ctx.part_owner[s.part - 1][0] != ctx.rank)
    return sends, recvs


def _bounds(pieces: Any, base: int) -> tuple[int, ...]:
    return (0, *(p.end - base for p in pieces))


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, scale: float | None, options: dict[str, Any]) -> Tensor:
    H, K, V = k.shape[2], k.shape[3], v.shape[3]
    outs: list[Tensor] = []
    works: list[Any] = []
    keep: list[Tensor] = []          # sent states stay alive until their sends complete
    local: dict[int, Tensor] = {}    # part -> entering state handed over inside this rank (zigzag rank W-1)

    def run(a: int, b: int, pieces: Any, h0: Tensor | None, final: bool) -> tuple[Tensor, Tensor | None]:
        xs = [x[:, a:b] for x in (q, k, v, g, beta)]
        init = None
        if h0 is not None and len(pieces) == 1:
            init = h0.unsqueeze(0)
        elif h0 is not None:
            init = torch.zeros(len(pieces), H, K, V, dtype=torch.float32, device=k.device)
            init[0] = h0
        return prims.fwd(op, *xs, _bounds(pieces, a), h0=init, final=final, backend=backend, scale=scale)

    def send(slot: Slot, ht: Tensor | None) -> None:
        if not slot.last.carries:
            return
        assert ht is not None
        state = ht[-1].contiguous()
        dst = ctx.part_owner[slot.part + 1][0]
        if dst == ctx.rank:
            local[slot.part + 1] = state
        else:
            keep.append(state)
            works.append(comm.isend(state, dst, group))

    def recv(slot: Slot) -> Tensor:
        src = ctx.part_owner[slot.part - 1][0]
        if src == ctx.rank:
            return local.pop(slot.part)
        buf = torch.empty(H, K, V, dtype=torch.float32, device=k.device)
        comm.irecv(buf, src, group).wait()
        return buf

    for slot in ctx.slots:
        first, pieces = slot.first, slot.pieces
        if first.cont and len(pieces) > 1:
            o_rest, ht = run(pieces[1].start, slot.last.end, pieces[1:], None, slot.last.carries)
            send(slot, ht)
            o_first, _ = run(first.start, first.end, pieces[:1], recv(slot), False)
            outs += [o_first, o_rest]
        else:
            h0 = recv(slot) if first.cont else None
            o, ht = run(first.start, slot.last.end, pieces, h0, slot.last.carries)
            send(slot, ht)
            outs.append(o)
    comm.wait_all(works)
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
