"""KDA's two-kernel forward (`kernels.ops.kda.fused`: the Ag pass, then GDN's fused state+output pass with the per-key
gate) against the fp32 per-token reference (interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1) and against the WY
path (`fwd_path="wy"`), on random inputs.

Scenarios: dense with grouped value heads HV = 2H, value head 0 strong (gates down to -20 per token and -1000 masks:
the Ag pass's elementwise diagonal blocks, decays underflowing inside a chunk), an initial state, the output and the
state-only modes, and the WY path on the same inputs; through `chunk_kda_fwd`'s default path, varlen with partial and
sub-chunk sequences, K, V not powers of two, split into 1-chunk segments (the TRANSITION maps and the segment chain),
at chunks of 64 and 32; the WY path where the plan keeps its factors. The Ag pass's `gated` variant (qg, ke, kd, G_C
read by the fused pass) on the same scenarios, at gates down to -20 per token, and under the warm split. The warm split on this path: tests/kernels/common/test_warm_split.py.
Tolerance: 1e-5 relative L2 on CPU (IEEE fp32 dots); 1e-2 on a GPU (tf32 dots).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.common.index import prepare_chunk_index
from kernels.common.seqsplit import whole_sequences
from kernels.ops.gdn.fused import FUSED_VARIANTS, KDA_FUSED_STATE_OUTPUT_FWD, gdn_fused_state_output
from kernels.ops.kda.chunk import chunk_kda_fwd
from kernels.ops.kda.naive import naive_recurrent_kda
from kernels.ops.kda.wy_ag import KDA_AG_VARIANTS, GatedKeys, gated_ag_plan, wy_kda_ag
from kernels.plan import LaunchPlan, LaunchRecorder, default_plan
from tests.kernels.ops.kda.test_wy_ag import DIM, HV, kda_grouped_inputs
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2


def _reference(q, k, v, g, beta, cu, h0):
    hv = v.shape[2]
    q, k = (x.repeat_interleave(hv // x.shape[2], dim=2) for x in (q, k))
    return naive_recurrent_kda(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, initial_state=h0, output_final_state=True,
                               cu_seqlens_cpu=cu.tolist() if cu is not None else None)  # fmt: skip


@pytest.mark.parametrize("gated", [False, True], ids=["inline", "gated"])
def test_dense_grouped_heads_strong_gates(gated: bool) -> None:
    """gated: the Ag pass's `gated` variant hands qg, ke, kd, G_C to the pass (PRE_GATED), which reads them at HV
    heads."""
    q, k, v, g, beta, cu = kda_grouped_inputs("dense", lb=-0.5)
    h0 = make_state(1, HV, DIM, DIM, device=DEVICE)
    index = prepare_chunk_index(None, batch=1, seq_len=v.shape[1], chunk_size=64, device=v.device)
    ag, aqk, gates = wy_kda_ag(q, k, g, beta, scale=DIM**-0.5, index=index, launch=gated_ag_plan(gated=gated))
    if isinstance(gates, GatedKeys):
        assert gated
        qx, kx, gx, extra = gates.qg, gates.ke, gates.gc, {"kd": gates.kd}
    else:
        assert not gated
        qx, kx, gx, extra = q, k, gates, {}
    rec = LaunchRecorder()
    run = {
        "layout": whole_sequences(index),
        "BT": 64,
        "h0": h0,
        "output_final_state": True,
        "launch": LaunchPlan(recorder=rec),
        **extra,
    }
    o, ht = gdn_fused_state_output(qx, kx, v, ag, gx, aqk=aqk, scale=DIM**-0.5, **run)
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert rec["kda_fused_state_output_fwd"][0]["HV"] == HV
    assert rec["kda_fused_state_output_fwd"][0]["H"] == (HV if gated else HV // 2)  # the gated keys: per value head
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    _, ht_only = gdn_fused_state_output(None, kx, v, ag, gx, **run)
    assert_rel_close("ht (state only)", ht_ref, ht_only, TOL)
    o_wy, _ = chunk_kda_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, fwd_path="wy")
    assert_rel_close("o against the WY path", o_wy, o, TOL)


@pytest.mark.parametrize(("chunk", "lb", "gated", "variant"), [
    (64, -0.5, False, None), (32, -0.5, False, None), (64, -0.5, True, None), (32, -0.5, True, None),
    (64, -5.0, True, None), (64, -20.0, True, None), (64, -0.02, True, None), (64, -5.0, True, "tma"),
])  # fmt: skip
def test_varlen_split(chunk: int, lb: float, gated: bool, variant: str | None) -> None:
    """1-chunk segments (the TRANSITION maps, the chain, the output from each segment's state); gated: the Ag pass's
    `gated` variant, at weak gates, FLA's safe-gate bound -5 and per-token gates down to -20 (exp(G) underflows
    within a chunk); variant: the fused pass's code variant (tma: kd by its descriptor too)."""
    lengths = (37, 100, 5)
    q, k, v, g, beta, cu = make_inputs("kda", lengths, H=1, K=24, V=20, lb=lb, device=DEVICE)
    h0 = make_state(len(lengths), 1, 24, 20, device=DEVICE)
    rec = LaunchRecorder()
    plan = gated_ag_plan(default_plan().with_recorder(rec), gated)
    if variant is not None:
        spec = KDA_FUSED_STATE_OUTPUT_FWD
        plan = plan.with_configs({spec.name: dataclasses.replace(spec.default, VARIANT=FUSED_VARIANTS[variant])})
    o, ht = chunk_kda_fwd(q, k, v, g, beta, scale=24**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                          split_chunks=1, chunk_size=chunk, plan=plan, fwd_path="fused")  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    assert "seg_chain_fwd" in rec and "wy_kda_fwd" not in rec, sorted(rec)
    assert rec["kda_fused_state_output_fwd"][0]["BT"] == chunk
    bits = KDA_AG_VARIANTS["gated"] if gated else None
    assert bits == rec["wy_kda_ag_fwd"][1].VARIANT


