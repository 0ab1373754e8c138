"""FlashQLA (Qwen, TileLang; `flash-qla` 0.1.3) as a sweep subject: `backend: flash_qla`, GDN only, fwd and fwd+bwd.

| mode | FlashQLA's implementation |
|---|---|
| none | `flash_qla.chunk_gated_delta_rule(..., auto_cp=False)` over the varlen batch |
| warmup_correct | its intra-card CP: `auto_cp=True` with the context FlashQLA's own rule builds (`build_cp_context(cu_seqlens, enable_intra=True, num_v_heads, chunk_size, is_train, force_intra_cp)`, as its `chunk_gated_delta_rule` does), handed in so the split it chose is read and stored in the point's report (`flash_qla`: intra_cp, pieces, max_piece_tokens) |
| true_cp | its inter-card CP: a `FlashQLACPContext` of `build_cp_context(enable_inter=True, group=...)`, W >= 2, contiguous shards; `mode_options: {flash_qla: {dual: true}}` adds its intra-card split on each card (dual CP) |

Options (`mode_options: {flash_qla: {...}}`): `force_intra_cp` (warmup_correct: split even where FlashQLA's
decision would not) and `dual` (true_cp); each is part of the key only of the mode it applies to (`options_for`).

What it cannot run is decided when the sweep is expanded, without importing FlashQLA (`skip_reason`: its own
limits, in its own words: GDN only, K = V = 128, bfloat16/float16, B = 1 varlen; `available`: SM90/SM100/SM103 and the
package installed, judged where the sweep is expanded with backends checked, and again by the worker).
Its first call JIT-compiles about ten TileLang kernels (about 170 s on a cold cache on an H200): `first_call_s`
gives the watchdog that time, the call is announced to `cpbench status` (`runners.activity.notice`), and a worker
points TileLang at one cache directory per device model (`use_device_tilelang_cache`), so a sweep pays it once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from runners.activity import notice
from runners.peers import Peer
from runners.point import PointSpec

__all__ = ["FLASH_QLA", "SUPPORTED_CAPABILITIES", "TILELANG_CACHE_ENV", "split_of", "use_device_tilelang_cache"]

TILELANG_CACHE_ENV = "TILELANG_CACHE_DIR"  # TileLang's compile cache (its env.py; default ~/.tilelang/cache)
SUPPORTED_CAPABILITIES = ((9, 0), (10, 0), (10, 3))  # SM90, SM100, SM103: FlashQLA's forward and backward kernels
HEAD_DIM = 128  # FlashQLA's kernels take K = V = 128 only
_DTYPES = ("bfloat16", "float16")
_WC_DEFAULTS = {"segments": "auto", "tol": 1e-3, "window": "auto", "fallback": "auto"}
_OPTION_MODES = {"force_intra_cp": "warmup_correct", "dual": "true_cp"}  # option -> the mode it applies to


def use_device_tilelang_cache(root: str | os.PathLike[str], device_name: str, capability: str | None) -> str:
    """Point TileLang's cache at `root/<device model>-sm<cc>` (unless the user set TILELANG_CACHE_DIR) before any rank
    imports TileLang; the directory in use. Ranks inherit the variable, so one cache serves every gang of a worker."""
    if os.environ.get(TILELANG_CACHE_ENV):
        return os.environ[TILELANG_CACHE_ENV]
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    cc = f"-sm{capability.replace('.', '')}" if capability else ""
    path = Path(root) / "tilelang-cache" / f"{slug}{cc}"
    path.mkdir(parents=True, exist_ok=True)
    os.environ[TILELANG_CACHE_ENV] = str(path)
    return str(path)


def split_of(ctx: Any) -> dict[str, Any]:
    """The split a FlashQLA CP context holds (host values; read once, when the context is built)."""
    out: dict[str, Any] = {"intra_cp": bool(ctx.is_intra), "sequences": int(ctx.num_seqs)}
    if getattr(ctx, "is_inter", False):
        out["inter_cp"] = True
    if ctx.is_intra and ctx.intra_cp_cu_seqlens is not None:
        bounds = [int(b) for b in ctx.intra_cp_cu_seqlens.tolist()]
        lens = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        out.update(pieces=len(lens), max_piece_tokens=max(lens, default=0))
    return out


class _FlashQLA(Peer):
    name = "flash_qla"
    modes = {"none": ("fwd", "fwd+bwd"), "warmup_correct": ("fwd", "fwd+bwd"), "true_cp": ("fwd", "fwd+bwd")}
    unsupported = {
        "headwise": "FlashQLA has no head-parallel scheme",
        "all_gather": "FlashQLA has no all-gather scheme",
        "ring": "FlashQLA passes no states from rank to rank (its inter-card CP is `true_cp`)",
        "tail_exchange": "FlashQLA has no transition primitive to rebuild states from tail windows",
    }
    options = {"force_intra_cp": False, "dual": False}
    # the TileLang JIT of its ~10 kernels: 169 s for a fwd+bwd on a cold cache on our H200 (shared/anchors/peers-h200.md)
    first_call_s = 600.0

    def __init__(self) -> None:
        self._contexts: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}
        self._compiled: set[tuple[Any, ...]] = set()
        self._split: dict[str, Any] = {}

    def options_for(self, options: Mapping[str, Any], mode: str, direction: str) -> dict[str, Any]:
        """The options that take effect in `mode` (a point's backend options, so they are in its key only there)."""
        return {k: v for k, v in options.items() if _OPTION_MODES.get(k, mode) == mode}

    def skip_reason(self, point: PointSpec) -> str | None:
        """FlashQLA's own limits (mode and direction were checked by `peer_skip_reason`), without importing it."""
        if point.op != "gdn":
            return f"FlashQLA implements GDN only (chunk_gated_delta_rule); there is no FlashQLA kernel for {point.op}"
        if point.dtype not in _DTYPES:
            return f"FlashQLA only supports bfloat16 and float16, got {point.dtype}"
        if point.K != HEAD_DIM or point.V != HEAD_DIM:
            return f"FlashQLA requires K=128 and V=128, got K={point.K}, V={point.V}"
        mode_opts = point.mode_options
        if point.mode == "warmup_correct":
            changed = {k: v for k, v in mode_opts.items() if _WC_DEFAULTS.get(k, v) != v}
            if changed:
                return (
                    f"FlashQLA's intra-card CP decides its own split (its cost model); it takes no warmup_correct "
                    f"options, got {changed} (use mode_options: {{flash_qla: {{force_intra_cp: true}}}})"
                )
        if point.mode == "true_cp":
            if point.W < 2:
                return f"FlashQLA's inter-card CP (FlashQLACPContext) needs W >= 2, got W={point.W}"
            if point.layout != "contiguous":
                return f"FlashQLA's inter-card CP splits the tokens contiguously; layout '{point.layout}' is not one of its"
            if mode_opts.get("segment_len"):
                return "mode 'true_cp' with segment_len chains our transition maps; FlashQLA has no transition primitive"
        return None

    def available(self) -> str | None:
        """Why FlashQLA's points cannot run in this process (None: they can); FlashQLA itself is not imported."""
        if not torch.cuda.is_available():
            return "FlashQLA needs an NVIDIA GPU (SM90 or SM100); this host has no CUDA device"
        cc = torch.cuda.get_device_capability()
        if cc not in SUPPORTED_CAPABILITIES:
            return f"FlashQLA runs on SM90 (Hopper) and SM100/SM103 (Blackwell) only, this GPU is sm_{cc[0]}{cc[1]}"
        if importlib.util.find_spec("flash_qla") is None:
            return "flash-qla is not installed (pip install flash-qla; it brings tilelang)"
        return None

    def _bounds(self, ctx: Any, device: torch.device) -> Tensor:
        """The batch's bounds on the device (int32, as FlashQLA builds its own), made once: no copy inside a step."""
        key = ("bounds", ctx.cu_seqlens, str(device))
        if key not in self._contexts:
            self._contexts[key] = (torch.tensor(ctx.cu_seqlens, dtype=torch.int32, device=device), {})
        return self._contexts[key][0]

    def _context(
        self, key: tuple[Any, ...], note: dict[str, Any], build: Callable[[], dict[str, Any]]
    ) -> tuple[Any, dict[str, Any]]:
        """FlashQLA's CP context of `build_cp_context(**build())` with its split and `note` (built once per `key`, and
        `build` called only then: FlashQLA caches on the bounds tensor's identity, so the same tensors are handed back
        every step)."""
        if key not in self._contexts:
            from flash_qla.ops.gated_delta_rule.chunk import CHUNK_SIZE, build_cp_context

            built = build_cp_context(chunk_size=CHUNK_SIZE, **build())
            self._contexts[key] = (built, {**split_of(built), **note})
        return self._contexts[key]

    def _mode_context(
        self, mode: str, ctx: Any, group: Any, HV: int, is_train: bool, options: Mapping[str, Any], device: torch.device
    ) -> tuple[Any, dict[str, Any]]:
        """warmup_correct: the intra-card context FlashQLA's own rule builds for these bounds (what its
        `chunk_gated_delta_rule` builds with auto_cp); true_cp: its inter-card context (dual: with its intra-card split on
        each card) of the global bounds, int64 on the host and int32 on the device."""
        common = {"num_v_heads": HV, "is_train": is_train}
        if mode == "warmup_correct":
            force = bool(options.get("force_intra_cp"))
            key: tuple[Any, ...] = ("intra", ctx.cu_seqlens, HV, is_train, force, str(device))
            return self._context(
                key,
                {"forced": force},
                lambda: dict(cu_seqlens=self._bounds(ctx, device), enable_intra=True, force_intra_cp=force, **common),
            )
        dual = bool(options.get("dual"))
        key = ("inter", ctx.cu_seqlens, ctx.world_size, ctx.rank, id(group), HV, is_train, dual, str(device))
        return self._context(
            key,
            {"dual": dual},
            lambda: dict(
                cu_seqlens=self._bounds(ctx, device),
                cu_seqlens_cpu=torch.tensor(ctx.cu_seqlens, dtype=torch.int64),
                enable_inter=True,
                enable_intra=dual,
                group=group,
                **common,
            ),
        )

    def begin_point(self, point: PointSpec) -> None:
        self._split = {}

    def point_report(self, point: PointSpec) -> dict[str, Any]:
        """The split FlashQLA chose for the point (warmup_correct, true_cp), read from its context."""
        return {"flash_qla": dict(self._split)} if self._split else {}

    def forward(self, mode: str, op: str, *inputs: Tensor, **call: Any) -> Tensor:
        """This rank's output of FlashQLA's implementation of `mode` (see the module table); differentiable. `inputs`:
        q, k, v, g, beta; `call`: the protocol's group, ctx, scale, options."""
        import flash_qla

        if op != "gdn":
            raise ValueError(f"backend 'flash_qla' implements GDN only, got op={op!r}")
        q, k, v, g, beta = inputs
        # FlashQLA's backward asserts an fp32 gate ("dg should be fp32") and its forward loses accuracy on a bf16 one
        # (o rel_l2 2.6e-2 against 2.9e-3 on the H200, session 11): a lower-precision gate is cast, differentiably
        # (a [T, HV] copy inside the step; `runners.bench.kernels_peers` hands it an fp32 gate and skips it)
        g = g if g.dtype == torch.float32 else g.float()
        ctx, scale = call["ctx"], call["scale"]
        s = q.shape[-1] ** -0.5 if scale is None else scale
        HV = v.shape[2]
        # FlashQLA's own test of a training step (its intra-card decision depends on it)
        is_train = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, g, beta))
        kwargs: dict[str, Any] = {"scale": s}
        if mode == "none":
            kwargs.update(cu_seqlens=self._bounds(ctx, q.device), auto_cp=False)
        elif mode in ("warmup_correct", "true_cp"):
            built, self._split = self._mode_context(mode, ctx, call["group"], HV, is_train, call["options"], q.device)
            kwargs["cp_context"] = built  # inter-card: the context alone (it holds this card's bounds)
            if mode == "warmup_correct":
                kwargs.update(cu_seqlens=built.cu_seqlens, auto_cp=True)
        else:
            raise ValueError(f"backend 'flash_qla' does not implement mode {mode!r}")
        key = (mode, q.dtype, tuple(q.shape[2:]), HV, is_train)
        first = key not in self._compiled
        with notice("compiling FlashQLA kernels") if first else contextlib.nullcontext():
            o, _ = flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
        self._compiled.add(key)
        return o


FLASH_QLA = _FlashQLA()
