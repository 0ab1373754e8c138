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
from tests.runners.test_execute_grouped_heads import _grid, _sweep, gangs  # noqa: F401

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("gate", ["in_kernel", "safe"])
def test_real_model_gate_through_every_mode(gate: str, gangs: dict[int, Gang]) -> None:  # noqa: F811
    grid = _grid("torch", ["gdn", "kda"], list(MODES), ["fwd+bwd"], gate=gate, lower_bound=-3.0, l2norm_in_kernel=True)
    assert len(grid) == 2 * (2 * len(MODES) - len(SINGLE_DEVICE))
    assert all(p.gate == gate and p.l2norm_in_kernel for p in grid)
    _sweep(grid, gangs, {"dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"})
