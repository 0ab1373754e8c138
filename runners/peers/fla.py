"""FLA's implementation of each CP mode (the `fla` backend as a peer): what FLA runs, what it cannot, and why.

| mode | FLA's implementation | directions |
|---|---|---|
| none | FLA's chunk op (`chunk_gated_delta_rule` / `chunk_kda`) over the varlen batch | fwd, fwd+bwd |
| true_cp | FLA's KCP: `fla.ops.cp.build_cp_context` (contiguous or zigzag) + the chunk op's `cp_context` | fwd, fwd+bwd |
| warmup_correct | FLA's intra-card CP (`FLA_INTRACARD_CP=1`, under `torch.inference_mode`, varlen) | fwd |
| headwise, all_gather | our collectives (`kernels.cp`) around FLA's chunk op | fwd |
| ring | FLA's chunk op with the final state passed from rank to rank (`kernels.cp.ring`) | fwd |
| tail_exchange | not run: it rebuilds states from tail maps, and FLA has no transition primitive | - |

The table is static: the grid reads it whether or not FLA is installed here (`skip_reason`), so a sweep is
expanded the same way on a server without FLA. FLA is imported only when a point runs (`forward`).

FLA's Hopper guard: FLA 0.6.0 refuses the gated GDN backward (`chunk_bwd_dqkwg`) on sm_90 with Triton >= 3.4.0,
< 3.7.1 (FLA #640: it miscompiles). Such points are skipped when the sweep is expanded, judged by the Triton
version installed where it is expanded, unless the spec opts in with `mode_options: {fla: {bypass_hopper_guard:
true}}` (then part of the point key); `hopper_guard(options)` lifts the guard for the duration of a step.
Backward (direction fwd+bwd): FLA's ops are autograd Functions; the runner times forward + `o.backward(do)`
inside `step_context(options)` (`hopper_guard(options)`: the guard sits in FLA's backward).

FLA's Triton path, pinned: FLA 0.6.0 dispatches its ops to other packages when they are installed (FlashQLA,
TileLang, FlashKDA). This backend always measures FLA's own Triton kernels: every forward and step runs inside
`runners.peers.fla_registry.pinned_to_triton()` (the effect of `FLA_DISABLE_BACKEND_DISPATCH=1`, but keeping FLA's
own Triton intra-card CP, itself a dispatch backend, for `warmup_correct`), and each point's report says so
(`fla_path`) and names what FLA's dispatch ran under the pin (`fla_ran`). FLA as installed is `backend: fla_dispatch` (`runners.peers.fla_dispatch`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from runners.peers import Peer, peer_options
from runners.peers.fla_registry import (
    DispatchRecord,
    config_cache_note,
    dispatch_disabled_at_import,
    pin_note,
    pinned_to_triton,
    recording,
)
from runners.point import PointSpec

__all__ = ["FLA", "HOPPER_GUARD", "hopper_guard", "hopper_guard_refusal", "triton_version"]

HOPPER_GUARD = ((3, 4, 0), (3, 7, 1))  # FLA refuses the gated GDN backward on sm_90 for Triton in [lo, hi)
_WC_DEFAULTS = {"segments": "auto", "tol": 1e-3, "window": "auto", "fallback": "auto"}


def triton_version() -> tuple[int, int, int] | None:
    """The installed Triton's (major, minor, patch), or None when it is not installed (read without importing it)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        text = version("triton")
    except (ImportError, PackageNotFoundError):
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def hopper_guard_refusal(op: str, direction: str, options: Mapping[str, Any], opt_in: str) -> str | None:
    """Why FLA refuses `op` in `direction` here under its Hopper guard (the GDN backward, judged by the installed
    Triton, unless `options` lift it), naming `opt_in`, the caller's way to lift it (a spec's mode_options, a CLI
    flag); None when it runs."""
    if op != "gdn" or direction == "fwd" or options.get("bypass_hopper_guard"):
        return None
    tv = triton_version()
    lo, hi = HOPPER_GUARD
    if tv is not None and not lo <= tv < hi:
        return None
    have = "is not installed here" if tv is None else "is " + ".".join(map(str, tv))
    return (f"FLA refuses the GDN backward on Hopper (sm_90) with Triton >= 3.4.0, < 3.7.1 (FLA #640: "
            f"chunk_bwd_dqkwg miscompiles); Triton {have}. Opt in with {opt_in}")


