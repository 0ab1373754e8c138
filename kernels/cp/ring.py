"""ring: the state travels along the chain of parts; rank r waits for its predecessor's final state (serial).

Per slot (part) of the rank, in slot order: pieces that start in this part do not wait: they run first
(zero entering state) and, if the part's last piece carries its sequence on, its final state is sent to
the next part's owner at once; then the continued first piece waits for the state of the previous part,
runs from it, and (when it is also the last piece) sends its final state on. Zigzag: a rank holds two
links of the chain, and rank W-1 hands its front part's state to its back part locally. Point-to-point
count: one send per boundary a sequence crosses between parts on different ranks (W-1 for one sequence
over contiguous shards, 2W-2 for zigzag). The critical path is the whole chain: no speedup by design.

Training (`forward_saved` / `backward_saved`, through `kernels.cp.step_grad`): the backward is the chain run
backwards: the gradient of each sent state (dS, fp32 `[H, K, V]`) goes from rank r+1 to rank r, the same
count of send/recv pairs in the opposite direction, serial from the last part down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernels.cp import comm, prims
from kernels.cp.context import CPContext, Slot
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["backward_saved", "forward", "forward_saved", "p2p_counts"]

OPTIONS = MODE_OPTIONS["ring"]


def p2p_counts(ctx: CPContext) -> tuple[int, int]:
    """(sends, recvs) this rank posts in one step."""
    sends = sum(1 for s in ctx.slots if s.last.carries and ctx.part_owner[s.part + 1][0] != ctx.rank)
    recvs = sum(1 for s in ctx.slots if s.first.cont and ctx.part_owner[s.part - 1][0] != ctx.rank)
    return sends, recvs


def _bounds(pieces: Any, base: int) -> tuple[int, ...]:
    return (0, *(p.end - base for p in pieces))


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    return forward_saved(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                         options=options)[0]


@dataclass(frozen=True)
class _Run:
    """One forward call of the step: local tokens [a, b), its pieces, its entering state (None: zeros)."""

    slot: Slot
    a: int
    b: int
    pieces: tuple[Any, ...]
    h0: Tensor | None
    receives: bool      # its first piece's entering state came from the previous part
    sends: bool         # its last piece's final state went on to the next part


def forward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
                  backend: str, launch: LaunchPlan, scale: float | None,
                  options: dict[str, Any]) -> tuple[Tensor, list[_Run]]:
    """The ring step; also returns its runs (with their entering states) for the backward."""
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    outs: list[Tensor] = []
    runs: list[_Run] = []
    works: list[Any] = []
    keep: list[Tensor] = []          # sent states stay alive until their sends complete
    local: dict[int, Tensor] = {}    # part -> entering state handed over inside this rank (zigzag rank W-1)

    def run(slot: Slot, a: int, b: int, pieces: Any, h0: Tensor | None, final: bool) -> tuple[Tensor, Tensor | None]:
        xs = [x[:, a:b] for x in (q, k, v, g, beta)]
        init = None
        if h0 is not None and len(pieces) == 1:
            init = h0.unsqueeze(0)
        elif h0 is not None:
            init = torch.zeros(len(pieces), H, K, V, dtype=torch.float32, device=k.device)
            init[0] = h0
        runs.append(_Run(slot, a, b, tuple(pieces), init, h0 is not None, final))
        return prims.fwd(op, *xs, _bounds(pieces, a), h0=init, final=final, backend=backend, launch=launch, scale=scale)

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
        first, pieces, carries = slot.first, slot.pieces, slot.last.carries
        if first.cont and len(pieces) > 1:
            o_rest, ht = run(slot, pieces[1].start, slot.last.end, pieces[1:], None, carries)
            send(slot, ht)
            o_first, _ = run(slot, first.start, first.end, pieces[:1], recv(slot), False)
            outs += [o_first, o_rest]
        else:
            h0 = recv(slot) if first.cont else None
            o, ht = run(slot, first.start, slot.last.end, pieces, h0, carries)
            send(slot, ht)
            outs.append(o)
    comm.wait_all(works)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, 1)), runs


def backward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, runs: list[_Run], *,
                   group: Any, ctx: CPContext, backend: str, launch: LaunchPlan, scale: float | None,
                   options: dict[str, Any],
                   ) -> tuple[Tensor, ...]:
    """The mirror of the step: runs in reverse order; a run that sent its final state waits for that state's
    gradient from the next part (dht), runs the chunked backward, and sends the gradient of its entering state
    (dh0) to the previous part. Serial along the chain, from the last rank down (zigzag: rank W-1's back part
    hands its dh0 to its front part locally)."""
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    xs = (q, k, v, g, beta)
    grads = [torch.empty_like(x) for x in xs]
    works: list[Any] = []
    keep: list[Tensor] = []
    local: dict[int, Tensor] = {}    # part -> gradient of its final state, handed over inside this rank

    for r in reversed(runs):
        dht = None
        if r.sends:
            nxt = ctx.part_owner[r.slot.part + 1][0]
            if nxt == ctx.rank:
                d_last = local.pop(r.slot.part)
            else:
                d_last = torch.empty(H, K, V, dtype=torch.float32, device=k.device)
                comm.irecv(d_last, nxt, group).wait()
            dht = torch.zeros(len(r.pieces), H, K, V, dtype=torch.float32, device=k.device)
            dht[-1] = d_last
        out = prims.bwd(op, *(x[:, r.a:r.b] for x in xs), do[:, r.a:r.b], _bounds(r.pieces, r.a), h0=r.h0, dht=dht,
                        backend=backend, launch=launch, scale=scale)
        for gr, d in zip(grads, out[:5], strict=True):
            gr[:, r.a:r.b] = d
        if r.receives:
            dh0 = out[5]
            assert dh0 is not None
            prev = ctx.part_owner[r.slot.part - 1][0]
            if prev == ctx.rank:
                local[r.slot.part - 1] = dh0[0]
            else:
                state = dh0[0].contiguous()
                keep.append(state)
                works.append(comm.isend(state, prev, group))
    comm.wait_all(works)
    return tuple(grads)
