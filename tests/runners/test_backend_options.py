"""`mode_options: {triton: {keep: ...}}`: the triton backend's recompute policy (`LaunchPlan.keep`) per point.

The spec checks it (one-line errors naming the option and the allowed values); a point carries it (and its key
names it, `,opts=triton.keep=wy+states`) only when it differs from the default and takes effect: fwd+bwd on triton
in a mode that trains through `kernels.dispatch.ChunkFunction` (none, headwise, all_gather); the point's kernels
calls get it in their launch plan (`runners.execute.launch_plan`), and the process's default plan is left as it
was. End to end (in this process, Triton interpreter): a
`none` fwd+bwd point with `keep: wy+states` passes its gate (its gradients equal those of the default policy),
its steps' forwards ran under "wy+states" and their backward reused the kept WY factors and chunk states (no
`wy_gdn_fwd` / `chunk_state_fwd` launch in it), while the gate's own `none` gradients ran under the default.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import kernels.dispatch as dispatch
from kernels.common.warm_bwd import KEPT_REV_SUMS
from kernels.plan import LaunchPlan, LaunchRecorder, default_plan
from runners import backend_options
from runners.errors import SpecError
from runners.grid import expand
from runners.spec import parse_spec

BASE: dict[str, Any] = {
    "name": "keep", "ops": ["gdn"], "backends": ["torch", "triton"],
    "modes": ["none", "warmup_correct", "headwise", "all_gather", "ring", "true_cp", "tail_exchange"],
    "axes": {"T": 64, "H": 2, "K": 16, "V": 16, "W": 1, "dtype": "float32", "direction": ["fwd", "fwd+bwd"]},
}


def _rows(keep: str | None) -> dict[tuple[str, str, str], dict[str, Any]]:
    spec = {**BASE, "mode_options": {"triton": {"keep": keep}}} if keep else BASE
    return {(r["backend"], r["mode"], r["direction"]): r for r in expand(parse_spec(spec))}


def test_spec_accepts_a_policy_and_refuses_others_in_one_line() -> None:
    spec = parse_spec({**BASE, "mode_options": {"triton": {"keep": "wy+states"}, "true_cp": {"segment_len": 64}}})
    assert spec.mode_options == {"triton": {"keep": "wy+states"}, "true_cp": {"segment_len": 64}}
    cases = [
        ({"triton": {"keep": "states"}},
         "invalid sweep spec: mode_options: backend 'triton' option keep must be one of auto, inputs, ag, ag+states, "
         "wy, wy+states, got 'states'"),
        ({"triton": {"kept": "wy"}}, "invalid sweep spec: mode_options: unknown option(s) kept for backend 'triton'; known: keep"),
    ]
    for options, message in cases:
        with pytest.raises(SpecError) as err:
            parse_spec({**BASE, "mode_options": options})
        assert str(err.value) == message and "\n" not in str(err.value)
    with pytest.raises(SpecError, match=r"mode_options keys are CP modes .* or triton \(when the spec has it\); got 'triton'"):
        parse_spec({**BASE, "backends": ["torch"], "mode_options": {"triton": {"keep": "wy"}}})


def test_key_and_params_only_where_the_policy_takes_effect() -> None:
    plain, kept, default = _rows(None), _rows("wy+states"), _rows("auto")
    assert [r["key"] for r in default.values()] == [r["key"] for r in plain.values()]  # the default: keys unchanged
    assert not any("backend_options" in r["params"] for r in default.values())
    took = set()
    for where, row in kept.items():
        backend, mode, direction = where
        if backend == "triton" and direction == "fwd+bwd" and mode in ("none", "headwise", "all_gather"):
            took.add(mode)
            assert row["params"]["backend_options"] == {"keep": "wy+states"}, where
            assert row["key"] == plain[where]["key"] + ",opts=triton.keep=wy+states", where
        else:  # forward points, torch, and the modes whose backward recomputes anyway: dropped, not refused
            assert "backend_options" not in row["params"] and row["key"] == plain[where]["key"], where
    assert took == {"none", "headwise", "all_gather"}
    ring = _rows(None)[("triton", "ring", "fwd+bwd")]["params"]
    assert backend_options.for_point("triton", {"keep": "wy"}, ring["mode"], ring["direction"]) == {}


def test_point_plan_carries_keep_and_leaves_the_default() -> None:
    from runners.execute import launch_plan
    from runners.point import PointJob, PointSpec

    assert backend_options.plan_fields("triton", {"keep": "wy+states"}) == {"keep": "wy+states"}
    assert backend_options.plan_fields("torch", {}) == backend_options.plan_fields("triton", {}) == {}
    point = PointSpec("gdn", "none", "triton", B=1, T=64, H=2, K=16, V=16, backend_options={"keep": "wy+states"})
    job = PointJob(point=point, options={})
    plan, again = launch_plan(point, job), launch_plan(point, job)
    assert plan.keep == again.keep == "wy+states" and plan.table is default_plan().table
    assert plan.recorder is not None and again.recorder is not None and plan.recorder is not again.recorder
    plain = replace(point, backend_options={})
    assert launch_plan(plain, PointJob(point=plain, options={})).keep == "auto"
    assert default_plan().keep == "auto"  # nothing process-wide was set
    with pytest.raises(ValueError, match=r"must be one of auto, inputs, ag, ag\+states, wy, wy\+states, got 'all'"):
        LaunchPlan(keep="all")


def test_a_kept_point_runs_with_its_policy_and_passes_its_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.execute import run_point_job
    from runners.gang import RankContext
    from runners.point import PointJob, PointSpec

    spec = {**BASE, "backends": ["triton"], "modes": ["none"], "mode_options": {"triton": {"keep": "wy+states"}},
            "axes": {**BASE["axes"], "direction": "fwd+bwd"}}
    (row,) = expand(parse_spec(spec))
    policies: list[str] = []
    backward: list[tuple[set[str], set[str]]] = []  # (kept tensors handed to the backward, kernels it launched)
    real_forward, real_backward = dispatch.checked_forward, dispatch.chunk_backward_impl

    def checked_forward(*args: Any, **kwargs: Any) -> Any:
        if args[1] == "triton":  # the policy each triton training forward ran under (its plan's)
            policies.append(kwargs["plan"].keep)
        return real_forward(*args, **kwargs)

    def chunk_backward_impl(*args: Any, **kwargs: Any) -> Any:
        seen = LaunchRecorder()  # what this backward launched, whatever recorder its plan has
        out = real_backward(*args, **{**kwargs, "plan": kwargs["plan"].with_recorder(seen)})
        backward.append((set(kwargs.get("wy") or {}), set(seen)))
        return out

    monkeypatch.setattr(dispatch, "checked_forward", checked_forward)
    monkeypatch.setattr(dispatch, "chunk_backward_impl", chunk_backward_impl)
    options = {"timing": {"min_samples": 2, "max_samples": 2, "min_time_s": 0.0, "timeout_s": 5.0, "warmup_s": 0.0,
                          "flush_l2": False}, "check": {"reference_tokens": 64}, "profile": False}
    rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
    out = run_point_job(rc, PointJob(PointSpec.from_json(row["params"]), options, trace_path=None))
    assert out.ok and out.gate is not None, out.error
    # the gradients match those of the recompute path (the gate's `none` gradients: triton under the default
    # policy, outside the point's steps) and of the reference
    assert out.gate["err_vs_none"] <= 1e-6 and out.gate["err_vs_reference"] < 1e-3, out.gate
    assert policies.count("auto") == 1 and policies.count("wy+states") >= 4, policies
    # that `none` backward, under GDN's default ("auto": "ag", `kernels.vocabulary.AUTO_KEEP`): from the kept Ag (with
    # the q, k side of its reverse window's bound sums, under the default `bwd_warm`)
    ag_kept = {"ag", "gs", *KEPT_REV_SUMS}
    from_ag = [launched for kept, launched in backward if kept == ag_kept]
    assert len(from_ag) == 1 and {"wy_from_ag", "chunk_state_fwd"} <= from_ag[0], from_ag
    assert not {"wy_gdn_fwd", "wy_inverse"} & from_ag[0], sorted(from_ag[0])
    reused = [(kept, launched) for kept, launched in backward if kept and kept != ag_kept]
    assert len(reused) >= 3, reused  # the gate's step, the reference's, the timed samples
    for kept, launched in reused:
        assert {"w", "u", "h", "v_new"} <= kept, kept
        assert not {"wy_gdn_fwd", "chunk_state_fwd"} & launched, sorted(launched)
    assert default_plan().keep == "auto"
