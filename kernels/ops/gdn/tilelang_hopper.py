"""What GDN's TileLang kernels need, in one place: the TileLang version they were checked on, their sizes (K = V = 128,
chunk 64), a Hopper GPU (sm_90), and the dtype names TileLang takes. `kernels.ops.gdn.reverse_bwd` (the backward's
reverse walk) and `kernels.ops.gdn.fwd_walk` (the forward's warp-specialised state+output walk) refuse through
`tilelang_refusal`, with one line saying why.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["TILELANG_VERSION", "TL_DTYPES", "TL_SIZES", "tilelang_refusal", "tilelang_refusal_cached"]

TILELANG_VERSION = "0.1.15"  # checked on the H200 against each kernel's mirror; others are refused, not run
TL_SIZES = {"K": 128, "V": 128, "BT": 64}
TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def tilelang_refusal(what: str, K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why the TileLang kernel `what` cannot run here (one line), or None."""
    if (TL_SIZES["K"], TL_SIZES["V"], TL_SIZES["BT"]) != (K, V, BT):
        return f"the TileLang {what} takes K = V = 128 and chunk 64, got K={K} V={V} chunk={BT}"
    if device.type != "cuda":
        return f"the TileLang {what} runs on CUDA only, got {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"the TileLang {what} is built for sm_90 (Hopper), this GPU is sm_{major}{minor}"
    try:
        import tilelang
    except ImportError:
        return f"the TileLang {what} needs tilelang (./dev up installs it on a GPU host)"
    if tilelang.__version__.split("+")[0] != TILELANG_VERSION:
        return f"the TileLang {what} was checked on tilelang {TILELANG_VERSION}, found {tilelang.__version__}"
    return None


@functools.cache
def tilelang_refusal_cached(what: str, K: int, V: int, BT: int, device: torch.device) -> str | None:
    """`tilelang_refusal` once per (kernel, sizes, device): the automatic choices ask it on every call."""
    return tilelang_refusal(what, K, V, BT, device)
