"""tail_exchange (warmup_correct across ranks) on gloo, W = 2 and 4: accuracy, exact fallback, collectives.

Scenarios (torch backend, fp32, H = 4, K = 16, V = 32, T = 512):
- fast-decay gates (lb = -5: over a 2-chunk window the slowest channel decays by < e^-90), fallback "none":
  every scheme case (a single long sequence; a sequence spanning three ranks at W = 4; a sequence of 12
  tokens across a rank edge, whose window reaches its start, so it is exact) matches `none` and the
  reference at relative L2 <= 1e-5, contiguous and zigzag, GDN and KDA;
- slow-decay gates (lb = -0.05): the window alone is measurably off (> 1e-3), fallback "true_cp" is exact
  (<= 1e-5);
- collectives of one profiled step: fallback "none" posts one send/recv pair per crossed boundary between
  ranks (W-1 contiguous, 2W-2 zigzag) and no all-gather; "true_cp" one all-gather and no point-to-point;
  no host sync (aten::item) from the CP code; cp.expected_collectives predicts each;
- a bad option is a ValueError naming it.
"""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.cp as cp
from tests.kernels.cp import cases
from tests.utils import assert_rel_close, make_inputs, rel_err

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

H, K, V = 4, 16, 32
CASES = {"single-long": (512,), "span-3-ranks": (60, 260, 192), "short-at-edge": (250, 12, 250)}


def _unshard_runs(gang, W: int, op: str, lengths: tuple[int, ...], layout: str, runs: list, lb: float):
    per_rank = gang.run(cases.schemes, {"op": op, "lengths": lengths, "layout": layout, "runs": runs, "H": H, "K": K, "V": V, "lb": lb, "seed": 0})
    q, k, v, g, beta, cu = make_inputs(op, lengths, H=H, K=K, V=V, lb=lb, seed=0)
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    base = cp.forward("none", op, q, k, v, g, beta, group=None, ctx=cp.build_context(cu, 1, 0), backend="torch")
    ctx = cp.build_context(cu, W, 0, layout)
    return ref, base, {label: cp.unshard([r[label] for r in per_rank], ctx) for label in per_rank[0]}


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("W", [2, 4])
def test_fast_decay_matches_none(gangs: dict, W: int, op: str, layout: str) -> None:
    runs = [("tail_exchange", {"window": 2, "fallback": "none"})]
    for case, lengths in CASES.items():
        ref, base, outs = _unshard_runs(gangs[W], W, op, lengths, layout, runs, lb=-5.0)
        for label, o in outs.items():
            assert_rel_close(f"{case} {label} vs none", base, o, 1e-5)
            assert_rel_close(f"{case} {label} vs reference", ref, o, 1e-5)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_slow_decay_true_cp_fallback_is_exact(gang2, op: str) -> None:
    runs = [("tail_exchange", {"window": 1, "fallback": "none"}), ("tail_exchange", {"fallback": "true_cp"})]
    ref, base, outs = _unshard_runs(gang2, 2, op, (512,), "contiguous", runs, lb=-0.05)
    o_win, o_exact = outs["0:tail_exchange"], outs["1:tail_exchange"]
    assert rel_err(base, o_win) > 1e-3
    assert_rel_close("true_cp fallback vs none", base, o_exact, 1e-5)
    assert_rel_close("true_cp fallback vs reference", ref, o_exact, 1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [2, 4])
def test_collectives(gangs: dict, W: int, layout: str) -> None:
    res = gangs[W].run(cases.profile, {"op": "kda", "lengths": (512,), "layout": layout, "mode": "tail_exchange",
                       "options": {"fallback": "none"}})
    for r, x in enumerate(res):
        assert x["collectives"] == x["expected"] and x["unclassified"] == [] and x["host_syncs"] == 0, (r, x)
        assert "all_gather" not in x["collectives"], (r, x)
    pairs = W - 1 if layout == "contiguous" else 2 * W - 2
    assert sum(x["collectives"].get("send", 0) for x in res) == pairs
    assert sum(x["collectives"].get("recv", 0) for x in res) == pairs
    res = gangs[W].run(cases.profile, {"op": "gdn", "lengths": (100, 300, 112), "layout": layout, "mode": "tail_exchange",
                       "options": {"fallback": "true_cp"}})
    for r, x in enumerate(res):
        assert x["collectives"] == x["expected"] == {"all_gather": 1}, (r, x)
        assert x["host_syncs"] == 0, (r, x)


@pytest.mark.parametrize(("options", "match"), [({"fallback": "ring"}, "option fallback must be one of"),
                                                ({"window": 0}, "option window must be 'auto' or an int >= 1")])
def test_bad_option_is_refused(options: dict, match: str) -> None:
    q, k, v, g, beta, cu = make_inputs("gdn", (128,), H=2, K=16, V=16)
    ctx = cp.build_context(cu, 1, 0)
    with pytest.raises(ValueError, match=match):
        cp.forward("tail_exchange", "gdn", q, k, v, g, beta, group=None, ctx=ctx, backend="torch", options=options)
    with pytest.raises(ValueError, match=match):
        cp.expected_collectives("tail_exchange", ctx, options)


def test_registered() -> None:
    assert "tail_exchange" in cp.MODES
    ctx = cp.build_context(torch.tensor([0, 512]), 2, 0)
    assert cp.expected_collectives("tail_exchange", ctx) == {"send": 1}
    assert cp.expected_collectives("tail_exchange", cp.build_context([0, 512], 2, 1)) == {"recv": 1}
