"""Session-scoped gloo gangs (W = 2 and W = 4) of the engine (`runners.gang.Gang`), each spawned once and shared
by every CP test of the session; cases (tests/kernels/cp/cases.py) run on them as `gang.run(cases.fn, kwargs)`,
each with NaN-poisoned allocations on its ranks (`tests.kernels.poison`)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest

from runners.gang import Gang
from tests.kernels.poison import call_poisoned

# a case runs in seconds; a hung collective fails the test within this bound (the gang is then restarted)
CASE_TIMEOUT_S = 120.0


class CaseGang(Gang):
    """The engine's gang with a test-sized watchdog on every case, which runs with poisoned allocations."""

    def run(self, fn, payload, *, timeout_s: float = CASE_TIMEOUT_S, cancel=None):  # type: ignore[no-untyped-def, override]
        return super().run(partial(call_poisoned, fn), payload, timeout_s=timeout_s, cancel=cancel)


@pytest.fixture(scope="session")
def gang2() -> Iterator[Gang]:
    g = CaseGang(2, pg_timeout_s=CASE_TIMEOUT_S)
    yield g
    g.close()


@pytest.fixture(scope="session")
def gang4() -> Iterator[Gang]:
    g = CaseGang(4, pg_timeout_s=CASE_TIMEOUT_S)
    yield g
    g.close()


@pytest.fixture(scope="session")
def gangs(gang2: Gang, gang4: Gang) -> dict[int, Gang]:
    return {2: gang2, 4: gang4}
