"""Fused L2 normalisation of q and k for the triton backend: one read and one write per row, forward and backward.

y = x * rstd with rstd = (sum x^2 + eps)^-1/2 over the last dim, in fp32 arithmetic and stored in x's dtype (as
`kernels.common.l2norm.l2norm`, the torch form, computes it). The forward keeps rstd (fp32, one value per row) for
the backward, dx = rstd * (dy - y * sum(y * dy)) with y recomputed in fp32 from x. Each program takes `ROWS` rows of
a flat `[N, D]` view; D is any width up to 256, held in a tile of the next power of two with masked columns.
The torch form costs about nine elementwise and reduction launches per tensor (0.4 ms of a 1.2 ms Qwen3-Next forward at
T=8K on the H200, `benchmarks/results/real_model_calls_bf16_h200.md`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.configs import cdiv, next_power_of_2

__all__ = ["l2norm_fused"]

ROWS = 16  # rows per program: [16, 128] fp32 is 16 registers a thread at 4 warps


@triton.jit
def _row_tile(N, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    """This program's rows of the flat [N, D] view: their indices, the [ROWS, BD] mask and element offsets."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows[:, None] < N) & (cols[None, :] < D)
    return rows, mask, rows[:, None].to(tl.int64) * D + cols[None, :]


@triton.jit
def l2norm_fwd_kernel(x, y, rstd, N, eps, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    rows, mask, offs = _row_tile(N, D, BD, ROWS)
    xv = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=1) + eps)
    tl.store(y + offs, (xv * r[:, None]).to(y.dtype.element_ty), mask=mask)
    tl.store(rstd + rows, r, mask=rows < N)


@triton.jit
def l2norm_bwd_kernel(x, rstd, dy, dx, N, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    rows, mask, offs = _row_tile(N, D, BD, ROWS)
    r = tl.load(rstd + rows, mask=rows < N, other=0.0)
    yv = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32) * r[:, None]
    g = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(yv * g, axis=1)
    tl.store(dx + offs, (r[:, None] * (g - yv * dot[:, None])).to(dx.dtype.element_ty), mask=mask)


def _grid(n: int) -> tuple[int]:
    return (cdiv(n, ROWS),)


def _forward(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    y = torch.empty_like(x2)
    rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    l2norm_fwd_kernel[_grid(x2.shape[0])](x2, y, rstd, x2.shape[0], eps, D=D, BD=next_power_of_2(D), ROWS=ROWS)
    return y.view(x.shape), rstd


class _L2Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        y, rstd = _forward(x, eps)
        ctx.save_for_backward(x, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        x, rstd = ctx.saved_tensors
        D = x.shape[-1]
        x2, dy2 = x.reshape(-1, D), dy.contiguous().reshape(-1, D)
        dx = torch.empty_like(x2)
        l2norm_bwd_kernel[_grid(x2.shape[0])](x2, rstd, dy2, dx, x2.shape[0], D=D, BD=next_power_of_2(D), ROWS=ROWS)
        return dx.view(x.shape), None


def l2norm_fused(x: Tensor, eps: float) -> Tensor:
    """`kernels.common.l2norm.l2norm` in one Triton launch (and one for its gradient); no autograd node without grad."""
    x = x.contiguous()
    if torch.is_grad_enabled() and x.requires_grad:
        return _L2Norm.apply(x, eps)
    return _forward(x, eps)[0]