def test_gated_warm_split() -> None:
    """The warm split on the gated form: head 0 strong (its transitions certified, windows from zero), head 1 weak
    (exact maps), against the reference with initial states."""
    lengths = (10, 270)
    q, k, v, g, beta, cu = make_inputs("kda", lengths, H=2, K=16, V=16, lb=-0.5, device=DEVICE)
    g[:, :, 0] *= 40
    h0 = make_state(len(lengths), 2, 16, 16, device=DEVICE)
    report: dict = {}
    o, ht = chunk_kda_fwd(q, k, v, g, beta, scale=16**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                          split_chunks=2, warm_chunks=1, warm_report=report, plan=gated_ag_plan(), fwd_path="fused")  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    ok = report["certified"].cpu()
    assert ok[:, 0].all() and not ok[:, 1].any(), ok
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_wy_path_where_the_walk_does_not_run_and_where_the_plan_keeps_its_factors() -> None:
    """KDA's default forward where the TileLang walk does not run (here: K = 16, and on the CPU) is the WY one
    (`kernels.vocabulary.AUTO_FWD_PATH` "walk": its two-kernel forward on the Triton pass measured no faster on the
    H200), where the default policy ("ag") keeps nothing; so is the forward where the plan keeps the WY factors (only
    it makes them); exact both."""
    lengths = (70, 20)
    q, k, v, g, beta, cu = make_inputs("kda", lengths, H=1, K=16, V=16, lb=-0.5, device=DEVICE)
    o_ref, _ = _reference(q, k, v, g, beta, cu, None)
    rec, keep = LaunchRecorder(), {}
    o, _ = chunk_kda_fwd(q, k, v, g, beta, scale=16**-0.5, cu_seqlens=cu, plan=LaunchPlan(keep="wy", recorder=rec),
                         keep=keep)  # fmt: skip
    assert_rel_close("o", o_ref, o, TOL)
    assert "kda_fused_state_output_fwd" not in rec and "wy_kda_fwd" in rec and {"w", "u"} <= set(keep), sorted(rec)
    rec, keep = LaunchRecorder(), {}
    o, _ = chunk_kda_fwd(q, k, v, g, beta, scale=16**-0.5, cu_seqlens=cu, plan=LaunchPlan(recorder=rec), keep=keep)
    assert_rel_close("o", o_ref, o, TOL)
    assert "kda_fused_state_output_fwd" not in rec and "wy_kda_fwd" in rec and keep == {}, sorted(rec)


