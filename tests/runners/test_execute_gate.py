"""Engine, the real models' gate through every CP scheme (`gate: in_kernel | safe`, `l2norm_in_kernel`): every mode x
{gdn, kda} x W in {1, 2}, fwd+bwd, grouped value heads (HV = 2H), torch backend, through the real point job on gloo
gangs. The step activates the raw gate (`kernels.common.gate.activate_gate`) and normalises q, k on its own shard, then
runs the mode; the gate checks the output and every gradient, A_log's and dt_bias's included (each rank's contribution
summed, as FLA's CP leaves it to data parallelism), against `none` and autograd through the fp32 per-token reference
on the same activation.
"""

from __future__ import annotations

import pytest

from kernels.vocabulary import MODES, SINGLE_DEVICE
from runners.gang import Gang
from runners.grid import points, skip_reason
from runners.spec import parse_spec
from tests.runners.test_execute_grouped_heads import TOL, _run, gangs  # noqa: F401

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("gate", ["in_kernel", "safe"])
def test_real_model_gate_through_every_mode(gate: str, gangs: dict[int, Gang]) -> None:  # noqa: F811
    spec = parse_spec(
        {
            "name": "gate",
            "ops": ["gdn", "kda"],
            "modes": list(MODES),
            "backends": ["torch"],
            "axes": {
                "lengths": [80, 48],
                "H": 2,
                "HV": 4,
                "K": 16,
                "V": 16,
                "W": [1, 2],
                "gate": gate,
                "lower_bound": -3.0,
                "l2norm_in_kernel": True,
                "direction": "fwd+bwd",
                "dtype": "float32",
            },
        }
    )
    grid = [p for p in points(spec) if skip_reason(p) is None]
    assert len(grid) == 2 * (2 * len(MODES) - len(SINGLE_DEVICE))
    assert all(p.gate == gate and p.l2norm_in_kernel for p in grid)
    failed = []
    for point in grid:
        res = _run(point, gangs)
        where = f"{point.op}/{point.mode}/W={point.W}"
        if not res.ok:
            failed.append((where, res.error))
            continue
        assert res.gate is not None and res.report is not None, where
        assert res.gate["err_vs_none"] <= TOL and res.gate["err_vs_reference"] <= TOL, (where, res.gate)
        errs = res.report["grad_errors_vs_none"]
        assert set(errs) == {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"}, where
        assert max(errs.values()) <= 1e-4, (where, errs)
    assert not failed, failed
