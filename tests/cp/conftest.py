"""Session-scoped gloo gangs (W = 2 and W = 4), each spawned once and shared by every CP test of the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cp_gang import Gang


@pytest.fixture(scope="session")
def gang2() -> Iterator[Gang]:
    g = Gang(2)
    yield g
    g.close()


@pytest.fixture(scope="session")
def gang4() -> Iterator[Gang]:
    g = Gang(4)
    yield g
    g.close()


@pytest.fixture(scope="session")
def gangs(gang2: Gang, gang4: Gang) -> dict[int, Gang]:
    return {2: gang2, 4: gang4}
