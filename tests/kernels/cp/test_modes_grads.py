"""Every CP scheme trains: each rank's local input gradients, gathered here, vs `none` and vs the fp32 reference.

gloo, torch backend, fp32 inputs, T = 256, K = V = 16: on every rank `o_local.backward(shard(do))` with one
random `do`; the W ranks' gradients of q, k, v, g, beta (unsharded) must match, at relative L2 <= 1e-5 (fp32
both sides, same math in another summation order; measured ~1e-6), the gradients of `none` over the whole
batch and of autograd through the per-token reference. Cases: a sequence crossing ranks mid-part, a single
long sequence, varlen with a sequence shorter than a chunk at a part edge; W = 2 for every scheme x op x
layout, W = 4 for a subset; grouped value heads (H = 2, HV = 4). tail_exchange's default (`fallback: none`,
warmup estimate) is checked where its function is exact (every crossing sequence starts inside the window)
and, at lb = -1, within the tolerance like its forward. warmup_correct (one device) vs the same truths, and
its `none` fallback against autograd through its own forward (the gradient of the function it computes).
Then the profiler: the backward's collectives per scheme = `expected_collectives(..., "bwd")`, and zero host
syncs in the whole training step; the engine's training step (`runners.training.train_step`) profiled as one,
split per direction (`by_direction`): its forward's counts = `expected_collectives(..., "fwd")`, its backward's
= `(..., "bwd")`, the two directions' bytes summing to the step's.
"""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

import kernels
import kernels.cp as cp
from runners.profile import profile_step
from tests.kernels.cp import cases
from tests.kernels.cp.cases import train_inputs
from tests.utils import assert_rel_close

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

TOL = 1e-5
K = V = 16
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")
CASES = {
    "cut-mid-rank": (100, 156),       # W = 2: sequence 1 starts inside rank 0's tail window (tail_exchange exact)
    "single-long": (256,),
    "short-at-edge": (120, 12, 124),
}
EXACT = [("headwise", None), ("all_gather", None), ("ring", None), ("true_cp", None),
         ("tail_exchange", {"fallback": "true_cp"}), ("tail_exchange", None)]


