"""L2 normalisation of q and k per head over the key dim, FLA's `use_qk_l2norm_in_kernel`: x / sqrt(sum x^2 + eps).

Plain differentiable torch ops (computed in fp32 for half inputs, cast back), so its backward is autograd's:
d x = rstd (dy - y (y . dy)) per row, with y the output and rstd = (sum x^2 + eps)^-1/2. eps = 1e-6 as in FLA.
With `fused=True` (the triton backend) the same arithmetic runs as one Triton launch each way
(`kernels.common.l2norm_triton`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["L2NORM_EPS", "l2norm"]

L2NORM_EPS = 1e-6


def l2norm(x: Tensor, eps: float = L2NORM_EPS, *, fused: bool = False) -> Tensor:
    """`x * (sum(x^2, -1) + eps)^-1/2` over the last dim, in x's dtype (fp32 arithmetic for bf16/fp16)."""
    if fused:
        from kernels.common.l2norm_triton import l2norm_fused

        return l2norm_fused(x, eps)
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)
