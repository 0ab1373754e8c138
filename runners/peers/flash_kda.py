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
`chunk_kda` on the same raw inputs (and tells why its fwd raised "all tensors must be on CUDA").
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import Tensor

from runners.peers import Peer
from runners.point import PointSpec

__all__ = ["FLASH_KDA", "engine_refusal"]

HEAD_DIM = 128


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
        return engine_refusal(point)

    def available(self) -> str | None:
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
            return "FlashKDA needs an SM90+ NVIDIA GPU"
        if importlib.util.find_spec("flash_kda") is None:
            return "FlashKDA is not installed (pip install tokenspeed-flashkda)"
        return None

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
