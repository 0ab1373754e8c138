"""`benchmarks/host_calls.py` counts what one training step asks of the host: with the GPU's split decision
emulated, the split's own launches (segment chains, window certification) appear, and without it they do not; the
counts are per step (the plan-building first call left out) and the Triton launcher is restored afterwards."""

from __future__ import annotations

import triton.runtime.interpreter as interpreter
import triton.runtime.jit as jit

from tests.utils.scripts import load_script


def test_counts_follow_the_split_decision() -> None:
    mod = load_script("host_calls")
    run_before = jit.JITFunction.run, interpreter.InterpretedFunction.run
    split = mod.count_step("gdn", 1, 2048, 2, sms=132, K=32, V=32)
    plain = mod.count_step("gdn", 1, 2048, 2, sms=0, K=32, V=32)
    assert (jit.JITFunction.run, interpreter.InterpretedFunction.run) == run_before
    assert split["launches"].get("seg_chain_fwd_kernel", 0) >= 1 and "seg_chain_fwd_kernel" not in plain["launches"]
    assert split["n_launches"] > plain["n_launches"] >= 5
    # every step launches the forward's state pass and the fused gradient kernel once
    for r in (split, plain):
        assert r["launches"]["chunk_bwd_dqk_wy_kernel"] == 1 and r["n_launches"] == sum(r["launches"].values())
        assert r["n_aten_ops"] == sum(r["aten_ops"].values()) > 0
        assert all(line.startswith("kernels/") for line in r["aten_by_line"])
    assert split["n_aten_ops"] > plain["n_aten_ops"]


def test_the_public_op_step_is_counted_with_its_autograd_node() -> None:
    """(session 20) `api`: the public op's step (grad enabled: its autograd node runs the backward) launches what the
    direct step launches, and issues more ATen ops (the leaves' detach, the node's saved tensors); grouped value heads
    (HV > H) take that step."""
    mod = load_script("host_calls")
    direct = mod.count_step("gdn", 1, 256, 2, sms=0, K=32, V=32)
    api = mod.count_step("gdn", 1, 256, 2, sms=0, K=32, V=32, api=True)
    grouped = mod.count_step("gdn", 1, 256, 2, sms=0, K=32, V=32, HV=4)
    assert api["launches"] == direct["launches"] and api["n_aten_ops"] > direct["n_aten_ops"]
    assert api["aten_ops"].get("aten.detach.default", 0) >= 5
    assert grouped["launches"]["chunk_bwd_dqk_wy_kernel"] == 1 and grouped["n_aten_ops"] >= api["n_aten_ops"] - 2
