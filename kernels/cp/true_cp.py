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

Training (`forward_saved` / `backward_saved`, through `kernels.cp.step_grad`; no intra-device split): the
backward mirrors the merge (README §7): each rank's backward segment term G (the gradient reaching a
continued piece's entering state from its own outputs, dht = 0), ONE all-gather of G (fp32 `[slots, H, K, V]`;
the M of every part is already on every rank from the forward's all-gather, saved), the reverse chain from the
last part down, and the merged gradient entering the local backward of the carried piece as dht.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernels.backends import resolve_backend
from kernels.cp import comm, intra, prims
from kernels.cp.context import CPContext
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["backward_saved", "forward", "forward_saved"]

OPTIONS = MODE_OPTIONS["true_cp"]


def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
            backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
    return _step(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                 seg_opt=options["segment_len"])[0]


def _step(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
          backend: str, launch: LaunchPlan, scale: float | None, seg_opt: Any) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(o, entering states of the forward's (sub-)segments or None, the gathered summaries or None)."""
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    dev = k.device
    pieces = ctx.pieces
    specs = tuple(intra.PieceSpec(p.start, p.end, p.cont, p.carries) for p in pieces)
    if seg_opt == "auto" and resolve_backend(backend, dev) == "triton":
        seg_opt = None   # the triton primitives split long sequences themselves (kernels/common/seqsplit.py)
    seg = intra.resolve_segment_len(seg_opt, [p.length for p in pieces], H, dev)
    plan = intra.build_plan(specs, seg)
    X = intra.chain_states(op, k, v, g, beta, plan, backend=backend, launch=launch)
    h0 = None
    gathered = None
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
    o, _ = prims.fwd(op, q, k, v, g, beta, plan.sub_bounds, h0=S0, backend=backend, launch=launch, scale=scale)
    return o, S0, gathered


def forward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
                  backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> tuple[Tensor, Any]:
    """The step without intra-device splitting (one forward over the local pieces); saves S0 and the summaries."""
    o, S0, gathered = _step(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                            seg_opt=None)
    return o, (S0, gathered)


def backward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, saved: Any, *,
                   group: Any, ctx: CPContext, backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any],
                   ) -> tuple[Tensor, ...]:
    """The mirror of the forward merge (README §7): each continued first piece's backward segment term G (the
    gradient of its entering state with dht = 0), ONE all-gather of G, the reverse chain
    dS_p = G_{p+1} + M_{p+1}^T dS_{p+1} from the sequence's last part down (M from the forward's gathered summaries,
    never differentiated), and ONE local backward with the merged dS as the carried last piece's dht.

    A rank that carries no state out (the last part of every sequence it holds) gets G from its one backward,
    run before the all-gather (its dht is zero). A rank that does carry one needs G before it knows its dht: it
    gets G from `prims.state_grad` (on triton the WY prep and the reverse state pass, not the whole backward) and
    runs its one backward after the all-gather."""
    S0, gathered = saved
    xs = (q, k, v, g, beta)
    bounds = ctx.local_cu_seqlens
    if gathered is None:
        return tuple(prims.bwd(op, *xs, do, bounds, h0=S0, backend=backend, launch=launch, scale=scale)[:5])
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    first_idx = _slot_piece_indices(ctx)
    carries = any(slot.last.carries for slot in ctx.slots)
    continued = any(slot.first.cont for slot in ctx.slots)
    out = None
    if not carries:
        out = prims.bwd(op, *xs, do, bounds, h0=S0, backend=backend, launch=launch, scale=scale)
        dh0 = out[5]
    elif continued:
        dh0 = prims.state_grad(op, *xs, do, bounds, backend=backend, launch=launch, scale=scale)
    else:
        dh0 = None
    G = torch.zeros(ctx.slots_per_rank, H, K, V, dtype=torch.float32, device=k.device)
    for s, slot in enumerate(ctx.slots):
        if slot.first.cont:
            assert dh0 is not None
            G[s].copy_(dh0[first_idx[s][0]])
    G_all = comm.all_gather(G, group)                                                # [W, slots, H, K, V]
    if out is not None:
        return tuple(out[:5])
    dht = torch.zeros(len(bounds) - 1, H, K, V, dtype=torch.float32, device=k.device)
    for s, slot in enumerate(ctx.slots):
        if slot.last.carries:
            dht[first_idx[s][1]] = _reverse_fold(G_all, gathered, _successors(ctx, slot.part), ctx, K)
    return tuple(prims.bwd(op, *xs, do, bounds, h0=S0, dht=dht, backend=backend, launch=launch, scale=scale)[:5])


def _successors(ctx: CPContext, part: int) -> list[int]:
    """The parts that continue the sequence carried out of `part`, in chain order."""
    return [p for p in range(part + 1, ctx.num_parts) if part in ctx.part_preds[p]]


def _reverse_fold(G_all: Tensor, gathered: Tensor, succ: list[int], ctx: CPContext, K: int) -> Tensor:
    """The gradient of the state leaving the first part before `succ`: fold G and M^T from the last successor down."""
    r, s = ctx.part_owner[succ[-1]]
    dS = G_all[r, s]
    for p in reversed(succ[:-1]):
        r, s = ctx.part_owner[p]
        dS = torch.baddbmm(G_all[r, s], gathered[r, s, ..., :K].transpose(-1, -2), dS)
    return dS


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