@functools.cache
def _truth(op: str, case: str, H: int, HV: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """(reference [o, dq, ...], none [o, dq, ...], cu) on the whole batch."""
    q, k, v, g, beta, cu, do = train_inputs(op, CASES[case], H, HV, K, V, -1.0, 0)
    out = []
    for mode in ("reference", "none"):
        xs = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
        if mode == "reference":
            o, _ = kernels.reference(op, *xs, cu_seqlens=cu)
        else:
            o = cp.forward("none", op, *xs, group=None, ctx=cp.build_context(cu, 1, 0), backend="torch")
        o.backward(do)
        out.append([o.detach(), *(x.grad for x in xs)])
    for name, a, b in zip(NAMES, *out, strict=True):
        assert_rel_close(f"none vs reference {name}", a, b, TOL)
    return out[0], out[1], cu.tolist()


def _compare(per_rank: list[dict], ref: list, base: list, cu: list[int], W: int, layout: str) -> None:
    ctx = cp.build_context(cu, W, 0, layout)
    for label in per_rank[0]:
        for i, name in enumerate(NAMES):
            got = cp.unshard([r[label][i] for r in per_rank], ctx)
            assert_rel_close(f"{label} {name} vs none", base[i], got, TOL)
            assert_rel_close(f"{label} {name} vs reference", ref[i], got, TOL)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("case", list(CASES))
def test_grads_w2(gang2, case: str, op: str, layout: str) -> None:
    ref, base, cu = _truth(op, case, 4, 4)
    per_rank = gang2.run(cases.grads, {"op": op, "lengths": CASES[case], "layout": layout, "runs": EXACT, "H": 4, "K": K, "V": V})
    _compare(per_rank, ref, base, cu, 2, layout)


@pytest.mark.parametrize(("op", "case", "layout"), [("gdn", "short-at-edge", "zigzag"), ("kda", "single-long", "contiguous")])
def test_grads_w4(gang4, op: str, case: str, layout: str) -> None:
    ref, base, cu = _truth(op, case, 4, 4)
    per_rank = gang4.run(cases.grads, {"op": op, "lengths": CASES[case], "layout": layout, "runs": EXACT, "H": 4, "K": K, "V": V})
    _compare(per_rank, ref, base, cu, 4, layout)


@pytest.mark.parametrize("op", ["kda"])  # GDN's state gradient on triton: tests/kernels/common/test_chunk_bwd.py
def test_true_cp_grads_triton_w2(gang2, op: str) -> None:
    """true_cp on the triton backend (interpreted): rank 0 carries its state out, so it takes its segment term from
    the state gradient alone (`prims.state_grad`: WY prep + reverse state pass) and runs one backward after the
    all-gather; rank 1 runs its one backward before it. Every gradient as `none`'s and the reference's."""
    ref, base, cu = _truth(op, "short-at-edge", 2, 2)
    per_rank = gang2.run(cases.grads, {"op": op, "lengths": CASES["short-at-edge"], "layout": "contiguous",
                                       "runs": [("true_cp", None)], "H": 2, "K": K, "V": V, "backend": "triton"})
    _compare(per_rank, ref, base, cu, 2, "contiguous")


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_grads_grouped_heads(gang2, op: str) -> None:
    ref, base, cu = _truth(op, "short-at-edge", 2, 4)
    per_rank = gang2.run(cases.grads, {"op": op, "lengths": CASES["short-at-edge"], "layout": "zigzag", "runs": EXACT, "H": 2, "HV": 4, "K": K, "V": V})
    _compare(per_rank, ref, base, cu, 2, "zigzag")


@pytest.mark.parametrize("mode", ["ring", "true_cp", "tail_exchange"])
def test_grads_grouped_heads_triton(gang2, mode: str) -> None:
    """The hand-backward schemes on triton with grouped value heads (HV = 2H): q and k reach the kernels unexpanded
    (they read the shared head, the backward sums dq, dk per group); every gradient equals the reference's."""
    ref, base, cu = _truth("gdn", "short-at-edge", 2, 4)
    runs = [(mode, None)]
    per_rank = gang2.run(cases.grads, {"op": "gdn", "lengths": CASES["short-at-edge"], "layout": "zigzag", "runs": runs,
                                       "H": 2, "HV": 4, "K": K, "V": V, "backend": "triton"})
    _compare(per_rank, ref, base, cu, 2, "zigzag")


def test_headwise_grouped_heads_needs_heads_divisible(gang4) -> None:
    with pytest.raises(Exception, match=r"head counts divisible by the CP size, got H=2 \(q.shape\[2\]\), HV=4"):
        gang4.run(cases.grads, {"op": "gdn", "lengths": (256,), "layout": "contiguous", "runs": [("headwise", None)], "H": 2, "HV": 4, "K": K, "V": V})


def _leaves_and_reference_grads(op, inputs, cu, do):
    """Leaves of the inputs (gradients cleared) and their gradients through the fp32 per-token reference."""
    xs = [x.clone().requires_grad_() for x in inputs]
    ref, _ = kernels.reference(op, *xs, cu_seqlens=cu)
    ref.backward(do)
    truth = [x.grad.clone() for x in xs]
    for x in xs:
        x.grad = None
    return xs, truth


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("fallback", ["none", "exact", "auto"])
@pytest.mark.parametrize("lb", [-1.0, -0.01])
def test_warmup_correct_grads(op: str, fallback: str, lb: float) -> None:
    lengths = (100, 200, 212)
    q, k, v, g, beta, cu, do = train_inputs(op, lengths, 2, 2, K, V, lb, 0)
    xs, truth = _leaves_and_reference_grads(op, (q, k, v, g, beta), cu, do)
    o, report = cp.warmup_correct(op, *xs, cu_seqlens=cu, backend="torch", fallback=fallback, segments=4)
    o.backward(do)
    got = [x.grad.clone() for x in xs]
    if fallback == "none" and lb == -0.01:
        # weak decay: the warmup estimate is off (measured ~0.1), so compare with the gradient of the function
        # the step computes: autograd through its own forward (torch backend: transition and forward differentiable)
        assert int(report.violations) > 0
        wc = importlib.import_module("kernels.cp.warmup_correct")
        for x in xs:
            x.grad = None
        o2, _, _ = wc._run(op, *xs, tuple(cu.tolist()), 4, 1e-3, "torch", None, 2, "none")
        o2.backward(do)
        assert max(float((a - b).norm() / b.norm()) for a, b in zip(got, truth, strict=True)) > 1e-2  # not exact
        truth = [x.grad for x in xs]
    for name, a, b in zip(NAMES[1:], truth, got, strict=True):
        assert_rel_close(f"warmup_correct {fallback} lb={lb} {name}", a, b, TOL)


@pytest.mark.parametrize(("op", "fallback"), [("gdn", "auto"), ("kda", "exact")])
def test_warmup_correct_grads_triton(op: str, fallback: str) -> None:
    """warmup_correct on the triton backend (interpreted), slow decay so segments fall back to exact maps: the
    segment terms G come from the state gradient alone (`prims.state_grad`) and ONE varlen backward takes do and
    the chained dht; every gradient as the reference's."""
    lengths = (40, 300)
    q, k, v, g, beta, cu, do = train_inputs(op, lengths, 1, 1, K, V, -0.01, 0)
    xs, truth = _leaves_and_reference_grads(op, (q, k, v, g, beta), cu, do)
    o, report = cp.warmup_correct(op, *xs, cu_seqlens=cu, backend="triton", fallback=fallback, segments=3,
                                  window=1)
    o.backward(do)
    assert int(report.fallback_count) > 0  # the exact chain ran
    for name, x, t in zip(NAMES[1:], xs, truth, strict=True):
        assert_rel_close(f"warmup_correct triton {fallback} {name}", t, x.grad, TOL)


@pytest.mark.parametrize(("op", "backend", "fallback", "lb"), [
    ("gdn", "torch", "auto", -0.01), ("kda", "torch", "exact", -0.01), ("kda", "torch", "none", -1.0),
    ("kda", "triton", "auto", -0.01)])
def test_warmup_correct_grouped_value_heads(op: str, backend: str, fallback: str, lb: float) -> None:
    """`cp.warmup_correct` called as the engine calls it (directly, not through `cp.forward`) with grouped value heads,
    HV = 2H: issue 25's GPU sweep (H = 16, HV = 32) failed with `The size of tensor a (32) must match the size of tensor
    b (16)`. Now the output and every gradient (dq, dk summed over their value heads) equal the reference's; slow decay
    makes auto fall back to exact maps (exact states); under `none` lb = -1 makes the dropped state negligible."""
    q, k, v, g, beta, cu, do = train_inputs(op, (40, 300), 1, 2, K, V, lb, 0)
    xs, truth = _leaves_and_reference_grads(op, (q, k, v, g, beta), cu, do)
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    o, report = cp.warmup_correct(op, *xs, cu_seqlens=cu, backend=backend, fallback=fallback, segments=3, window=1)
    o.backward(do)
    assert o.shape == (1, 340, 2, V) and report.log_bound.shape == (report.num_segments, 2)
    assert fallback != "auto" or int(report.fallback_count) > 0
    assert_rel_close(f"warmup_correct HV=2H {backend} {fallback} o", ref, o.detach(), TOL)
    for name, x, t in zip(NAMES[1:], xs, truth, strict=True):
        assert_rel_close(f"warmup_correct HV=2H {backend} {fallback} {name}", t, x.grad, TOL)


def _check_profile(results: list[dict]) -> None:
    for r, res in enumerate(results):
        assert res["bwd"]["collectives"] == res["expected"]["bwd"], f"rank {r}: {res}"
        assert res["step"]["collectives"] == res["expected"]["fwd+bwd"], f"rank {r}: {res}"
        split = res["step"]["by_direction"]   # the step's forward and backward apart (runners.profile)
        for d in ("fwd", "bwd"):
            assert split[d]["collectives"] == res["expected"][d], f"rank {r} {d}: {res}"
            assert split[d]["host_syncs"] == 0, f"rank {r} {d}: {res}"
        assert {k: split["fwd"]["collective_bytes"].get(k, 0) + split["bwd"]["collective_bytes"].get(k, 0)
                for k in res["step"]["collective_bytes"]} == res["step"]["collective_bytes"], f"rank {r}: {res}"
        for part in ("bwd", "step"):
            assert res[part]["unclassified"] == [], f"rank {r}: {res}"
            assert res[part]["host_syncs"] == 0, f"rank {r}: host syncs in the training step: {res}"


def test_backward_single_device_modes() -> None:
    q, k, v, g, beta, cu, do = train_inputs("kda", (300, 212), 2, 2, K, V, -1.0, 0)
    xs = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    ctx = cp.build_context(cu, 1, 0)
    for mode, opts in (("none", None), ("warmup_correct", {"segments": 4})):
        o = cp.forward(mode, "kda", *xs, group=None, ctx=ctx, backend="torch", options=opts)
        res = profile_step(lambda o=o: o.backward(do), device=torch.device("cpu")).as_dict()
        assert res["collectives"] == {} and res["unclassified"] == [] and res["host_syncs"] == 0, (mode, res)
        assert cp.expected_collectives(mode, ctx, opts, "fwd+bwd") == {}


@pytest.mark.parametrize(("mode", "options", "bwd"), [
    ("headwise", None, {"all_to_all": 2}), ("all_gather", None, {"reduce_scatter": 1}),
    ("true_cp", None, {"all_gather": 1}), ("ring", None, None), ("tail_exchange", None, None),
    ("tail_exchange", {"fallback": "true_cp"}, {"all_gather": 1})])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_backward_collectives_w2(gang2, mode: str, options: dict | None, bwd: dict | None, layout: str) -> None:
    res = gang2.run(cases.profile_train, {"op": "kda", "lengths": (100, 300, 112), "layout": layout, "mode": mode, "options": options})
    _check_profile(res)
    if bwd is not None:
        assert all(r["bwd"]["collectives"] == bwd for r in res), res
    else:   # the forward's point-to-point pairs reversed
        pairs = 1 if layout == "contiguous" else 2
        assert sum(r["bwd"]["collectives"].get("send", 0) for r in res) == pairs, res
        assert sum(r["bwd"]["collectives"].get("recv", 0) for r in res) == pairs, res


@pytest.mark.parametrize("mode", ["ring", "true_cp"])
def test_backward_collectives_w4(gang4, mode: str) -> None:
    _check_profile(gang4.run(cases.profile_train, {"op": "gdn", "lengths": (512,), "layout": "zigzag", "mode": mode}))
