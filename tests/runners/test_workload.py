"""Inputs and the correctness measures (runners.workload, runners.correctness).

Scenarios: the same params give the same tensors and another seed other tensors; gates lie in [lb, 0] with the
op's shape, k is unit-norm, nothing is all zeros; a dense batch flattens to a varlen view with the right bounds;
reduced shapes keep divisibility, heads for headwise and the varlen structure; rel_l2 and the gate verdict
(message names both errors, NaN fails, warmup_correct gets its scheme tolerance on top); rel_l2's rule for
non-finite values; the tuner's case, the benches' inputs and a point's workload come from the one maker
(`make_inputs`: the same arguments give the same tensors; h0 and do are drawn after the inputs).
"""

from __future__ import annotations

import math

import pytest
import torch

from runners.correctness import DEFAULT_TOL, NORM_FLOOR, judge, rel_l2, tolerances
from runners.point import PointSpec
from runners.workload import make_inputs, make_workload, reduced_params


def _params(**over: object) -> PointSpec:
    p = {"op": "kda", "mode": "ring", "backend": "torch", "B": 2, "T": 96, "H": 3, "K": 16, "V": 8, "lb": -0.5,
         "W": 2, "layout": "contiguous", "direction": "fwd", "dtype": "bfloat16", "seed": 5}
    p.update(over)
    return PointSpec.from_json(p)


def test_make_workload_seeded_and_in_range() -> None:
    a, b = make_workload(_params(), device="cpu"), make_workload(_params(), device="cpu")
    c = make_workload(_params(seed=6), device="cpu")
    for x, y, z in zip(a.tensors, b.tensors, c.tensors, strict=True):
        assert torch.equal(x, y)
        assert not torch.equal(x, z)
        assert x.abs().sum() > 0
    assert a.q.shape == (2, 96, 3, 16) and a.v.shape == (2, 96, 3, 8) and a.g.shape == (2, 96, 3, 16)
    assert a.q.dtype == torch.bfloat16 and a.g.dtype == torch.float32
    assert float(a.g.max()) <= 0.0 and float(a.g.min()) >= -0.5
    assert torch.allclose(a.k.float().norm(dim=-1), torch.ones(2, 96, 3), atol=1e-2)
    assert float(a.beta.min()) > 0.0 and float(a.beta.max()) < 1.0
    gdn = make_workload(_params(op="gdn", dtype="float32"), device="cpu")
    assert gdn.g.shape == (2, 96, 3)


def test_workload_flat_and_varlen() -> None:
    wl = make_workload(_params(), device="cpu")
    assert wl.cu_seqlens is None and wl.cu_seqlens_cpu == [0, 96, 192]
    flat = wl.flat()
    assert flat.q.shape == (1, 192, 3, 16) and flat.cu_seqlens.tolist() == [0, 96, 192]
    assert torch.equal(flat.q[0, 96:], wl.q[1])
    var = make_workload(_params(lengths=[50, 30, 16], B=1, T=96), device="cpu")
    assert var.q.shape == (1, 96, 3, 16) and var.cu_seqlens_cpu == [0, 50, 80, 96]
    assert var.flat() is var


@pytest.mark.parametrize(
    ("over", "tokens", "H"),
    [
        pytest.param({"B": 1, "T": 1000}, 128, 2, id="dense-contiguous"),
        pytest.param({"B": 1, "T": 1000, "layout": "zigzag", "W": 3}, 126, 2, id="dense-zigzag"),
        pytest.param({"mode": "headwise", "H": 8, "W": 4}, 128, 4, id="headwise"),
        pytest.param({"B": 1, "T": 96}, 96, 2, id="already-small"),
    ],
)
def test_reduced_params(over: dict, tokens: int, H: int) -> None:
    small = reduced_params(_params(**over), max_tokens=128)
    unit = 2 * small.W if small.layout == "zigzag" else small.W
    n = sum(small.lengths) if small.lengths else small.T
    assert n == tokens and n % unit == 0 and small.H == H and small.B == 1


