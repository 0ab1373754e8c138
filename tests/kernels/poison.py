"""NaN-poisoned allocations for the kernel tests (FLA's tests/conftest.py habit): while `poisoned()` is active,
`torch.empty`, `torch.empty_like`, `torch.empty_strided` and `Tensor.new_empty` return floating (and complex)
tensors filled with NaN, so a kernel or torch path that leaves part of an output unwritten fails every test that
reads it. Integer and bool tensors are returned untouched (indices and counters are written by their users).

`tests/kernels/conftest.py` activates it around every test of tests/kernels/; the CP cases run in the gang's rank
processes, so `tests/kernels/cp/conftest.py` sends each case as `partial(call_poisoned, fn)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from unittest import mock

import torch

R = TypeVar("R")

_EMPTY = torch.empty
_EMPTY_LIKE = torch.empty_like
_EMPTY_STRIDED = torch.empty_strided
_NEW_EMPTY = torch.Tensor.new_empty


def _nan_filled(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        with torch.no_grad():  # a leaf that requires grad refuses an in-place fill otherwise
            t.fill_(float("nan"))
    return t


def _empty(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _nan_filled(_EMPTY(*args, **kwargs))


def _empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _nan_filled(_EMPTY_LIKE(*args, **kwargs))


def _empty_strided(*args: Any, **kwargs: Any) -> torch.Tensor:
    return _nan_filled(_EMPTY_STRIDED(*args, **kwargs))


def _new_empty(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _nan_filled(_NEW_EMPTY(self, *args, **kwargs))


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Uninitialised float allocations are NaN inside the block."""
    with (
        mock.patch("torch.empty", new=_empty),
        mock.patch("torch.empty_like", new=_empty_like),
        mock.patch("torch.empty_strided", new=_empty_strided),
        mock.patch.object(torch.Tensor, "new_empty", new=_new_empty),
    ):
        yield


def call_poisoned(fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` with poisoned allocations (module level, so `partial(call_poisoned, fn)` pickles to a rank)."""
    with poisoned():
        return fn(*args)
