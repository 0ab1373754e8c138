"""The NaN-poisoning fixture (tests/kernels/conftest.py, `tests.kernels.poison`) is active in every kernel test:
uninitialised float allocations are all NaN, integer ones keep their dtype, and a block restores what it patched."""

from __future__ import annotations

import torch

from tests.kernels.poison import poisoned


def allocations() -> dict[str, torch.Tensor]:
    """One tensor from each poisoned allocator (also run on the CP ranks by tests/kernels/cp/test_cases_poison.py)."""
    base = torch.zeros(3, 5, dtype=torch.bfloat16)
    return {
        "empty": torch.empty(4, 8),
        "empty_dtype": torch.empty((2, 3), dtype=torch.float16),
        "empty_like": torch.empty_like(base),
        "empty_strided": torch.empty_strided((2, 3), (1, 2), dtype=torch.float32),
        "new_empty": base.new_empty((6,)),
        "new_empty_f32": base.new_empty((6,), dtype=torch.float32),
        "complex": torch.empty(3, dtype=torch.complex64),
        "leaf": torch.empty(3, requires_grad=True),
    }


def test_float_allocations_are_nan() -> None:
    for name, t in allocations().items():
        assert t.numel() > 0 and bool(torch.isnan(t).all()), name
    assert allocations()["leaf"].requires_grad


def test_integer_allocations_untouched() -> None:
    assert torch.empty(5, dtype=torch.int32).dtype == torch.int32
    assert torch.zeros(2, dtype=torch.int64).new_empty((3,)).dtype == torch.int64
    assert torch.empty_like(torch.ones(4, dtype=torch.bool)).dtype == torch.bool


def test_poison_is_scoped() -> None:
    before = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    with poisoned():
        assert torch.isnan(torch.empty(2)).all()
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == before
