"""FLA as a user installs it (`backend: fla_dispatch`): FLA's chunk op with its backend dispatch on, each point naming
the implementation FLA's dispatch actually ran, read from FLA's registry (`runners.peers.fla_registry`).

`none` only (fwd and fwd+bwd): a dispatched FlashQLA already runs its own intra-card CP inside FLA's op, and FLA's
CP schemes are `backend: fla`'s (FLA's Triton path, pinned). The point's report holds
`fla_dispatch: {"op": "flash_qla" | "tilelang" | "flash_kda" | "triton", "calls": {function: backend}}`.
FLA is imported only when a point runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from runners.peers import Peer
from runners.peers.fla import hopper_guard
from runners.peers.fla_registry import DISABLE_ENV, DispatchRecord, config_cache_note, recording
from runners.point import PointSpec

__all__ = ["FLA_DISPATCH"]


class _FLADispatch(Peer):
    name = "fla_dispatch"
    modes = {"none": ("fwd", "fwd+bwd")}
    unsupported = dict.fromkeys(
        ("headwise", "all_gather", "ring", "true_cp", "warmup_correct", "tail_exchange"),
        "FLA as dispatched is timed on its chunk op alone; a dispatched FlashQLA already splits inside `none` "
        "(its intra-card CP), and FLA's CP schemes are `backend: fla`'s; use `backend: flash_qla` for FlashQLA's modes",
    )
    options = {"bypass_hopper_guard": False}
    first_call_s = 600.0  # FLA's Triton autotune or a dispatched FlashQLA's TileLang JIT (minutes on a cold cache)

    def __init__(self) -> None:
        self._record = DispatchRecord()

    def skip_reason(self, point: PointSpec) -> str | None:
        if point.K > 256:
            return f"FLA asserts K <= 256, got K={point.K}"
        return None

    def available(self) -> str | None:
        if importlib.util.find_spec("fla") is None:
            return "flash-linear-attention (fla-core) is not installed"
        if os.environ.get(DISABLE_ENV) == "1":
            return f"{DISABLE_ENV}=1 in this process: FLA's dispatch is off, so FLA as installed cannot be measured"
        if not torch.cuda.is_available():
            return "FLA's kernels need a CUDA GPU"
        return None

    def step_context(self, options: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """Around each step (forward + backward): record what FLA's dispatch runs; the Hopper-guard opt-in."""
        stack = contextlib.ExitStack()
        stack.enter_context(recording(self._record))
        stack.enter_context(hopper_guard(options))
        return stack

    def forward(self, mode: str, op: str, *inputs: Tensor, **call: Any) -> Tensor:
        """FLA's chunk op over the varlen batch, dispatched as FLA decides; what ran goes to the point's report."""
        from kernels.cp import prims

        if mode != "none":
            raise ValueError(f"backend 'fla_dispatch' does not implement mode {mode!r}")
        scale = call["scale"]
        s = inputs[0].shape[-1] ** -0.5 if scale is None else scale
        with recording(self._record), hopper_guard(call["options"] or {}):
            q, k, v, g, beta = inputs
            return prims.fwd(op, q, k, v, g, beta, call["ctx"].cu_seqlens, backend="fla", scale=s)[0]

    def begin_point(self, point: PointSpec) -> None:
        """A new point: forget what the last one ran."""
        self._record = DispatchRecord()

    def point_report(self, point: PointSpec) -> dict[str, Any]:
        """What FLA's dispatch ran for the point (read after its steps), and the config cache FLA's Triton kernels
        read instead of autotuning (`fla_config_cache`, None: FLA's own autotune)."""
        return {"fla_dispatch": self._record.as_dict(point.op), "fla_config_cache": config_cache_note()}


FLA_DISPATCH = _FLADispatch()