def test_reduced_params_varlen_keeps_structure() -> None:
    small = reduced_params(_params(B=1, T=1000, lengths=[600, 300, 100]), max_tokens=200)
    assert small.lengths is not None and sum(small.lengths) == small.T == 200
    assert len(small.lengths) == 3 and small.lengths[0] > small.lengths[1] > small.lengths[2]
    batch = reduced_params(_params(B=4, T=100), max_tokens=200)  # a dense batch becomes a varlen list
    assert batch.lengths == (50, 50, 50, 50) and batch.T == 200


def test_rel_l2() -> None:
    torch.manual_seed(0)
    ref = torch.randn(4, 8)
    assert rel_l2(ref, ref) == 0.0
    assert rel_l2(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    assert rel_l2(ref.reshape(1, 32), ref) == 0.0


def test_rel_l2_non_finite_rule() -> None:
    """Same non-finite value in both: agrees (left out of both norms); any other non-finite value: inf, never NaN."""
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0])
    nan, inf = math.nan, math.inf
    both = torch.tensor([nan, inf, -inf, 4.0])
    assert rel_l2(both, both) == 0.0
    assert rel_l2(torch.tensor([nan, inf, -inf, 4.4]), both) == pytest.approx(0.1)  # the finite element alone
    for bad in ([nan, 2.0, 3.0, 4.0], [1.0, inf, 3.0, 4.0], [1.0, 2.0, -inf, 4.0]):
        assert rel_l2(torch.tensor(bad), ref) == inf  # out broken where ref is finite
        assert rel_l2(ref, torch.tensor(bad)) == inf  # ref broken where out is finite
    assert rel_l2(torch.tensor([inf, 0.0]), torch.tensor([-inf, 0.0])) == inf  # opposite infinities differ
    assert rel_l2(torch.tensor([nan, 0.0]), torch.tensor([inf, 0.0])) == inf
    assert not judge(_params(dtype="float32"), err_vs_none=rel_l2(torch.tensor([nan]), torch.tensor([1.0])),
                     err_vs_reference=None, check={}).passed


def test_rel_l2_precision() -> None:
    """fp32 unless a tensor is fp64; low-precision inputs are compared in fp32, not in their own dtype."""
    ref = torch.tensor([1.0, 1e-9], dtype=torch.float64)
    assert rel_l2(ref + torch.tensor([0.0, 1e-12], dtype=torch.float64), ref) == pytest.approx(1e-12, rel=1e-6)
    x = torch.full((4096,), 1.0, dtype=torch.bfloat16)
    assert rel_l2(x, x.float() * (1 + 2**-10)) == pytest.approx(2**-10 / (1 + 2**-10), rel=1e-5)


def test_judge() -> None:
    p = _params(dtype="float32")
    ok = judge(p, err_vs_none=1e-6, err_vs_reference=None, check={})
    assert ok.passed and ok.message is None and ok.tol_none == DEFAULT_TOL["float32"]
    bad = judge(p, err_vs_none=0.5, err_vs_reference=1e-3, check={"tol_reference": 1e-4})
    assert not bad.passed
    assert "vs none 0.5 > tol 0.002" in bad.message and "vs reference (reduced shape) 0.001 > tol 0.0001" in bad.message
    assert not judge(p, err_vs_none=math.nan, err_vs_reference=None, check={}).passed
    wc = _params(mode="warmup_correct", dtype="float32", mode_options={"tol": 0.01})
    assert tolerances(wc, {}) == pytest.approx((0.012, 0.012))