@contextlib.contextmanager
def hopper_guard(options: Mapping[str, Any]) -> Iterator[None]:
    """Lift FLA's Hopper guard on the GDN backward while inside, when `options["bypass_hopper_guard"]` is true."""
    if not options.get("bypass_hopper_guard"):
        yield
        return
    import fla.ops.common.chunk_o as chunk_o

    before = chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True
    try:
        yield
    finally:
        chunk_o.TRITON_ABOVE_3_7_1 = before


@contextlib.contextmanager
def _intracard() -> Iterator[None]:
    """FLA's intra-card CP backend on (it reads the variable on every call) under inference mode."""
    before = os.environ.get("FLA_INTRACARD_CP")
    os.environ["FLA_INTRACARD_CP"] = "1"
    try:
        with torch.inference_mode():
            yield
    finally:
        if before is None:
            os.environ.pop("FLA_INTRACARD_CP", None)
        else:
            os.environ["FLA_INTRACARD_CP"] = before


class _FLA(Peer):
    name = "fla"
    modes = {
        "none": ("fwd", "fwd+bwd"),
        "true_cp": ("fwd", "fwd+bwd"),
        "warmup_correct": ("fwd",),
        "headwise": ("fwd",),
        "all_gather": ("fwd",),
        "ring": ("fwd",),
    }
    unsupported = {
        "tail_exchange": "FLA has no transition primitive (its summary pass is fused into KCP), and tail_exchange "
                         "rebuilds entering states from the maps of tail windows",
    }
    direction_reasons = {
        "warmup_correct": "FLA's intra-card CP runs only under torch.inference_mode (forward only)",
        "headwise": "cpbench's collectives around FLA's op are timed forward only (not differentiated here)",
        "all_gather": "cpbench's collectives around FLA's op are timed forward only (not differentiated here)",
        "ring": "cpbench's state passing around FLA's op is timed forward only (not differentiated here)",
    }
    options = {"bypass_hopper_guard": False}
    # FLA autotunes on its first call: on our H200 (fresh Triton cache) 41-86 s for a forward at T=8K and about
    # 143 s more for KDA's backward; a GDN fwd+bwd point at T=64K outlasted a 175 s call. Added to the point's
    # time limit so the watchdog does not take the autotune for a hang (seconds with `FLA_CONFIG_DIR`).
    first_call_s = 600.0

    def __init__(self) -> None:
        self._contexts: dict[tuple[Any, ...], Any] = {}
        self._record = DispatchRecord()  # what FLA's dispatch ran under the pin (its intra-card CP, or nothing)

    def skip_reason(self, point: PointSpec) -> str | None:
        """FLA's own limits of a point (mode and direction were checked by `peer_skip_reason`)."""
        mode, op, direction = point.mode, point.op, point.direction
        opts = peer_options(self, point)
        if point.K > 256:
            return f"FLA asserts K <= 256, got K={point.K}"
        mode_opts = point.mode_options
        if mode == "warmup_correct":
            changed = {k: v for k, v in mode_opts.items() if _WC_DEFAULTS.get(k, v) != v}
            if changed:
                return (f"FLA's intra-card CP takes no warmup_correct options (it splits by FLA_INTRACARD_MAX_SPLITS), "
                        f"got {changed}")
        elif mode_opts.get("segment_len"):
            return f"mode '{mode}' with segment_len chains our transition maps; FLA has no transition primitive"
        return hopper_guard_refusal(op, direction, opts, "mode_options: {fla: {bypass_hopper_guard: true}}")

    def available(self) -> str | None:
        """Why FLA's points cannot run in this process (None: they can)."""
        if importlib.util.find_spec("fla") is None:
            return "flash-linear-attention (fla-core) is not installed"
        if not torch.cuda.is_available():
            return ("FLA's Triton kernels need a CUDA GPU (under the CPU Triton interpreter FLA's autotuner needs a "
                    "driver, and its fwd_h kernel does not interpret)")
        return None

    def step_context(self, options: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """Around each timed step (forward + backward): FLA's Triton path pinned; the Hopper-guard opt-in."""
        stack = contextlib.ExitStack()
        stack.enter_context(pinned_to_triton())
        stack.enter_context(recording(self._record))
        stack.enter_context(hopper_guard(options))
        return stack

    def begin_point(self, point: PointSpec) -> None:
        self._record = DispatchRecord()

    def point_report(self, point: PointSpec) -> dict[str, Any]:
        """Which of FLA's paths the point measured (always its Triton path), what pinned it, and what FLA's dispatch
        ran under the pin (`calls`: its intra-card CP for warmup_correct), and the config cache FLA read its
        autotuned configs from instead of autotuning (`fla_config_cache`, None: FLA's own autotune)."""
        return {"fla_path": pin_note(), "fla_ran": self._record.as_dict(point.op), "fla_config_cache": config_cache_note()}

    def expected_collectives(self, mode: str, ctx: Any, options: Mapping[str, Any]) -> dict[str, int]:
        """What one step issues on this rank: KCP one all_gather of the summaries (every rank, always); our
        collectives' count for the modes that wrap FLA's op; nothing for the one-device modes."""
        if mode == "true_cp":
            return {"all_gather": 1}
        if mode in ("headwise", "all_gather", "ring"):
            from kernels.cp import expected_collectives

            return expected_collectives(mode, ctx, {k: v for k, v in options.items() if k not in self.options})
        return {}

    def _cp_context(self, ctx: Any, group: Any, device: torch.device) -> Any:
        """FLA's CP context of our context (built once per bounds, rank, layout, group, device; FLA caches on
        the identity of the bounds tensor, so the same tensors are handed back every step)."""
        key = (ctx.cu_seqlens, ctx.world_size, ctx.rank, ctx.layout, id(group), str(device))
        got = self._contexts.get(key)
        if got is None:
            from fla.ops.cp import build_cp_context

            cpu = torch.tensor(ctx.cu_seqlens, dtype=torch.int64)
            got = build_cp_context(cpu.to(device), group, cu_seqlens_cpu=cpu, layout=ctx.layout)
            self._contexts[key] = got
        return got

    def forward(self, mode: str, op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any,
                ctx: Any, scale: float | None, options: Mapping[str, Any]) -> Tensor:
        """This rank's output of FLA's implementation of `mode` (see the module table)."""
        from kernels.backends import fla_op
        from kernels.cp import forward as cp_forward
        from kernels.cp import prims

        opts = {k_: v_ for k_, v_ in (options or {}).items() if k_ not in self.options}
        s = q.shape[-1] ** -0.5 if scale is None else scale
        with pinned_to_triton(), recording(self._record), hopper_guard(options or {}):
            if mode == "none":
                return prims.fwd(op, q, k, v, g, beta, ctx.cu_seqlens, backend="fla", scale=s)[0]
            if mode == "warmup_correct":
                if dispatch_disabled_at_import():
                    raise ValueError(f"FLA's intra-card CP is one of FLA's dispatch backends, and "
                                     f"FLA_DISABLE_BACKEND_DISPATCH=1 turned them all off in this process: {pin_note()}")
                with _intracard():
                    return prims.fwd(op, q, k, v, g, beta, ctx.cu_seqlens, backend="fla", scale=s)[0]
            if mode == "true_cp":
                o, _ = fla_op(op)(q, k, v, g, beta, scale=s, cp_context=self._cp_context(ctx, group, q.device))
                return o
            if mode in ("headwise", "all_gather", "ring"):
                return cp_forward(mode, op, q, k, v, g, beta, group=group, ctx=ctx, backend="fla", scale=s, options=opts)
        raise ValueError(f"backend 'fla' does not implement mode {mode!r}")


FLA = _FLA()
