"""The tuner is direction-aware: `op_runner(..., direction="fwd+bwd")` runs the training step, so every kernel it
launches (the backward's included) is seen by `ensure_tuned` and each trial is checked on o, the final state and
every input gradient.

Torch backend (CPU): the fwd+bwd runner's outputs are (o, ht, dq, dk, dv, dg, dbeta), equal at relative L2 <= 1e-5
(fp32) to autograd through the per-token reference with the same fixed `do`; two calls give identical gradients
(fresh leaves each call: no accumulation across trials); a bad direction is a ValueError naming it.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.plan import LaunchPlan
from runners.tuner.tune import Shape, make_case, op_runner
from tests.utils import assert_rel_close


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_fwd_bwd_runner_returns_the_gradients(op: str) -> None:
    shape = Shape(B=1, T=160, H=2, K=16, V=16, dtype="float32", lengths=(100, 60), lb=-1.0)
    case = make_case(op, shape, "cpu")
    run = op_runner(op, case, backend="torch", direction="fwd+bwd")
    got = run(LaunchPlan())
    assert len(got) == 7
    again = run(LaunchPlan())
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    do = case["do"]  # the case's seeded output gradient, which the runner uses
    xs = [case[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    o, ht = kernels.reference(op, *xs, cu_seqlens=case["cu_seqlens"], output_final_state=True)
    o.backward(do)
    for name, ref, mine in zip(("o", "ht", "dq", "dk", "dv", "dg", "dbeta"), (o, ht, *(x.grad for x in xs)), got,
                               strict=True):
        assert_rel_close(f"fwd+bwd runner {name}", ref.detach(), mine, 1e-5)
    assert len(op_runner(op, case, backend="torch")(LaunchPlan())) == 2


def test_bad_direction() -> None:
    case = make_case("gdn", Shape(B=1, T=64, H=1, K=16, V=16, dtype="float32"), "cpu")
    with pytest.raises(ValueError, match="direction must be 'fwd' or 'fwd\\+bwd', got direction='bwd'"):
        op_runner("gdn", case, backend="torch", direction="bwd")