def test_tune_shape() -> None:
    from runners.execute import tune_shape

    dense = tune_shape(_params(mode="none", B=2, T=96))
    assert dense == {"B": 2, "T": 96, "H": 3, "K": 16, "V": 8, "dtype": "bfloat16", "lb": -0.5, "seed": 5}
    cp = tune_shape(_params(mode="headwise", H=4, B=2, T=96))  # CP ranks launch varlen kernels on H/W heads
    assert cp["lengths"] == [96, 96] and (cp["B"], cp["T"], cp["H"]) == (1, 192, 2)
    grouped = tune_shape(_params(mode="none", H=2, HV=6))  # the kernels run with q/k expanded to HV heads
    assert grouped["H"] == 6 and "HV" not in grouped
    hw = tune_shape(_params(mode="headwise", H=4, HV=8))  # headwise with grouped heads: HV/W heads per rank
    assert _params().W == 2 and hw["H"] == 4


def test_workload_grouped_value_heads() -> None:
    wl = make_workload(_params(H=2, HV=6), device="cpu")
    assert wl.q.shape == wl.k.shape == (2, 96, 2, 16)
    assert wl.v.shape == (2, 96, 6, 8) and wl.g.shape == (2, 96, 6, 16) and wl.beta.shape == (2, 96, 6)
    small = reduced_params(_params(mode="none", W=1, H=4, HV=8, B=1, T=1000), max_tokens=128)
    assert (small.H, small.HV) == (2, 4)   # the grouping is kept
    # HV == H draws exactly the tensors of a point without the axis
    same = make_workload(_params(HV=3), device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(same.tensors, make_workload(_params(), device="cpu").tensors, strict=True))


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_the_tuner_case_comes_from_the_one_maker(op: str) -> None:
    from runners.tuner.tune import Shape, make_case

    case = make_case(op, Shape(B=2, T=48, H=2, K=16, V=8, dtype="bfloat16", lb=-0.7, seed=9, initial_state=True), "cpu")
    w = make_inputs(op, B=2, T=48, H=2, K=16, V=8, dtype="bfloat16", lb=-0.7, seed=9, device="cpu",
                    initial_state=True, grad_out=True)
    for name, x in zip(("q", "k", "v", "g", "beta", "initial_state", "do"), (*w.tensors, w.initial_state, w.do),
                       strict=True):
        assert torch.equal(case[name], x), name
    assert case["cu_seqlens"] is None and case["cu_seqlens_cpu"] is None
    # a point with the same shape draws the same inputs: h0 and do come after them
    point = make_workload(_params(op=op, B=2, T=48, H=2, K=16, V=8, lb=-0.7, seed=9), device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(point.tensors, w.tensors, strict=True))
    assert point.initial_state is None and point.do is None


