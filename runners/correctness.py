"""The correctness gate that runs before a point is timed: relative L2 errors and their tolerances.

Two checks per point (`runners.execute` runs them; this module holds the measures and the verdict):

1. vs `none`: the mode's full output (gathered from the ranks) against the single-device forward of the same
   backend on the same inputs: catches a wrong scheme at the benchmarked shape.
2. vs the reference: the mode on a reduced shape (`runners.workload.reduced_params`) against the per-token
   fp32 recurrence (`kernels.reference`): catches a backend that is wrong everywhere, `none` included.

Error = ||o - o_ref||_2 / ||o_ref||_2 over all elements, in fp32. Default tolerances by dtype (a wrong scheme
is off by O(1); these only have to sit above rounding noise): float32 2e-3 (TF32 dots on GPUs), bfloat16
3e-2, float16 1e-2. `warmup_correct` is approximate by design: its allowance adds the scheme's own target
(the point's `mode_options.tol`). A spec's `check.tol_none` / `check.tol_reference` override the defaults. A point over
its tolerance fails without being timed, with both errors in its message; NaN/Inf fail too (`rel_l2` states its
rule for non-finite values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from kernels.vocabulary import MODE_OPTIONS
from runners.point import PointSpec

__all__ = ["DEFAULT_TOL", "NORM_FLOOR", "GateResult", "judge", "rel_l2", "tolerances"]

NORM_FLOOR = 1e-30  # the smallest reference norm rel_l2 divides by
DEFAULT_TOL = {"float32": 2e-3, "bfloat16": 3e-2, "float16": 1e-2}


def rel_l2(out: Tensor, ref: Tensor) -> float:
    """||out - ref||_2 / ||ref||_2 over all elements (a host read: call it outside any timed step): the suite's one
    relative error (the gate, the tuner's trials, the benches, the tests' `rel_err`).

    Computed in fp32, or in fp64 when either tensor is fp64; `out` is reshaped to `ref`'s shape (same numel).
    Non-finite values: an element where both are the same non-finite value (NaN and NaN, or the same infinity)
    agrees and is left out of both norms; any other element holding a NaN or an infinity (in `out` or in `ref`)
    makes the error inf. So the result is never NaN, and inf means "not comparable": it fails every tolerance.
    A reference norm below `NORM_FLOOR` (1e-30: an all-zero or all-denormal reference, e.g. a state map decayed
    below fp32's normal range) counts as 1e-30, so the error of such a reference is absolute, not noise over noise.
    """
    if out.shape != ref.shape:
        out = out.reshape(ref.shape)
    dt = torch.float64 if torch.float64 in (out.dtype, ref.dtype) else torch.float32
    o, r = out.detach().to(dt), ref.detach().to(dt)
    finite = torch.isfinite(o) & torch.isfinite(r)
    if not bool(finite.all()):
        same = (o == r) | (torch.isnan(o) & torch.isnan(r))
        if not bool((finite | same).all()):
            return math.inf
        o, r = o[finite], r[finite]
    num = torch.linalg.vector_norm(o - r)
    den = torch.linalg.vector_norm(r).clamp_min(NORM_FLOOR)
    return float(num / den)


def tolerances(point: PointSpec, check: Mapping[str, Any]) -> tuple[float, float]:
    """(tol vs none, tol vs reference) for this point."""
    base = DEFAULT_TOL.get(point.dtype, 3e-2)
    tol_none = check.get("tol_none") or base
    tol_ref = check.get("tol_reference") or base
    if point.mode == "warmup_correct":
        extra = float(point.mode_options.get("tol", MODE_OPTIONS["warmup_correct"]["tol"]))  # the scheme's default
        tol_none, tol_ref = tol_none + extra, tol_ref + extra
    return float(tol_none), float(tol_ref)


@dataclass
class GateResult:
    """Verdict of the gate: the errors, the tolerances and, when it failed, why."""

    err_vs_none: float | None
    err_vs_reference: float | None
    tol_none: float
    tol_reference: float
    passed: bool
    message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bad(err: float | None, tol: float) -> bool:
    return err is not None and (not math.isfinite(err) or err > tol)


def judge(
    point: PointSpec,
    *,
    err_vs_none: float | None,
    err_vs_reference: float | None,
    check: Mapping[str, Any],
) -> GateResult:
    """Pass or fail from the two errors (None: that check did not run)."""
    tol_none, tol_ref = tolerances(point, check)
    problems = []
    if _bad(err_vs_none, tol_none):
        problems.append(f"rel L2 error vs none {err_vs_none:.3g} > tol {tol_none:.3g}")
    if _bad(err_vs_reference, tol_ref):
        problems.append(f"rel L2 error vs reference (reduced shape) {err_vs_reference:.3g} > tol {tol_ref:.3g}")
    message = None
    if problems:
        message = f"correctness gate failed for {point.op}/{point.mode}/{point.backend}: " + "; ".join(problems)
    return GateResult(err_vs_none, err_vs_reference, tol_none, tol_ref, passed=not problems, message=message)
