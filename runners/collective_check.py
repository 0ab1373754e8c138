"""Measured collectives vs what the scheme says it issues, per direction where the profile splits the step.

`expected_by_direction(mode, ctx, options, direction)` is kernels.cp's count of one rank's step, one entry per
direction the point runs (`fwd`, and `bwd` for a `fwd+bwd` point); `merge_gang` folds the ranks' counts as the
profiler folds the ranks (`kernels.cp.modes.merge_rank_counts`: send/recv summed over the ranks, group collectives the
max). `mismatches(profile, expected)` compares the gang's profile with it: the whole step against the sum of the
directions, and, when the profile split a training step (`by_direction`), each direction against its own count,
so a backward that issues an extra all-gather is caught even where the forward issues one fewer. The worker stores
the list in the point's report (`collective_mismatches`, empty when every count agrees) and logs a warning
otherwise; a mismatch does not fail the point (the timing stays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernels.cp.modes import merge_rank_counts
from runners.profile import PROFILE_DIRECTIONS

__all__ = ["expected_by_direction", "merge_gang", "mismatches", "step_directions", "step_total"]


def step_directions(direction: str) -> tuple[str, ...]:
    """The directions one step of a point at `direction` ("fwd" or "fwd+bwd") runs."""
    if direction == "fwd":
        return ("fwd",)
    if direction == "fwd+bwd":
        return tuple(PROFILE_DIRECTIONS)
    raise ValueError(f"direction must be 'fwd' or 'fwd+bwd', got direction={direction!r}")


def expected_by_direction(mode: str, ctx: Any, options: Mapping[str, Any] | None, direction: str) -> dict[str, dict[str, int]]:
    """kernels.cp's count of one step of `mode` on this rank, per direction the point at `direction` runs."""
    from kernels import cp

    return {d: dict(cp.expected_collectives(mode, ctx, options, d)) for d in step_directions(direction)}


def merge_gang(per_rank: Sequence[Mapping[str, Mapping[str, int]] | None]) -> dict[str, dict[str, int]] | None:
    """The gang's expected counts per direction from each rank's; None when a rank states none (a peer backend
    without `expected_collectives`)."""
    if not per_rank or any(r is None for r in per_rank):
        return None
    directions = [d for d in PROFILE_DIRECTIONS if any(d in r for r in per_rank if r is not None)]
    return {d: merge_rank_counts(r.get(d, {}) for r in per_rank if r is not None) for d in directions}


def step_total(by_direction: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The whole step's count from its directions' (kernels.cp's "fwd+bwd" is the sum of "fwd" and "bwd")."""
    total: dict[str, int] = {}
    for counts in by_direction.values():
        for k, n in counts.items():
            total[k] = total.get(k, 0) + n
    return dict(sorted(total.items()))


def _diff(where: str, measured: Mapping[str, int], expected: Mapping[str, int]) -> list[str]:
    return [f"{where} {k}: measured {measured.get(k, 0)}, expected {expected.get(k, 0)}"
            for k in sorted({*measured, *expected}) if measured.get(k, 0) != expected.get(k, 0)]


def mismatches(profile: Mapping[str, Any], expected: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Each collective count of `profile` (a merged `ProfileSummary.as_dict()`) that differs from `expected`
    (the gang's counts per direction): the step's totals, then each direction of `by_direction` when present.
    Empty when all agree."""
    out = _diff("step", profile.get("collectives") or {}, step_total(expected))
    split = profile.get("by_direction") or {}
    for d in PROFILE_DIRECTIONS:
        if split and d in expected:
            out += _diff(d, (split.get(d) or {}).get("collectives") or {}, expected[d])
    return out
