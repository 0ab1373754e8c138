"""The CP cases run on the gang's ranks with NaN-poisoned allocations too (`CaseGang`, tests/kernels/cp/conftest.py)."""

from __future__ import annotations

from typing import Any

import torch

from runners.gang import Gang, RankContext
from tests.kernels.test_poison import allocations


def all_nan(ctx: RankContext, payload: Any) -> dict[str, bool]:
    return {name: bool(torch.isnan(t).all()) for name, t in allocations().items()}


def test_rank_allocations_are_nan(gang2: Gang) -> None:
    for per_rank in gang2.run(all_nan, None):
        assert per_rank and all(per_rank.values()), per_rank
