"""Triton-interpreter fixes for running the kernels on the CPU (`TRITON_INTERPRET=1`): tests and `--dry-run` only.

The interpreter multiplies raw bf16 bit patterns in `tl.dot` (triton-lang/triton#11584); `patch_bf16_dot()` widens
bf16 operands to fp32 first. It touches private interpreter internals, which is why Triton is pinned (3.6.0).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["interpreting", "patch_bf16_dot"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def patch_bf16_dot() -> bool:
    """Install the bf16 `tl.dot` fix in the interpreter; returns False when Triton is missing. Idempotent."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    orig = interp.InterpreterBuilder.create_dot
    if getattr(orig, "_bf16_fixed", False):
        return True

    def up(h: Any) -> Any:
        if h.dtype == tl.bfloat16:
            return interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return orig(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_fixed = True  # type: ignore[attr-defined]
    interp.InterpreterBuilder.create_dot = create_dot
    return True
