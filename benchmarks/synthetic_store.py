"""Synthetic results for the service benchmarks (`api_load.py`, `sweep_page.py`): a point's wall-clock samples and
profile stored as a worker stores them (the summary from `runners.stats.summarize`, the rows by `db.crud`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def store_samples(
    session: Any,
    *,
    point_id: int,
    environment_id: int,
    samples: Sequence[float],
    collectives: Mapping[str, int],
    collective_bytes: Mapping[str, int],
    kernel_launches: int,
    **fields: Any,
) -> None:
    """The measurement row of `samples` (ms), converged on the noise target with gate errors of 1e-3 / 2e-3 unless
    `fields` (the rest of `store_measurement`'s: worker, stop_reason, err_vs_none, configs, ...) say otherwise, and its
    profile (no host sync)."""
    from db import crud
    from runners.stats import summarize

    row = {"worker": "bench", "stop_reason": "noise", "err_vs_none": 1e-3, "err_vs_reference": 2e-3, **fields}
    crud.store_measurement(
        session,
        point_id=point_id,
        environment_id=environment_id,
        clock="wall",
        samples=list(samples),
        summary=summarize(samples).stored(),
        **row,
    )
    crud.store_profile(
        session,
        point_id=point_id,
        collectives=dict(collectives),
        collective_bytes=dict(collective_bytes),
        host_syncs=0,
        sync_events={},
        kernel_launches=kernel_launches,
        peak_memory_bytes=None,
    )
