"""FlashKDA (Moonshot, CUTLASS; the `tokenspeed-flashkda` wheel, module `flash_kda`) as a sweep subject:
`backend: flash_kda`, a KDA forward, stored as skipped with its reason wherever it cannot be measured.

Its one entry point (flash_kda/__init__.py) is

    flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                  initial_state=None, final_state=None, cu_seqlens=None)

with q, k, v, g bf16 `[B, T, H, 128]`, beta bf16 `[B, T, H]`, out a bf16 buffer like q, A_log fp32 `[H]`, dt_bias fp32
`[H, 128]`, cu_seqlens int64 on the GPU (B = 1), states `[N, H, V, K]`. The kernel computes the safe gate
(`lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`), beta's sigmoid and the L2 norm of q and k itself, forward only.

So a point runs it only where the point's own step is that call: KDA, forward, bfloat16, K = V = 128, no grouped value
heads, the safe gate computed in the kernel (`gate: safe`) with `l2norm_in_kernel: true`. Peers are handed the stored
inputs as they are (`runners.grid`: a peer takes no real-model gate), so under today's engine every FlashKDA point is
skipped with the reason its own `skip_reason` gives first; `forward` is the adapter for the day the engine hands a
peer the raw gate and its parameters. `benchmarks/flashkda_probe.py` runs it directly on an H200 against FLA's
`chunk_kda` on the same raw inputs.

Why its fwd raises "all tensors must be on CUDA" with every tensor on the GPU (session 11, from the wheel alone): the
`tokenspeed-flashkda` 0.0.1.post20260901 wheel declares no torch requirement, but its extension was compiled against
torch 2.13/2.14 headers (it embeds the `TensorImpl.h":1799` assertion of those headers; 2.10-2.12 have it at 1768), in
which `c10::impl::PyObjectSlot` is 8 bytes (torch 2.13 dropped its `pyobj_interpreter_`); up to 2.12 it is 16. Every
TensorImpl field after it sits 8 bytes earlier in the extension's view. `Tensor::is_cuda()` is inlined: the extension
reads `device_opt_` at TensorImpl+0xa2..0xa4 (disassembly of `fwd`), which under torch 2.11 are bytes 2-4 of
`numel_` (TensorImpl+0xa0); the `has_value` byte is numel's byte 4, zero for any tensor under 2^32 elements, so
the first check (csrc/flash_kda.cpp:44, over q, k, v, g, beta, out and the wrapper's workspace) fails for any
tensor, and every later inlined accessor (sizes, strides, data pointer) would read the wrong field too. Nothing on
our side (argument, dtype, layout, device index) can fix it: it runs only under torch >= 2.13, or built from source
against the installed torch. `abi_refusal` states this, and a point stores it as its skip reason.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

import torch
from torch import Tensor

from runners.peers import Peer
from runners.point import PointSpec

__all__ = ["FLASH_KDA", "abi_refusal", "engine_refusal", "installed_abi_refusal"]

HEAD_DIM = 128
DISTRIBUTION = "tokenspeed-flashkda"
# wheel version -> the oldest torch whose C++ ABI (TensorImpl layout) its extension was compiled against
BUILT_AGAINST_TORCH = {"0.0.1.post20260901": (2, 13)}


def _release(version: str) -> tuple[int, int]:
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def abi_refusal(wheel: str | None, torch_version: str) -> str | None:
    """Why the installed FlashKDA wheel cannot run under this torch (its extension's C++ ABI), None when it can."""
    need = BUILT_AGAINST_TORCH.get(wheel or "")
    if need is None or _release(torch_version) >= need:
        return None
    return (
        f"{DISTRIBUTION} {wheel} was compiled against torch >= {need[0]}.{need[1]} (8-byte PyObjectSlot in "
        f"TensorImpl) and torch {torch_version} lays TensorImpl out 8 bytes later, so the extension's inlined "
        "is_cuda() reads numel's bytes as the device and its fwd raises 'all tensors must be on CUDA' "
        "(csrc/flash_kda.cpp:44) for any input; it needs torch >= "
        f"{need[0]}.{need[1]} or a build from source against the installed torch"
    )


def installed_abi_refusal() -> str | None:
    """`abi_refusal` for the wheel and torch installed here (reads package metadata, imports nothing)."""
    try:
        wheel = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return abi_refusal(wheel, torch.__version__)


def engine_refusal(point: PointSpec) -> str | None:
    """Why FlashKDA's call cannot be this point's step (its inputs), None when it can."""
    if point.gate != "safe" or not point.l2norm_in_kernel:
        return (
            "FlashKDA's fwd takes the raw gate and computes the safe gate (A_log, dt_bias, lower_bound), beta's "
            "sigmoid and the q/k L2 norm in its kernel; it takes no precomputed gate, and this point's step is a "
            "precomputed gate on stored inputs (it needs gate=safe with l2norm_in_kernel, which the engine does "
            "not hand to a peer)"
        )
    return None


class _FlashKDA(Peer):
    name = "flash_kda"
    modes = {"none": ("fwd",)}
    unsupported = dict.fromkeys(
        ("headwise", "all_gather", "ring", "true_cp", "warmup_correct", "tail_exchange"),
        "FlashKDA is a one-device forward kernel (no CP)",
    )
    direction_reasons = {"none": "FlashKDA is inference only: it has no backward"}
    first_call_s = 60.0  # ahead-of-time CUTLASS build: nothing is compiled on the first call

    def skip_reason(self, point: PointSpec) -> str | None:
        """FlashKDA's own limits (mode and direction were checked by `peer_skip_reason`), without importing it."""
        if point.op != "kda":
            return f"FlashKDA implements KDA only; there is no FlashKDA kernel for {point.op}"
        if point.dtype != "bfloat16":
            return f"FlashKDA requires bfloat16, got {point.dtype}"
        if point.K != HEAD_DIM or point.V != HEAD_DIM:
            return f"FlashKDA requires K=128 and V=128, got K={point.K}, V={point.V}"
        if point.value_heads != point.H:
            return f"FlashKDA does not support grouped value heads (HV={point.value_heads} != H={point.H})"
        return installed_abi_refusal() or engine_refusal(point)

    def available(self) -> str | None:
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
            return "FlashKDA needs an SM90+ NVIDIA GPU"
        if importlib.util.find_spec("flash_kda") is None:
            return "FlashKDA is not installed (pip install tokenspeed-flashkda)"
        return installed_abi_refusal()

    def forward(self, mode: str, op: str, *inputs: Tensor, **call: Any) -> Tensor:
        """FlashKDA's forward on raw inputs: `g` the raw gate, `beta` its logits, `options` holding A_log (fp32 [H]),
        dt_bias (fp32 [H, K]) and lower_bound; every tensor on q's device, cu_seqlens int64 there too."""
        import flash_kda

        if mode != "none" or op != "kda":
            raise ValueError(f"backend 'flash_kda' runs KDA mode 'none' only, got op={op!r}, mode={mode!r}")
        q, k, v, g, beta = (x.contiguous() for x in inputs)
        options, scale = call["options"], call["scale"]
        device = q.device
        A_log = options["A_log"].to(device=device, dtype=torch.float32).contiguous()
        dt_bias = options["dt_bias"].to(device=device, dtype=torch.float32).reshape(q.shape[2], -1).contiguous()
        cu = torch.tensor(call["ctx"].cu_seqlens, dtype=torch.int64, device=device)
        out = torch.empty_like(v)
        s = float(q.shape[-1] ** -0.5 if scale is None else scale)
        flash_kda.fwd(q, k, v, g, beta, s, out, A_log, dt_bias, float(options["lower_bound"]), cu_seqlens=cu)
        return out


FLASH_KDA = _FlashKDA()
