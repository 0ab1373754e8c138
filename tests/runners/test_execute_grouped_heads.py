"""Engine, grouped value heads (HV = 2H): every mode x {fwd, fwd+bwd} x {torch, triton} through the real point job.

The grid of a spec (`runners.grid.points`: every mode, W in {1, 2}, HV = 2H) is run point by point with
`runners.execute.run_point_job` on gloo gangs of the engine (`runners.gang.Gang`, W = 1 and W = 2), as the worker runs
them. No point may fail (the GPU sweep of issue 25 failed 8 of its 32 warmup_correct points with `The size of tensor a
(32) must match the size of tensor b (16)`): every point passes its gate, i.e. its output (and in fwd+bwd every input
gradient, dq/dk summed over their value heads) within the fp32 tolerance of `none` and of the per-token reference.
Tiny shapes (two sequences of 80 + 48 tokens, H = 2, HV = 4, K = V = 16). The torch backend: gdn and kda, both
directions, every mode at W = 1 and the multi-rank ones at W = 2 (~25 s). The triton backend runs under the
interpreter at seconds per kernels call (a fwd+bwd point gates ~8 of them), so it is `slow`: one point per mode (gdn,
fwd+bwd, W = 2 for the multi-rank modes; warmup_correct measured 11 min on 2 shared cores). The kernels-level case (tests/kernels/cp/test_modes_grads.py,
`test_warmup_correct_grouped_value_heads`) covers the failing call on triton in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels.vocabulary import MODES, SINGLE_DEVICE
from runners.execute import run_point_job
from runners.gang import Gang
from runners.grid import points, skip_reason
from runners.point import PointJob, PointSpec
from runners.results import PointResult
from runners.spec import parse_spec

pytestmark = pytest.mark.multiproc

OPTIONS = {
    "timing": {
        "min_samples": 1,
        "max_samples": 1,
        "min_time_s": 0.0,
        "timeout_s": 1.0,
        "warmup_s": 0.0,
        "warmup_min_iters": 1,
        "flush_l2": False,
    },
    "check": {"reference_tokens": 128},
    "profile": False,
}
TOL = 2e-3  # fp32: the gate's own tolerance (runners.correctness), every exact scheme is ~1e-6


def _grid(backend: str, ops: list[str], modes: list[str], directions: list[str], **axes: object) -> list[PointSpec]:
    """The runnable points of a tiny grouped-head spec (`axes`: more axes, e.g. the gate's)."""
    spec = parse_spec(
        {
            "name": "grouped",
            "ops": ops,
            "modes": modes,
            "backends": [backend],
            "axes": {
                "lengths": [80, 48],
                "H": 2,
                "HV": 4,
                "K": 16,
                "V": 16,
                "W": [1, 2],
                "direction": directions,
                "dtype": "float32",
                **axes,
            },
        }
    )
    return [p for p in points(spec) if skip_reason(p) is None]


@pytest.fixture(scope="module")
def gangs() -> Iterator[dict[int, Gang]]:
    out = {W: Gang(W, pg_timeout_s=900.0) for W in (1, 2)}
    yield out
    for g in out.values():
        g.close()


def _run(point: PointSpec, gangs: dict[int, Gang]) -> PointResult:
    result: PointResult = gangs[point.W].run(run_point_job, PointJob(point, OPTIONS, trace_path=None), timeout_s=900.0)[0]
    return result


def _sweep(grid: list[PointSpec], gangs: dict[int, Gang], grad_names: set[str] | None = None) -> None:
    """Run every point; none may fail, each within TOL of `none` and the reference; `grad_names`: the gradients a
    fwd+bwd point's report must hold, each within 1e-4 of `none`'s."""
    assert grid and all(p.value_heads == 2 * p.H for p in grid)
    failed = []
    for point in grid:
        res = _run(point, gangs)
        where = f"{point.op}/{point.mode}/{point.backend}/W={point.W}/{point.direction}"
        if not res.ok:
            failed.append((where, res.error))
            continue
        assert res.gate is not None and res.timing is not None and res.report is not None, where
        assert res.gate["err_vs_none"] <= TOL and res.gate["err_vs_reference"] <= TOL, (where, res.gate)
        if grad_names is not None:
            errs = res.report["grad_errors_vs_none"]
            assert set(errs) == grad_names and max(errs.values()) <= 1e-4, (where, errs)
    assert not failed, failed


def test_every_mode_with_grouped_value_heads_passes_torch(gangs: dict[int, Gang]) -> None:
    grid = _grid("torch", ["gdn", "kda"], list(MODES), ["fwd", "fwd+bwd"])
    # every mode at W = 1, the multi-rank ones at W = 2 too; both directions, both ops
    assert len(grid) == 2 * 2 * (len(MODES) + len(MODES) - len(SINGLE_DEVICE)), [p.mode for p in grid]
    _sweep(grid, gangs)


@pytest.mark.heavy  # 5-11 min a point under the interpreter on 2 cores: CPBENCH_TEST_HEAVY=1 (CI covers the
@pytest.mark.timeout(1800)  # triton primitives on grouped heads at kernel level: tests/kernels/cp/test_modes_grads.py)
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_with_grouped_value_heads_passes_triton(mode: str, gangs: dict[int, Gang]) -> None:
    """The same on the triton backend (the interpreter: seconds per kernels call, so one point per case: gdn,
    fwd+bwd, whose gate covers the forward's output too, at the largest W the mode takes): the schemes' triton
    primitives (transition, seg_chain, state_grad, chunked backward) on q/k expanded to HV heads."""
    W = 1 if mode in SINGLE_DEVICE else 2
    grid = [p for p in _grid("triton", ["gdn"], [mode], ["fwd+bwd"]) if p.W == W]
    assert len(grid) == 1
    _sweep(grid, gangs)
