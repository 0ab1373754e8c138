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

Training (`forward_saved` / `backward_saved`, through `kernels.cp.step_grad`): the gradient of the function the
step computes (the warmup estimate included, so it differs from the exact gradient exactly as the output
differs from the exact output): the local backward gives the gradient of each received window's E_win (its
dh0), the windows' backward turns it into gradients of the tail's k, v, g, beta, and those travel back to
the tail's owner: one packed send/recv per crossed boundary, the forward's pairs reversed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernels.cp import comm, intra, prims, true_cp
from kernels.cp.context import CPContext
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS, TAIL_EXCHANGE_WINDOW_CHUNKS, tail_exchange_options

__all__ = ["backward_saved", "forward", "forward_saved", "p2p_counts", "resolve_options"]

OPTIONS = MODE_OPTIONS["tail_exchange"]
resolve_options = tail_exchange_options  # (window chunks, fallback) from the options; ValueError naming the bad one


@dataclass(frozen=True)
class _Plan:
    """Host plan of one (context, window): what this rank sends and receives, and where the states go."""

    sends: tuple[tuple[int, int, int], ...]        # (local start, local end, destination rank)
    recvs: tuple[tuple[int | None, int, int], ...]  # per continued slot: (source rank or None = local, start, tokens)
    rows: tuple[int, ...]                          # per continued slot: index of its first piece among local pieces
    win_bounds: tuple[int, ...]                    # bounds of the received windows, concatenated
    num_pieces: int


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
    plan = _plan(ctx, TAIL_EXCHANGE_WINDOW_CHUNKS)
    return len(plan.sends), sum(1 for src, _, _ in plan.recvs if src is not None)


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    window, fallback = resolve_options(options)
    if fallback == "true_cp":
        return true_cp.forward(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                               options=dict(true_cp.OPTIONS))
    return _step(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale, window=window)[0]


def _step(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
          backend: str, launch: LaunchPlan, scale: float | None, window: int) -> tuple[Tensor, Any]:
    """(o, (entering states or None, the windows' k, v, g, beta or None)): the tail exchange step."""
    plan = _plan(ctx, window)
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
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
    h0, win = None, None
    if windows:
        win = tuple(torch.cat([w[i] for w in windows], 1) if len(windows) > 1 else windows[0][i] for i in range(4))
        _, E = prims.trans(op, *win, plan.win_bounds, backend=backend, launch=launch)
        if plan.num_pieces == 1:
            h0 = E
        else:
            h0 = torch.zeros(plan.num_pieces, H, K, V, dtype=torch.float32, device=dev)
            h0.index_copy_(0, _rows(ctx, plan, window, dev), E)
    o, _ = prims.fwd(op, q, k, v, g, beta, ctx.local_cu_seqlens, h0=h0, backend=backend, launch=launch, scale=scale)
    comm.wait_all(works)
    return o, (h0, win)


def _rows(ctx: CPContext, plan: _Plan, window: int, dev: torch.device) -> Tensor:
    return ctx.index(f"tail_exchange:rows:{window}", plan.rows, dev)


def forward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
                  backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> tuple[Tensor, Any]:
    """The step, saving the entering states and the received windows (fallback "true_cp": true_cp's)."""
    window, fallback = resolve_options(options)
    if fallback == "true_cp":
        return true_cp.forward_saved(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                                     options=dict(true_cp.OPTIONS))
    return _step(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale, window=window)


def backward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, saved: Any, *,
                   group: Any, ctx: CPContext, backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any],
                   ) -> tuple[Tensor, ...]:
    """The gradient of the function the step computes: local backward (dh0 of the continued pieces = the
    gradient of each window's E_win), the windows' backward from that dht (do = 0, zero start), and the
    window gradients of k, v, g, beta sent back to the tail's owner (one packed message per crossed boundary,
    the forward's pairs reversed), where they add to its input gradients."""
    window, fallback = resolve_options(options)
    if fallback == "true_cp":
        return true_cp.backward_saved(op, q, k, v, g, beta, do, saved, group=group, ctx=ctx, backend=backend, launch=launch,
                                      scale=scale, options=dict(true_cp.OPTIONS))
    h0, win = saved
    plan = _plan(ctx, window)
    dev = k.device
    xs = (k, v, g, beta)
    pending, incoming = [], []
    for a, b, dst in plan.sends:                      # post the receives of the tails' gradients first
        like = [((1, b - a, *x.shape[2:]), x.dtype) for x in xs]
        work, views = comm.irecv_packed(like, dst, group, dev)
        pending.append(work)
        incoming.append((a, b, views))
    dq, dk, dv, dg, dbeta, dh0 = prims.bwd(op, q, k, v, g, beta, do, ctx.local_cu_seqlens, h0=h0, backend=backend,
                                           launch=launch, scale=scale)
    grads = [dq, dk, dv, dg, dbeta]
    works, keep = [], []
    if win is not None:
        assert dh0 is not None
        dE = dh0 if plan.num_pieces == 1 else dh0.index_select(0, _rows(ctx, plan, window, dev))
        kw = win[0]
        dw = prims.bwd(op, torch.zeros_like(kw), *win, torch.zeros(*win[1].shape, dtype=q.dtype, device=dev),
                       plan.win_bounds, dht=dE, backend=backend, launch=launch, scale=scale)[1:5]
        wb = plan.win_bounds
        for j, (src, a, n) in enumerate(plan.recvs):
            parts = [d[:, wb[j]:wb[j + 1]] for d in dw]
            if src is None:                           # zigzag rank W-1: its own front part's tail
                for gr, d in zip(grads[1:], parts, strict=True):
                    gr[:, a:a + n] += d
            else:
                work, buf = comm.isend_packed(parts, src, group)
                works.append(work)
                keep.append(buf)
    comm.wait_all(pending)
    for a, b, views in incoming:
        for gr, d in zip(grads[1:], views, strict=True):
            gr[:, a:b] += d
    comm.wait_all(works)
    return tuple(grads)
