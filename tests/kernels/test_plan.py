"""Launch plans (`kernels/plan.py`): configs, recompute policy and recorder passed with each call, no process globals.

Scenarios:
- two plans coexist in one process: two calls with different explicit configs each launch with their own (observed
  through two recorders), and a training step's backward launches with the plan of its forward although another
  plan ran in between (interpreted Triton, tiny shapes);
- `config=` is sugar for the plan's configs (merged on top); the plan is frozen; `keep` is validated in one line;
- the default plan: `set_default_plan` / `use_autotune` hold in the context that set them; a thread started later
  sees the `CPBENCH_AUTOTUNE` plan (here none); `set_default_plan(None)` goes back to it.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

import kernels
from kernels.configs import LaunchConfig
from kernels.plan import KEEP_POLICIES, LaunchPlan, LaunchRecorder, default_plan, set_default_plan
from tests.utils import make_inputs

OP = "gdn"
SMALL = LaunchConfig(BK=16, BV=16, num_warps=2, num_stages=1)
OTHER = LaunchConfig(BK=16, BV=16, num_warps=1, num_stages=2)
# the kernels GDN's forward launches (the fused two-kernel path, fwd_path "auto"): the Ag pass and the fused pass
PREP, PASS = "wy_gdn_ag_fwd", "gdn_fused_state_output_fwd"


def _inputs(grad: bool = False) -> tuple[torch.Tensor, ...]:
    q, k, v, g, beta, _ = make_inputs(OP, B=1, T=64, H=1, K=16, V=16)
    return tuple(x.detach().clone().requires_grad_(grad) for x in (q, k, v, g, beta))


def test_two_plans_coexist_in_one_process() -> None:
    xs = _inputs()
    rec_a, rec_b = LaunchRecorder(), LaunchRecorder()
    plan_a = LaunchPlan(configs={PREP: SMALL}, recorder=rec_a)
    plan_b = LaunchPlan(configs={PREP: OTHER, PASS: LaunchConfig(BV=16, num_warps=1)},
                        recorder=rec_b)
    o_a, _ = kernels.forward(OP, *xs, backend="triton", plan=plan_a)
    o_b, _ = kernels.forward(OP, *xs, backend="triton", plan=plan_b)
    assert rec_a[PREP][1] == SMALL and rec_b[PREP][1] == OTHER
    assert rec_a[PASS][1] != rec_b[PASS][1]
    assert rec_a[PREP][0] == rec_b[PREP][0]  # same shape key, each call its own config
    torch.testing.assert_close(o_a, o_b, rtol=1e-5, atol=1e-5)  # other tiles, same math


def test_a_backward_launches_with_the_plan_of_its_forward() -> None:
    rec_a, rec_b = LaunchRecorder(), LaunchRecorder()
    xs = _inputs(grad=True)
    pair = {"bwd_grads": "pair"}  # the backward's two gradient kernels (GDN's default is one: AUTO_BWD_GRADS)
    o, _ = kernels.forward(OP, *xs, backend="triton", plan=LaunchPlan(configs={"wy_bwd": SMALL}, recorder=rec_a, **pair))
    kernels.forward(OP, *_inputs(grad=True), backend="triton",
                    plan=LaunchPlan(configs={"wy_bwd": OTHER}, recorder=rec_b, **pair))
    assert "wy_bwd" not in rec_a and "wy_bwd" not in rec_b  # forwards only so far
    o.sum().backward()
    assert rec_a["wy_bwd"][1] == SMALL and "wy_bwd" not in rec_b


def test_config_is_merged_on_top_of_the_plan() -> None:
    rec = LaunchRecorder()
    plan = LaunchPlan(configs={PREP: SMALL, PASS: LaunchConfig(BV=16)}, recorder=rec)
    kernels.forward(OP, *_inputs(), backend="triton", plan=plan, config={PREP: OTHER})
    assert rec[PREP][1] == OTHER and rec[PASS][1] == LaunchConfig(BV=16)
    assert plan.configs[PREP] == SMALL  # the caller's plan is unchanged


def test_plan_is_frozen_and_keep_is_checked() -> None:
    plan = LaunchPlan(configs={"wy_gdn_fwd": SMALL})
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.keep = "wy"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.configs["wy_gdn_fwd"] = OTHER  # type: ignore[index]
    kept = [(LaunchPlan(keep=k).keeps("gdn"), LaunchPlan(keep=k).keeps_ag("gdn")) for k in KEEP_POLICIES]
    off = (False, False)
    assert kept == [((True, False), (True, False)), (off, off), ((True, False), (True, False)),
                    ((True, False), (True, True)), ((True, False), off), ((True, True), off)]  # fmt: skip
    # "auto" (the default) is AUTO_KEEP's per op: both keep their Ag pass's outputs (KDA's on its two-kernel forward)
    assert plan.keep == "auto" and (plan.keep_for("gdn"), plan.keep_for("kda")) == ("ag", "ag")
    assert plan.keeps("kda") == plan.keeps_ag("kda") == (True, False)
    assert [plan.replace(keep=k).keep_for(op) for k in ("inputs", "wy") for op in ("gdn", "kda")] == [
        "inputs", "inputs", "wy", "wy"]  # fmt: skip
    allowed = r"auto, inputs, ag, ag\+states, wy, wy\+states"
    with pytest.raises(ValueError, match=rf"^LaunchPlan\.keep must be one of {allowed}, got 'none'$"):
        plan.replace(keep="none")
    assert plan.bwd_grads == "auto" and plan.replace(bwd_grads="fused").bwd_grads == "fused"
    with pytest.raises(ValueError, match=r"^LaunchPlan\.bwd_grads must be one of auto, pair, fused, reverse, tilelang, got 'one'$"):
        plan.replace(bwd_grads="one")
    # the backward's warm window: per op by default (AUTO_BWD_WARM: 4 chunks for both since session 13), or the plan's
    assert plan.bwd_warm is None and (plan.bwd_warm_for("gdn"), plan.bwd_warm_for("kda")) == (4, 4)
    assert [plan.replace(bwd_warm=w).bwd_warm_for(op) for w in (0, 2) for op in ("gdn", "kda")] == [0, 0, 2, 2]
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match=r"^LaunchPlan\.bwd_warm must be None \(per op\) or an int >= 0 \(chunks; 0 = exact\), got "):
            plan.replace(bwd_warm=bad)


def test_default_plan_holds_in_its_context_not_in_a_later_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CPBENCH_AUTOTUNE", raising=False)
    mine = LaunchPlan(configs={"wy_gdn_fwd": SMALL}, keep="wy")
    set_default_plan(mine)
    try:
        assert default_plan() is mine
        seen: list[LaunchPlan] = []
        thread = threading.Thread(target=lambda: seen.append(default_plan()))
        thread.start()
        thread.join()
        assert seen == [LaunchPlan()]  # the CPBENCH_AUTOTUNE plan: none set, so every kernel at its default
    finally:
        set_default_plan(None)
    assert default_plan() == LaunchPlan()
