"""The recompute policy "ag+states" (`LaunchPlan.keep`): GDN's two-kernel forward keeps its Ag pass's outputs and the
chunk states its output launch stores (STORE_STATES with OUTPUT, `kernels.ops.gdn.fused.fused_state_output_keep`),
so the backward from Ag (`kernels.ops.gdn.ag_bwd`) runs no state recompute (`chunk_state_fwd`). On random inputs
(interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1, bf16):

- the forward: o and the final state bitwise those of the "ag" forward with exact maps (warm 0), same split (on a GPU
  within 2e-3: the STORE_STATES build is another compiled kernel); the kept
  h, v_new, M, split in `kernels.common.state_keep`'s shapes and dtypes, equal to what the "wy+states" forward keeps
  (the WY path's state pass and transitions);
  unsplit and in one-chunk segments (split forced), varlen with grouped heads (HV = 2H) and an initial state;
- the backward: no WY prep, inverse, transition or state pass and no `seg_chain_fwd`, only the reverse chain; every
  gradient (dq, dk, dv, dg, dbeta, dh0) against the "ag" policy's (same split) and autograd through the fp32 per-token
  reference: varlen + grouped heads + h0 + dht, dense B=2 with strong gates, split and unsplit; through
  `kernels.forward` (autograd) too (what KDA keeps under "ag+states": tests/kernels/ops/kda/test_ag_bwd.py).
Tolerances as tests/kernels/ops/gdn/test_ag_bwd.py: relative L2 1e-5 on CPU against the reference and between
policies (3e-4 against the reference for strong gates); on a GPU in bf16 5e-3 / 2e-2.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common import chunk_bwd as chunk_bwd_module
from kernels.common.index import prepare_chunk_index
from kernels.common.warm_bwd import KEPT_REV_SUMS
from kernels.ops.gdn.chunk import chunk_gdn_bwd, chunk_gdn_fwd
from kernels.plan import LaunchPlan, LaunchRecorder, default_plan
from tests.kernels.ops.gdn.test_ag_bwd import DEVICE, DIM, FACTOR_TOL, NAMES, RECOMPUTE, TOL, _case, _check, _reference
from tests.utils import assert_rel_close
from tests.utils.spies import count_calls

POLICY_TOL = 1e-5 if DEVICE == "cpu" else 2e-2
# the backward's state recompute and the forward chain: what "ag+states" no longer runs
STATE_RECOMPUTE = RECOMPUTE | {"gdn_fused_state_output_fwd", "seg_chain_fwd"}


def _forward(q, k, v, g, beta, cu, h0, keep: str, split: int, rec: LaunchRecorder | None = None):
    """(o, final state, kept tensors) of `chunk_gdn_fwd` under `keep`, exact maps, `split` chunks per segment."""
    kept: dict[str, torch.Tensor] = {}
    plan = LaunchPlan(keep=keep, recorder=rec)
    o, ht = chunk_gdn_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                          split_chunks=split, warm_chunks=0, keep=kept, plan=plan)  # fmt: skip
    return o, ht, kept


@pytest.mark.parametrize("split", [0, 1])
def test_forward_keeps_the_states_and_the_same_output(split: int) -> None:
    q, k, v, g, beta, cu, h0, *_ = _case(HV=2)
    o, ht, kept = _forward(q, k, v, g, beta, cu, h0, "ag+states", split)
    o_ag, ht_ag, kept_ag = _forward(q, k, v, g, beta, cu, h0, "ag", split)
    if DEVICE == "cpu":  # the stores do not touch the output
        assert torch.equal(o, o_ag) and torch.equal(ht, ht_ag)
    else:  # another compiled kernel (STORE_STATES): allow the compiler's reordering, a bf16 rounding at most
        assert_rel_close("o", o_ag.float(), o.float(), 2e-3)
        assert_rel_close("ht", ht_ag, ht, 2e-3)
    # (and under the plan's default bwd_warm, where the forward may split (`fused.forward_splits`: not at split 0), the
    # q, k side of the reverse bound sums, `warm_bwd.KEPT_REV_SUMS`)
    ag_names = {"ag", "gs", *(KEPT_REV_SUMS if split else ())}
    assert set(kept_ag) == ag_names and set(kept) == ag_names | {"h", "v_new", "split"} | ({"M"} if split else set())
    assert all(torch.equal(kept[name], kept_ag[name]) for name in ag_names)
    index = prepare_chunk_index(cu, batch=1, seq_len=k.shape[1], chunk_size=64, device=k.device)
    HV = v.shape[2]
    assert kept["h"].shape == (index.num_chunks, HV, DIM, DIM) and kept["h"].dtype == k.dtype
    assert kept["v_new"].shape == v.shape and kept["v_new"].dtype == k.dtype
    assert kept["split"].device.type == "cpu" and kept["split"].dtype == torch.int64 and int(kept["split"]) == split
    if split:  # one map per segment: 1 + 2 + 1 one-chunk segments of the three sequences (37, 70, 5 tokens)
        assert kept["M"].shape == (4, HV, DIM, DIM) and kept["M"].dtype == torch.float32
    again: dict[str, torch.Tensor] = {}  # the WY path's states and maps, same split
    chunk_gdn_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, cu_seqlens=cu, split_chunks=split, keep=again,
                  keep_states=True, plan=LaunchPlan(keep="wy+states"))  # fmt: skip
    assert int(again["split"]) == split
    for name in ("h", "v_new", "M") if split else ("h", "v_new"):
        assert_rel_close(name, again[name].float(), kept[name].float(), FACTOR_TOL)
        assert kept[name].abs().sum() > 0, name  # written (random inputs, h0 nonzero)


@pytest.mark.parametrize(
    "case",
    [
        {"HV": 2, "split": 1},  # varlen, partial and sub-chunk sequences, grouped heads, h0, dht, one-chunk segments
        {"HV": 2, "split": 0},  # unsplit
        {"lengths": None, "B": 2, "T": 130, "HV": 1, "split": 1, "strong": True},  # dense, gates -5 to -5.5 per token
    ],
    ids=["varlen-grouped-split", "varlen-grouped-unsplit", "dense-strong-split"],
)
def test_backward_from_kept_states(case) -> None:
    """The backward reads the kept states: no state recompute, no forward chain; the "ag" policy's gradients (its
    backward recomputes the states, same split) and the reference's."""
    case = dict(case)
    split, strong = case.pop("split"), case.pop("strong", False)
    q, k, v, g, beta, cu, h0, do, dht = _case(**case)
    if strong:
        g = (-5.0 - 0.5 * torch.rand(g.shape, generator=torch.Generator().manual_seed(3))).to(DEVICE)
        h0 = dht = None
    opts = {"scale": DIM**-0.5, "initial_state": h0, "dht": dht, "cu_seqlens": cu, "split_chunks": split}
    got, runs = {}, {}
    for keep in ("ag+states", "ag"):
        *_, kept = _forward(q, k, v, g, beta, cu, h0, keep, split)
        rec = LaunchRecorder()
        got[keep] = chunk_gdn_bwd(q, k, v, g, beta, do, wy=kept, plan=default_plan().with_recorder(rec), **opts)
        runs[keep] = set(rec)
    assert "chunk_state_bwd" in runs["ag+states"] and not runs["ag+states"] & STATE_RECOMPUTE, sorted(runs["ag+states"])
    assert "chunk_state_fwd" in runs["ag"]  # the "ag" backward recomputes them
    assert ("seg_chain_bwd" in runs["ag+states"]) == bool(split)
    for name, a, b in zip(NAMES, got["ag+states"], got["ag"], strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert_rel_close(f"{name} vs ag", b.float(), a.float(), POLICY_TOL)
    bounds = cu.tolist() if cu is not None else [i * k.shape[1] for i in range(k.shape[0] + 1)]
    _check(got["ag+states"], _reference(q, k, v, g, beta, h0, do, dht, bounds), max(TOL, 3e-4) if strong else TOL)


def test_training_step_through_the_public_op() -> None:
    """keep="ag+states" through `kernels.forward` (autograd, varlen, grouped heads, h0, dht): the backward runs no
    recompute of the WY factors or the states; gradients equal the "ag" policy's and the reference's."""
    q, k, v, g, beta, cu, h0, do, dht = _case(HV=2, seed=11)
    grads, runs = {}, {}
    for keep in ("ag+states", "ag"):
        rec = LaunchRecorder()
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
        s0 = h0.detach().clone().requires_grad_()
        o, ht = kernels.forward("gdn", *xs, initial_state=s0, output_final_state=True, cu_seqlens=cu, backend="triton",
                                plan=LaunchPlan(keep=keep, recorder=rec))  # fmt: skip
        rec.clear()
        ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
        grads[keep], runs[keep] = [x.grad for x in xs] + [s0.grad], set(rec)
    assert {"wy_from_ag", "chunk_state_bwd"} <= runs["ag+states"] and not runs["ag+states"] & STATE_RECOMPUTE
    for name, a, b in zip(NAMES, grads["ag+states"], grads["ag"], strict=True):
        assert_rel_close(f"{name} vs ag", b.float(), a.float(), POLICY_TOL)
    _check(grads["ag+states"], _reference(q, k, v, g, beta, h0, do, dht, cu.tolist()))


def test_warm_forward_keeps_no_maps_under_the_reverse_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the plan's `bwd_warm` (the reverse state pass's certified window, `kernels.common.warm_bwd`), "ag+states"
    keeps the forward's warm split and no maps M: strong gates certify every window of both directions (the reports
    say so), the kept states equal the exact-maps forward's, and every gradient matches the reference's. The reverse
    windows' bound sums come from the forward's q, k side (`KEPT_REV_SUMS`, `reverse_chunk_bound_kept`):
    `reverse_chunk_bound` does not run, and without those kept sums (it runs) the gradients are the same."""
    q, k, v, g, beta, _, _, do, _ = _case(lengths=None, B=1, T=320, HV=2)  # 5 chunks: segments of 2, windows of 1
    g = (-5.0 - 0.5 * torch.rand(g.shape, generator=torch.Generator().manual_seed(4))).to(DEVICE)
    fwd_report: dict[str, torch.Tensor] = {}
    bwd_report: dict[str, torch.Tensor] = {}
    kept: dict[str, torch.Tensor] = {}
    plan = LaunchPlan(keep="ag+states", bwd_warm=1)
    opts = {"scale": DIM**-0.5, "split_chunks": 2}
    o, _ = chunk_gdn_fwd(q, k, v, g, beta, warm_chunks=1, warm_report=fwd_report, keep=kept, plan=plan, **opts)
    assert "M" not in kept and int(kept["split"]) == 2
    assert fwd_report["certified"].all(), fwd_report["certified"]
    *_, exact = _forward(q, k, v, g, beta, None, None, "ag+states", 2)
    for name in ("h", "v_new"):
        assert_rel_close(name, exact[name].float(), kept[name].float(), FACTOR_TOL)
    calls = count_calls(monkeypatch, chunk_bwd_module, "reverse_chunk_bound")
    assert set(KEPT_REV_SUMS) <= set(kept)
    got = chunk_gdn_bwd(q, k, v, g, beta, do, wy=kept, plan=plan, warm_report=bwd_report, **opts)
    assert bwd_report["certified"].all(), bwd_report["certified"]
    assert not calls
    ref = _reference(q, k, v, g, beta, None, do, None, [0, k.shape[1]])
    _check(got, ref, max(TOL, 3e-4))
    old = chunk_gdn_bwd(q, k, v, g, beta, do, wy={n: t for n, t in kept.items() if n not in KEPT_REV_SUMS}, plan=plan,
                        **opts)  # fmt: skip
    assert calls
    for name, a, b in zip(NAMES, got, old, strict=True):
        assert (a is None and b is None) or torch.equal(a, b), name
