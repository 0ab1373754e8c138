"""The CP scheme registry and `cp.forward`: validate once, then dispatch to one scheme module.

`MODES` maps each scheme name to its module (each exposes `forward(...)` and its `OPTIONS` defaults).
`expected_collectives(mode, ctx)` says what one step of a mode issues on this rank, from the context
alone: what the tests assert against the profiler and what a runner can store next to its measurement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.backends import resolve_backend
from kernels.cp import all_gather, comm, headwise, none, ring, step_grad, tail_exchange, true_cp
from kernels.cp import warmup_correct as warmup_module
from kernels.cp.context import CPContext, build_context
from kernels.dispatch import needs_grad
from kernels.plan import LaunchPlan, default_plan
from kernels.validate import check_backend, check_op
from kernels.vocabulary import (
    AUTOGRAD_MODES,
    COUNTED_DIRECTIONS,
    HAND_BACKWARD,
    MODE_OPTIONS,
    SINGLE_DEVICE,
    collective_count,
)

__all__ = ["AUTOGRAD_MODES", "COUNTED_DIRECTIONS", "MODES", "SINGLE_DEVICE", "expected_collectives",
           "expected_collectives_gang", "forward", "merge_rank_counts"]

logger = logging.getLogger(__name__)


class _WarmupMode:
    """Adapter: `cp.forward("warmup_correct", ...)` runs `cp.warmup_correct` on the whole batch (W = 1)."""

    OPTIONS = MODE_OPTIONS["warmup_correct"]

    @staticmethod
    def forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: CPContext,
                backend: str, launch: LaunchPlan, scale: float | None, options: dict[str, Any]) -> Tensor:
        if ctx.world_size != 1:
            raise ValueError(f"mode 'warmup_correct' runs on one device: build its context with world_size=1 and pass "
                             f"the whole batch, got ctx.world_size={ctx.world_size}")
        o, _ = warmup_module.warmup_correct(op, q, k, v, g, beta, cu_seqlens=ctx.cu_seqlens, backend=backend,
                                            scale=scale, plan=launch, **options)
        return o


MODES: dict[str, Any] = {
    "none": none,
    "headwise": headwise,
    "all_gather": all_gather,
    "ring": ring,
    "true_cp": true_cp,
    "warmup_correct": _WarmupMode,
    "tail_exchange": tail_exchange,
}

# MODES' keys are kernels.vocabulary.MODES, in its order; SINGLE_DEVICE (W must be 1) is the vocabulary's
# point-to-point kinds: a gang's count is the sum over ranks (group collectives: the max over ranks)
P2P = ("send", "recv")
# HAND_BACKWARD (a hand-written backward: kernels.cp.step_grad) and AUTOGRAD_MODES (plain autograd through the
# differentiable op, so the triton backend's recompute policy `LaunchPlan.keep` applies) are the vocabulary's too


def expected_collectives(mode: str, ctx: CPContext, options: Mapping[str, Any] | None = None,
                         direction: str = "fwd") -> dict[str, int]:
    """Collectives one step of `mode` issues on this rank: keys all_to_all, all_gather, reduce_scatter, send, recv
    (zeros omitted). `kernels.vocabulary.collective_count` over the context's facts: whether a sequence crosses a
    part boundary and the point-to-point hand-offs this rank posts (the same for ring and tail_exchange).

    `options`: the mode options of the step, where they change the count (tail_exchange's `fallback`).
    `direction`: `"fwd"` (the forward), `"bwd"` (the backward alone) or `"fwd+bwd"` (their sum; README §7).
    """
    sends, recvs = ring.p2p_counts(ctx)
    return collective_count(mode, crossing=ctx.any_crossing, sends=sends, recvs=recvs, options=options,
                            direction=direction)


def expected_collectives_gang(mode: str, cu_seqlens: Sequence[int], world_size: int, layout: str = "contiguous",
                              options: Mapping[str, Any] | None = None,
                              direction: str = "fwd") -> tuple[dict[str, int], list[dict[str, int]]]:
    """(the gang's count, each rank's count) of one step of `mode` in `direction`: `expected_collectives` on every
    rank, merged as the profiler merges ranks (send/recv summed over the ranks, group collectives the max)."""
    per_rank = [expected_collectives(mode, build_context(cu_seqlens, world_size, r, layout), options, direction)
                for r in range(world_size)]
    return merge_rank_counts(per_rank), per_rank


def merge_rank_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The gang's value per collective kind from each rank's (counts or bytes), as the profiler merges ranks:
    send/recv summed over the ranks, group collectives the max; kinds sorted."""
    counts = list(counts)
    kinds = sorted({k for c in counts for k in c})
    return {k: (sum if k in P2P else max)(c.get(k, 0) for c in counts) for k in kinds}


def _check_mode(mode: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}, got mode={mode!r}")


def _check_inputs(op: str, q: Any, k: Any, v: Any, g: Any, beta: Any, ctx: CPContext) -> None:
    """Metadata checks before any collective (so one rank's bad input fails fast instead of hanging the group)."""
    T = ctx.local_len
    for name, x, ndim in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 3 if op == "gdn" else 4), ("beta", beta, 3)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != ndim or x.shape[0] != 1 or x.shape[1] != T:
            raise ValueError(f"{name} must be {ndim}-D [1, {T}, ...] (B = 1, the rank's {T} local tokens of the context), "
                             f"got {name}.shape={tuple(x.shape)}")
    H, HV = q.shape[2], v.shape[2]
    if HV % H:
        raise ValueError(f"v.shape[2] (value heads HV) must be a multiple of q.shape[2]={H}, got {tuple(v.shape)}")
    for name, x, heads in (("q", q, H), ("k", k, H), ("v", v, HV), ("g", g, HV), ("beta", beta, HV)):
        if x.shape[2] != heads:
            label = "H = q.shape[2]" if name in ("q", "k") else "HV = v.shape[2]"
            raise ValueError(f"{name}.shape[2] (heads) must be {heads} ({label}), got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got k.shape={tuple(k.shape)}")
    if op == "kda" and g.shape[3] != q.shape[3]:
        raise ValueError(f"g must be [1, T, H, K] for op='kda', got g.shape={tuple(g.shape)}")


