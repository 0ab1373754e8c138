"""Every kernel test (tests/kernels/, cp/ included) runs with NaN-poisoned allocations (`tests.kernels.poison`):
an output a kernel leaves partly unwritten is NaN there, and the test that reads it fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernels.poison import poisoned


@pytest.fixture(autouse=True)
def nan_poison() -> Iterator[None]:
    with poisoned():
        yield