def test_the_benches_inputs_come_from_the_one_maker() -> None:
    from runners.bench import kernels_train
    from runners.bench.cp import point_inputs
    from runners.bench.kernels_ops import fla_inputs

    fla = make_inputs("kda", B=1, T=64, H=2, K=16, V=16, lb=None, seed=7, device="cpu", grad_out=True, fla_recipe=True)
    assert torch.allclose(fla.q.float().norm(dim=-1), torch.ones(1, 64, 2), atol=1e-2)  # FLA's recipe: q normalised
    assert fla.g.dtype == torch.bfloat16 and float(fla.g.max()) < 0.0  # logsigmoid gate, in the activation dtype
    ops = fla_inputs("kda", 1, 64, 2, device="cpu", K=16, V=16, seed=7, grad_out=True)
    assert all(torch.equal(a, b) for a, b in zip((*ops.tensors, ops.do), (*fla.tensors, fla.do), strict=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels_train, "K", 16)
        mp.setattr(kernels_train, "V", 16)
        train = kernels_train.make_inputs("kda", 1, 64, 2, device="cpu", seed=7)
    assert all(torch.equal(a, b) for a, b in zip(train, (*fla.tensors, fla.do), strict=True))
    cp_in = point_inputs("gdn", 64, 2, 16, 8, -0.5, torch.device("cpu"), 3, torch.float32)
    point = make_workload(_params(op="gdn", B=1, T=64, H=2, K=16, V=8, lb=-0.5, seed=3, dtype="float32"), device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(cp_in, point.tensors, strict=True))


def test_make_inputs_names_a_bad_dtype() -> None:
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', 'float16', 'float32'\], got dtype='fp8'"):
        make_inputs("gdn", B=1, T=8, H=1, K=16, V=16, lb=-1.0, dtype="fp8", device="cpu")


def test_rel_l2_floor_makes_a_vanishing_reference_absolute() -> None:
    """A reference whose norm is below NORM_FLOOR (all zero, or decayed to denormals) is divided by the floor: the
    error of denormal noise around it is tiny, not O(1); a real difference from zero still fails."""
    tiny = torch.tensor([7e-45, 0.0, 1.4e-45])  # fp32 denormals
    assert rel_l2(torch.zeros(3), tiny) == pytest.approx(float(tiny.norm()) / NORM_FLOOR, rel=1e-3)
    assert rel_l2(torch.zeros(3), tiny) < 1e-13
    assert rel_l2(torch.tensor([1e-3, 0.0, 0.0]), torch.zeros(3)) > 1e20


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_real_model_gate_inputs_come_after_the_old_draws(op: str) -> None:
    """A real-model gate (issue 25) draws A_log, dt_bias and the raw gate after every older draw (the old inputs do not
    change), and the step's `Activation` is FLA's formulas, written out here (fp32):
        in_kernel: g = -exp(A_log) * softplus(g_raw + dt_bias);  safe: g = lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))
    with q, k L2-normalised per head (x / sqrt(sum x^2 + 1e-6)) under l2norm_in_kernel."""
    from runners.workload import Activation, Workload

    def inputs(**extra: str) -> Workload:
        return make_inputs(op, B=1, T=40, H=2, HV=4, K=8, V=8, lb=-1.0, dtype="float32", seed=5, device="cpu",
                           lengths=[25, 15], **extra)

    old, new = inputs(), inputs(gate="in_kernel")
    for a, b in zip(old.tensors, new.tensors, strict=True):
        if a is not old.g:
            assert torch.equal(a, b)
    A_log, dt_bias = new.params
    assert A_log.shape == (4,) and dt_bias.shape == ((4,) if op == "gdn" else (4 * 8,))
    assert ((A_log >= 0) & (A_log <= math.log(16.0))).all() and new.g.shape == old.g.shape
    dt = torch.nn.functional.softplus(dt_bias)  # the models' dt initialisation range
    assert bool(((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 1e-1 * (1 + 1e-5))).all())
    assert not torch.equal(new.g, old.g) and (new.g > 0).any()  # the raw gate, not a log decay
    per_head = (4,) if op == "gdn" else (4, 1)
    x = new.g + dt_bias.view(new.g.shape[2:])
    q, k, v, g, beta = Activation(op=op, gate="in_kernel", l2norm=True)([*new.tensors, *new.params])
    torch.testing.assert_close(g, -A_log.exp().view(per_head) * torch.log1p(x.exp()), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q, new.q / (new.q.square().sum(-1, keepdim=True) + 1e-6).sqrt(), rtol=1e-6, atol=1e-6)
    assert v is new.v and beta is new.beta
    _, _, _, g_safe, _ = Activation(op=op, gate="safe", lower_bound=-3.0)([*new.tensors, *new.params])
    torch.testing.assert_close(g_safe, -3.0 / (1 + (-(A_log.exp().view(per_head) * x)).exp()), rtol=1e-6, atol=1e-6)
    assert Activation(op=op).identity and not Activation(op=op, l2norm=True).identity


def test_a_real_model_gate_keeps_the_inputs_dtype() -> None:
    """The gate's draws leave q, k, v, beta in the point's dtype (a name clash once cast them to fp32)."""
    w = make_inputs("kda", B=1, T=16, H=2, HV=4, K=8, V=8, lb=-1.0, dtype="bfloat16", device="cpu", gate="in_kernel")
    assert {x.dtype for x in (w.q, w.k, w.v, w.beta)} == {torch.bfloat16} and w.g.dtype == torch.float32