def test_the_walk_or_a_tilelang_pass_in_the_plan_takes_the_fused_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """KDA's "auto" forward path (`AUTO_FWD_PATH` "walk") is the two-kernel one where its state+output pass runs on the
    TileLang walk (`KDA.fwd_walk`: bf16, K = V = 128, chunk 64, Hopper), else the WY one, which runs no Ag pass and
    no walk; a plan naming a TileLang pass of the two-kernel forward (`fwd_pass` or `ag_pass` "tilelang") takes the
    fused path, so the option is never silently ignored; kept WY factors still need the WY path."""
    from kernels.common.chunk_fwd import check_fwd_path
    from kernels.ops.gdn import tilelang_hopper
    from kernels.ops.kda.chunk import KDA

    opts = {"op": "kda", "fused_fwd": KDA.fused_fwd, "keep_states": False}
    assert not check_fwd_path("auto", keep_wy=False, **opts)
    assert check_fwd_path("auto", keep_wy=False, walk=True, **opts)
    assert not check_fwd_path("auto", keep_wy=True, walk=True, **opts)
    assert check_fwd_path("auto", keep_wy=False, tilelang=True, **opts)
    assert not check_fwd_path("auto", keep_wy=True, tilelang=True, **opts)
    assert KDA.fwd_walk is not None
    k = torch.zeros(1, 64, 1, 128, dtype=torch.bfloat16)
    assert not KDA.fwd_walk(k, k, 64, LaunchPlan())  # refused on the CPU
    monkeypatch.setattr(tilelang_hopper, "tilelang_refusal_cached", lambda *a: None)  # as on an H200
    assert KDA.fwd_walk(k, k, 64, LaunchPlan()) and not KDA.fwd_walk(k.float(), k.float(), 64, LaunchPlan())
    assert not KDA.fwd_walk(k, k, 64, LaunchPlan(fwd_pass="triton"))


def test_no_decay_bound_sums_where_the_forward_cannot_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """(session 33) KDA's two-kernel forward asks its Ag pass for the decay-bound sums of the warm windows (`bnd`,
    reading v) only where it may split (`kernels.ops.gdn.fused.forward_splits(gated=True)`): not with split_chunks=0,
    and o is the same."""
    import kernels.ops.kda.fused as kfused
    from kernels.common.warm_split import warm_inputs, with_chunk_bound

    q, k, v, g, beta, cu = kda_grouped_inputs("dense", lb=-0.5)
    o_ref, _ = _reference(q, k, v, g, beta, cu, None)
    index = prepare_chunk_index(None, batch=1, seq_len=v.shape[1], chunk_size=64, device=v.device)
    asked: list[bool] = []

    def recording(*args, bnd=None, **kw):  # type: ignore[no-untyped-def]
        asked.append(bnd is not None)
        return wy_kda_ag(*args, bnd=bnd, **kw)

    monkeypatch.setattr(kfused, "wy_kda_ag", recording)
    for split, want in ((0, False), (None, True)):
        warm = with_chunk_bound(warm_inputs("kda", k, v, g, beta, 1, path="fused"), index.num_chunks)
        asked.clear()
        o, _ = kfused.kda_fused_fwd(q, k, v, g, beta, scale=DIM**-0.5, index=index, launch=LaunchPlan(),
                                    split_chunks=split, warm=warm)  # fmt: skip
        assert asked == [want], (split, asked)
        assert_rel_close(f"o split_chunks={split}", o_ref, o, TOL)