def forward(
    mode: str,
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    group: Any,
    ctx: CPContext,
    backend: str = "auto",
    scale: float | None = None,
    options: Mapping[str, Any] | None = None,
    plan: LaunchPlan | None = None,
) -> Tensor:
    """The local output of one CP scheme step: this rank's tokens, equal to a single-device run over the whole batch.

    Args:
        mode (str):
            one of `MODES`: none, headwise, all_gather, ring, true_cp, warmup_correct, tail_exchange.
        op (str):
            `"gdn"` or `"kda"`.
        q, k, v, g, beta (torch.Tensor):
            the rank's shard (`cp.shard` of the global `[1, T, ...]` tensors), B = 1: `[1, local_len, H, K]` etc.
            For `none`/`warmup_correct` the whole batch with a world_size=1 context.
        group (ProcessGroup | None):
            the CP group (its size and this rank must match the context); unused by the single-device modes.
        ctx (CPContext):
            `cp.build_context(global cu_seqlens, world_size, rank, layout)`.
        backend (str):
            primitive backend: `"auto"` (triton on CUDA, torch elsewhere), `"triton"`, `"torch"`, `"reference"`.
        scale (float | None):
            output scale. Default: `None` (K ** -0.5).
        options (Mapping | None):
            mode knobs, defaults in each scheme's `OPTIONS`: `segment_len` (none, headwise, all_gather, true_cp:
            intra-device exact split), `segments`/`tol`/`window`/`fallback` (warmup_correct), `window`/`fallback`
            (tail_exchange: `"none"` or `"true_cp"`).
        plan (LaunchPlan | None):
            the launch plan of the step's primitives (`kernels.plan`: configs, recompute policy, recorder; the
            backward launches with the same). Default: `None` (`kernels.default_plan()`).

    Training: with inputs that require grad (and grad enabled) the output carries autograd: `o.backward(do_local)`
    on EVERY rank gives each rank the gradients of its local q, k, v, g, beta (the backward issues collectives;
    kernels/cp/README.md §7 lists them per scheme). Grouped value heads: v, g, beta with HV = G * H heads.

    Returns:
        torch.Tensor: `[1, local_len, HV, V]` in q's dtype.

    Raises:
        ValueError: unknown mode/op/backend/option; shapes that do not match the context; a group whose size or
            rank differs from the context; H % W != 0 or HV % W != 0 for headwise; W > 1 for the single-device
            modes; training ring/true_cp/tail_exchange/warmup_correct on the reference backend.
    """
    _check_mode(mode)
    check_op(op)
    check_backend(backend)
    if not isinstance(ctx, CPContext):
        raise ValueError(f"ctx must be a CPContext from kernels.cp.build_context, got {type(ctx).__name__}")
    _check_inputs(op, q, k, v, g, beta, ctx)
    scheme = MODES[mode]
    opts = dict(scheme.OPTIONS)
    for key, val in (options or {}).items():
        if key not in opts:
            raise ValueError(f"unknown option {key!r} for mode {mode!r}; known: {sorted(opts)}")
        opts[key] = val
    if mode == "headwise":
        headwise.check(q, v, ctx)
    if mode == "tail_exchange":
        tail_exchange.resolve_options(opts)
    train = needs_grad(q, k, v, g, beta)
    if train and mode in (*HAND_BACKWARD, "warmup_correct") and resolve_backend(backend, q.device) == "reference":
        raise ValueError(f"mode {mode!r} trains on the 'torch' or 'triton' backend (its backward is the chunked one), "
                         f"got backend='reference'")
    if mode not in SINGLE_DEVICE:
        W, r = comm.group_size(group), comm.group_rank(group)
        if (W, r) != (ctx.world_size, ctx.rank):
            raise ValueError(f"group has size {W} and this rank is {r}, but ctx was built for world_size="
                             f"{ctx.world_size}, rank={ctx.rank}")
    group_size = v.shape[2] // q.shape[2]
    if group_size > 1 and mode in (*HAND_BACKWARD, "warmup_correct") and resolve_backend(backend, q.device) != "triton":
        # grouped value heads on torch: these schemes run the transition and the backward on HV heads (autograd sums
        # the G gradients of each q/k head); triton's primitives and every other scheme take the grouped inputs as
        # they are (the kernels read the shared q/k head)
        q, k = q.repeat_interleave(group_size, dim=2), k.repeat_interleave(group_size, dim=2)
    launch = plan if plan is not None else default_plan()
    with torch.profiler.record_function(f"cp::{mode}"):
        if train and mode in HAND_BACKWARD:
            return step_grad.apply(scheme, q, k, v, g, beta, op=op, group=group, ctx=ctx, backend=backend,
                                   launch=launch, scale=scale, options=opts)
        return scheme.forward(op, q, k, v, g, beta, group=group, ctx=ctx, backend=backend, launch=launch, scale=scale,
                              options=opts)
