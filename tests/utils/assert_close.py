"""Relative L2 comparisons: `||ref - got|| / ||ref||` (`runners.correctness.rel_l2`), reported with the max abs diff."""

from __future__ import annotations

import torch
from torch import Tensor

from runners.correctness import rel_l2


def rel_err(ref: Tensor, got: Tensor) -> float:
    """Relative L2 error of got against ref, computed in fp64 (`runners.correctness.rel_l2`, the suite's one rule)."""
    return rel_l2(got.double(), ref.double())


def assert_rel_close(name: str, ref: Tensor, got: Tensor, tol: float) -> None:
    """Fail unless shapes match, got is finite and the relative L2 error is <= tol."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    assert bool(torch.isfinite(got).all()), f"{name}: non-finite values in the result"
    err = rel_err(ref, got)
    max_abs = float((ref.double() - got.double()).abs().max()) if ref.numel() else 0.0
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > tol {tol:.1e} (max abs diff {max_abs:.3e})"
