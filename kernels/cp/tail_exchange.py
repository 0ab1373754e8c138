"""tail_exchange: warmup_correct across ranks. Each continued piece rebuilds its entering state from the raw tail.

For every part boundary that a sequence crosses, the owner of the earlier part sends the last `window`
chunks of that sequence's raw inputs (k, v, g, beta, packed into ONE message, `comm.isend_packed`) to the
owner of the next part; the receiver runs one varlen `transition` over its received windows and takes the
end state from a zero start, E_win, as the entering state of its continued piece (the warmup estimate: it
drops M_win S(window start), small when the gates decay over the window). The window is clipped to the
sequence start and to the sender's part, so a sequence that starts within the window is exact. Then one
varlen forward over the local pieces. All sends are posted before any receive, and nothing waits on
computed state: the critical path is one point-to-point message plus the window transition and the local
forward. Zigzag rank W-1 hands its front part's tail to its back part locally. Point-to-point count: one
send/recv pair per crossed boundary between ranks (W-1 for one sequence over contiguous shards, 2W-2 zigzag).

Exactness is a per-call, host-visible choice (option `fallback`). A rigorous per-piece decision needs the
norm of the state at the window start, which depends on every earlier rank: deciding on the device
would need the exact summaries always, i.e. true_cp's all-gather in every step. So:

- `"none"` (default): the tail exchange alone, no all-gather; within a decay-dependent tolerance (as
  warmup_correct's `"none"`; the engine measures the error against `none` at every point).
- `"true_cp"`: the exact path of this call: `kernels.cp.true_cp` (one all-gather of [M | S_ext], no tails).

Option `window`: chunks of 64 tokens, or `"auto"` (2, as warmup_correct).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernels.cp import comm, intra, prims, true_cp
from kernels.cp.context import CPContext

__all__ = ["FALLBACKS", "forward", "p2p_counts", "resolve_options"]

OPTIONS: dict[str, Any] = {"window": "auto", "fallback": "none"}
FALLBACKS: tuple[str, ...] = ("none", "true_cp")
DEFAULT_WINDOW_CHUNKS = 2


@dataclass(frozen=True)
class _Plan:
    """Host plan of one (context, window): what this rank sends and receives, and where the states go."""

    sends: tuple[tuple[int, int, int], ...]        # (local start, local end, destination rank)
    recvs: tuple[tuple[int | None, int, int], ...]  # per continued slot: (source rank or None = local, start, tokens)
    rows: tuple[int, ...]                          # per continued slot: index of its first piece among local pieces
    win_bounds: tuple[int, ...]                    # bounds of the received windows, concatenated
    num_pieces: int


def resolve_options(options: dict[str, Any]) -> tuple[int, str]:
    """(window chunks, fallback) from the mode options; ValueError naming the bad option."""
    window, fallback = options["window"], options["fallback"]
    if window == "auto":
        window = DEFAULT_WINDOW_CHUNKS
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"option window must be 'auto' or an int >= 1 (chunks of {intra.CHUNK} tokens), got window={window!r}")
    if fallback not in FALLBACKS:
        raise ValueError(f"option fallback must be one of {FALLBACKS}, got fallback={fallback!r}")
    return window, fallback


def _window_len(ctx: CPContext, part: int, seq: int, window: int) -> int:
    """Tokens of the tail of `part` that continue into part+1: the last window chunks, clipped to seq and part starts."""
    end = (part + 1) * ctx.part_len
    return end - max(ctx.cu_seqlens[seq], part * ctx.part_len, end - window * intra.CHUNK)


@functools.lru_cache(maxsize=256)
def _plan(ctx: CPContext, window: int) -> _Plan:
    sends, recvs, rows = [], [], []
    wb = [0]
    first_idx = 0
    for slot in ctx.slots:
        last = slot.last
        if last.carries:
            dst = ctx.part_owner[slot.part + 1][0]
            if dst != ctx.rank:
                n = _window_len(ctx, slot.part, last.seq, window)
                sends.append((last.end - n, last.end, dst))
        if slot.first.cont:
            prev = slot.part - 1
            n = _window_len(ctx, prev, slot.first.seq, window)
            src, prev_slot = ctx.part_owner[prev]
            if src == ctx.rank:   # zigzag rank W-1: the front part's tail is local
                end = ctx.slots[prev_slot].last.end
                recvs.append((None, end - n, n))
            else:
                recvs.append((src, 0, n))
            rows.append(first_idx)
            wb.append(wb[-1] + n)
        first_idx += len(slot.pieces)
    return _Plan(sends=tuple(sends), recvs=tuple(recvs), rows=tuple(rows), win_bounds=tuple(wb), num_pieces=first_idx)


def p2p_counts(ctx: CPContext) -> tuple[int, int]:
    """(sends, recvs) this rank posts in one step with fallback `"none"` (the window does not change them)."""
    plan = _plan(ctx, DEFAULT_WINDOW_CHUNKS)
    return len(plan.sends), sum(1 for src, _, _ in plan.recvs if src is not None)


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, scale: float | None, options: dict[str, Any]) -> Tensor:
    window, fallback = resolve_options(options)
    if fallback == "true_cp":
        return true_cp.forward(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, scale=scale,
                               options=dict(true_cp.OPTIONS))
    plan = _plan(ctx, window)
    H, K, V = k.shape[2], k.shape[3], v.shape[3]
    dev = k.device
    xs = (k, v, g, beta)
    works, keep = [], []
    for a, b, dst in plan.sends:                       # every send first: nothing here waits on computed state
        work, buf = comm.isend_packed([x[:, a:b] for x in xs], dst, group)
        works.append(work)
        keep.append(buf)
    pending, windows = [], []
    for src, a, n in plan.recvs:
        if src is None:
            windows.append([x[:, a:a + n] for x in xs])
        else:
            like = [((1, n, *x.shape[2:]), x.dtype) for x in xs]
            work, views = comm.irecv_packed(like, src, group, dev)
            pending.append(work)
            windows.append(views)
    comm.wait_all(pending)
    h0 = None
    if windows:
        kw, vw, gw, bw = (torch.cat([w[i] for w in windows], 1) if len(windows) > 1 else windows[0][i] for i in range(4))
        _, E = prims.trans(op, kw, vw, gw, bw, plan.win_bounds, backend=backend)
        if plan.num_pieces == 1:
            h0 = E
        else:
            h0 = torch.zeros(plan.num_pieces, H, K, V, dtype=torch.float32, device=dev)
            h0.index_copy_(0, ctx.index(f"tail_exchange:rows:{window}", plan.rows, dev), E)
    o, _ = prims.fwd(op, q, k, v, g, beta, ctx.local_cu_seqlens, h0=h0, backend=backend, scale=scale)
    comm.wait_all(works)
    return o
