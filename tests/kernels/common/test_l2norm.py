"""The fused Triton L2 norm (`kernels.common.l2norm_triton`, the triton backend's `use_qk_l2norm_in_kernel`) against the
fp32 reference: output and gradient, widths that are and are not powers of two, row counts off the program's tile."""

from __future__ import annotations

import pytest
import torch

from kernels.common.l2norm import L2NORM_EPS, l2norm
from runners.correctness import rel_l2
from tests.utils import TEST_DEVICE

DEVICE = TEST_DEVICE


def _reference(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.detach().float().requires_grad_()
    y = xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + L2NORM_EPS)
    y.backward(dy.float())
    return y.detach(), xf.grad


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 5e-3)])
@pytest.mark.parametrize("shape", [(1, 37, 3, 128), (2, 5, 2, 60), (1, 3, 1, 100)])
def test_fused_l2norm_matches_the_fp32_reference(shape: tuple[int, ...], dtype: torch.dtype, tol: float) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(DEVICE, dtype).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    y = l2norm(x, fused=True)
    y.backward(dy)
    y_ref, dx_ref = _reference(x, dy)
    assert y.dtype == dtype and x.grad is not None and x.grad.dtype == dtype
    assert rel_l2(y.float(), y_ref) <= tol
    assert rel_l2(x.grad.float(), dx_ref) <= tol
    # the rows are unit vectors, and the gradient is orthogonal to them (what the normalisation removes)
    assert torch.allclose(y.float().norm(dim=-1), torch.ones(shape[:-1], device=DEVICE), atol=4 * tol)
    assert (x.grad.float() * y_ref).sum(-1).abs().max() <= 1e-2 * dx_ref.norm(dim=-1).max()


def test_fused_l2norm_equals_the_torch_form_and_keeps_no_graph_without_grad() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 9, 4, 64, generator=gen).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        fused = l2norm(x, fused=True)
    assert fused.grad_fn is None
    # both round the same fp32 value to bf16: at most one bf16 step apart
    assert (fused.float() - l2norm(x).float()).abs().max() <= 2**-8
