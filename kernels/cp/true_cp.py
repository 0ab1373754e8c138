"""true_cp (KCP): every rank summarises its carried piece(s) as (M, S_ext) in parallel, ONE all-gather, fold, run.

Per rank: one varlen `transition` call gives the maps of the pieces that need them (each slot's last
piece when it carries its sequence on; with intra-device splitting, every sub-segment of long pieces),
`kernels.cp.intra` chains them into each slot's summary [M | S_ext] (fp32 `[slots, H, K, K+V]`), and one
all_gather_into_tensor moves every rank's summaries (skipped when no sequence crosses a part boundary:
then there is nothing to fold). Rank r folds, for each continued first piece, the summaries of its
predecessor parts in chain (global token) order: S <- M_p S + S_ext_p (zigzag: up to 2W-1 parts, some on
this very rank), then one varlen forward over the local (sub-)segments runs from the merged states.

Option `segment_len` (None: never; an int: sub-segments of that many tokens; "auto", the default: no
split of our own on the triton backend, whose primitives already split long sequences across the SMs
(kernels/common/seqsplit.py), and a split by the SM count for the torch backend on CUDA, none on CPU):
intra-device sequence parallelism, exact (no truncation), so a rank's serial chain is one sub-segment
instead of its whole shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernels.backends import resolve_backend
from kernels.cp import comm, intra, prims
from kernels.cp.context import CPContext

__all__ = ["forward"]

OPTIONS = {"segment_len": "auto"}


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, scale: float | None, options: dict[str, Any]) -> Tensor:
    H, K, V = k.shape[2], k.shape[3], v.shape[3]
    dev = k.device
    pieces = ctx.pieces
    specs = tuple(intra.PieceSpec(p.start, p.end, p.cont, p.carries) for p in pieces)
    seg_opt = options["segment_len"]
    if seg_opt == "auto" and resolve_backend(backend, dev) == "triton":
        seg_opt = None   # the triton primitives split long sequences themselves (kernels/common/seqsplit.py)
    seg = intra.resolve_segment_len(seg_opt, [p.length for p in pieces], H, dev)
    plan = intra.build_plan(specs, seg)
    X = intra.chain_states(op, k, v, g, beta, plan, backend=backend)
    h0 = None
    if ctx.any_crossing:
        chain_pos = {piece: c for c, piece in enumerate(plan.chain)}
        first_idx = _slot_piece_indices(ctx)
        summ = torch.zeros(ctx.slots_per_rank, H, K, K + V, dtype=torch.float32, device=dev)
        for s, slot in enumerate(ctx.slots):
            if slot.last.carries:
                assert X is not None
                summ[s].copy_(intra.totals(plan, X, chain_pos[first_idx[s][1]]))
        gathered = comm.all_gather(summ, group)                                      # [W, slots, H, K, K+V]
        if plan.with_m and any(pieces[i].cont for i in plan.chain):
            h0 = torch.zeros(len(plan.chain), H, K, V, dtype=torch.float32, device=dev)
            for s, slot in enumerate(ctx.slots):
                if slot.first.cont:
                    h0[chain_pos[first_idx[s][0]]].copy_(_fold(gathered, slot.preds, ctx, K))
    S0 = intra.initial_states(plan, X, h0, H=H, K=K, V=V, device=dev)
    o, _ = prims.fwd(op, q, k, v, g, beta, plan.sub_bounds, h0=S0, backend=backend, scale=scale)
    return o


def _slot_piece_indices(ctx: CPContext) -> list[tuple[int, int]]:
    """Per slot: (index of its first piece, index of its last piece) in ctx.pieces."""
    out, i = [], 0
    for slot in ctx.slots:
        out.append((i, i + len(slot.pieces) - 1))
        i += len(slot.pieces)
    return out


def _fold(gathered: Tensor, preds: tuple[int, ...], ctx: CPContext, K: int) -> Tensor:
    """The state entering a continued piece: fold the predecessors' summaries in chain order (fp32 `[H, K, V]`)."""
    r, s = ctx.part_owner[preds[0]]
    S = gathered[r, s, ..., K:]
    for p in preds[1:]:
        r, s = ctx.part_owner[p]
        S = torch.baddbmm(gathered[r, s, ..., K:], gathered[r, s, ..., :K], S)
    return S
