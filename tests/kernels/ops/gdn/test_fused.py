"""GDN's fused state+output pass (`kernels.ops.gdn.fused`) against the fp32 per-token reference
(interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1), on random inputs with a slow-decay gate so states carry.

Ag and the gate cumsum come from a torch triangular solve here (`_ag_reference`), independent of the Ag pass (tested
on its own in tests/kernels/ops/gdn/test_wy_ag.py; the wired forward below runs it). Scenarios: dense B=2 with a partial last chunk, grouped value
heads HV = 2H, with and without an initial state; varlen with partial and sub-chunk sequences, K, V not powers of two,
split (1- and 2-chunk segments) and unsplit; the transition mode's M against a torch product of the per-chunk maps and
its S_ext against the state-only mode from zero; the wired forward `chunk_gdn_fwd(fwd_path="fused")` at chunks of
64 and 32, and its refusals.
Tolerance: 1e-5 relative L2 on CPU (IEEE fp32 dots); 1e-2 on a GPU (tf32 dots).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from kernels.common.chunk_fwd import check_fwd_path
from kernels.common.chunk_torch import from_chunks, to_chunks
from kernels.common.decay import floor_gate
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.seqsplit import plan_split, whole_sequences
from kernels.common.warm_bwd import KEPT_REV_SUMS
from kernels.ops.gdn.chunk import chunk_gdn_fwd
from kernels.ops.gdn.fused import gdn_fused_fwd, gdn_fused_state_output, gdn_fused_transition
from kernels.ops.gdn.naive import naive_recurrent_gdn
from kernels.plan import LaunchPlan, LaunchRecorder
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
SLOW = -0.05  # gate lower bound: ~exp(-1.6) decay per chunk
BT = 64


def _inputs(lengths=None, *, B=None, T=None, H=1, HV=2, K=32, V=32):
    """q, k `[.., H, K]`; v, g, beta `[.., HV, ..]`; cu_seqlens; the chunk index."""
    q, k, _, _, _, cu = make_inputs("gdn", lengths, B=B, T=T, H=H, K=K, V=V, device=DEVICE)
    _, _, v, g, beta, _ = make_inputs("gdn", lengths, B=B, T=T, H=HV, K=K, V=V, lb=SLOW, seed=3, device=DEVICE)
    index = prepare_chunk_index(cu, batch=k.shape[0], seq_len=k.shape[1], chunk_size=BT, device=k.device)
    return q, k, v, g, beta, cu, index


def _expand(x: Tensor, HV: int) -> Tensor:
    return x.repeat_interleave(HV // x.shape[2], dim=2)


def _reference(q, k, v, g, beta, cu, h0):
    HV = v.shape[2]
    return naive_recurrent_gdn(
        _expand(q, HV),
        _expand(k, HV),
        v,
        g,
        beta,
        scale=q.shape[-1] ** -0.5,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens_cpu=cu.tolist() if cu is not None else None,
    )


def _ag_reference(k: Tensor, g: Tensor, beta: Tensor, index: ChunkIndex) -> tuple[Tensor, Tensor]:
    """(Ag, gcum) by a torch triangular solve per chunk, fp32."""
    kc = to_chunks(_expand(k, g.shape[2]), index)
    G = to_chunks(floor_gate(g), index).cumsum(2)
    bc = to_chunks(beta, index)
    strict = torch.ones(BT, BT, dtype=torch.bool, device=k.device).tril(-1)
    E = torch.where(strict, (G[..., :, None] - G[..., None, :]).clamp_max(0).exp(), 0.0)
    A = (kc @ kc.transpose(-1, -2)) * E * bc[..., None]
    eye = torch.eye(BT, device=k.device).expand_as(A)
    Tm = torch.linalg.solve_triangular(A + eye, eye, upper=False, unitriangular=True)
    B, T = k.shape[:2]
    return from_chunks(Tm * bc[:, :, None, :], index, B, T).to(k.dtype), from_chunks(G, index, B, T).contiguous()


@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_dense_grouped_heads(with_h0: bool) -> None:
    q, k, v, g, beta, cu, index = _inputs(B=2, T=130)
    h0 = make_state(2, 2, 32, 32, device=DEVICE) if with_h0 else None
    ag, gcum = _ag_reference(k, g, beta, index)
    o, ht = gdn_fused_state_output(
        q, k, v, ag, gcum, layout=whole_sequences(index), BT=BT, scale=32**-0.5, h0=h0, output_final_state=True
    )
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    _, ht_only = gdn_fused_state_output(
        None, k, v, ag, gcum, layout=whole_sequences(index), BT=BT, h0=h0, output_final_state=True
    )
    assert_rel_close("ht (state only)", ht_ref, ht_only, TOL)


@pytest.mark.parametrize("split", [0, 1, 2], ids=["unsplit", "split1", "split2"])
def test_varlen_split(split: int) -> None:
    lengths = (37, 150, 5, 64)
    q, k, v, g, beta, cu, index = _inputs(lengths, K=48, V=40)
    h0 = make_state(len(lengths), 2, 48, 40, device=DEVICE)
    rec = LaunchRecorder()
    o, ht = gdn_fused_fwd(
        q,
        k,
        v,
        g,
        beta,
        scale=48**-0.5,
        index=index,
        launch=LaunchPlan(recorder=rec),
        initial_state=h0,
        output_final_state=True,
        split_chunks=split,
        ag_prep=lambda k, g, beta, **_: _ag_reference(k, g, beta, index),
    )
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    assert ("seg_chain_fwd" in rec) == (split > 0)
    assert rec["gdn_fused_state_output_fwd"][0]["HV"] == 2


def _chunk_maps(k: Tensor, ag: Tensor, gcum: Tensor, index: ChunkIndex) -> Tensor:
    """Per chunk and value head, the map S -> M_c S of the recurrence with V = 0, fp64 `[NT, HV, K, K]`:
    M_c = gl I - K~^T Ag diag(eG) K, K~ = exp(G_last - G) K (rows past a sequence are zero)."""
    kc = to_chunks(_expand(k, ag.shape[2]), index, torch.float64)
    G = to_chunks(gcum, index, torch.float64)
    valid = to_chunks(torch.ones_like(gcum), index, torch.float64)  # 0 on the padding
    n_last = valid.sum(-1).long() - 1
    G_last = G.gather(-1, n_last[..., None])  # [NT, HV, 1]
    agc = to_chunks(ag, index, torch.float64)
    kt = kc * ((G_last - G).exp() * valid)[..., None]
    eye = torch.eye(k.shape[-1], dtype=torch.float64, device=k.device)
    return G_last.exp()[..., None] * eye - kt.transpose(-1, -2) @ agc @ (G.exp()[..., None] * kc)


def test_transition_against_chunk_maps() -> None:
    lengths = (150, 200)  # 3 + 4 chunks; segments of 2 chunks: one transition per sequence
    q, k, v, g, beta, cu, index = _inputs(lengths)
    ag, gcum = _ag_reference(k, g, beta, index)
    plan = plan_split(index, 2)
    M, S_ext = gdn_fused_transition(k, v, ag, gcum, layout=plan.transitions, BT=BT)
    maps = _chunk_maps(k, ag, gcum, index)
    for i, s in enumerate(plan.transitions_cpu):
        c0, c1 = plan.chunk_bounds_cpu[s], plan.chunk_bounds_cpu[s + 1]
        want = torch.eye(k.shape[-1], dtype=torch.float64, device=k.device).expand_as(maps[0])
        for c in range(c0, c1):
            want = maps[c] @ want
        assert_rel_close(f"M of segment {s}", want, M[i].double(), TOL)
    _, S_zero = gdn_fused_state_output(None, k, v, ag, gcum, layout=plan.transitions, BT=BT, output_final_state=True)
    assert_rel_close("S_ext", S_zero, S_ext, TOL)
    # (session 32) a (program, head) pair that need skips stores M = 0 and S_ext = its skipped state (the warm split's
    # certified window, in the launch); the others are bitwise the unmasked call's
    need = torch.tensor([[True, False], [False, True]], device=k.device)[: M.shape[0], : M.shape[1]]
    skipped = torch.randn(S_ext.shape, generator=torch.Generator().manual_seed(9)).to(k.device)
    M2, S2 = gdn_fused_transition(k, v, ag, gcum, layout=plan.transitions, BT=BT, need=need, skipped=skipped)
    assert torch.equal(M2[need], M[need]) and torch.equal(S2[need], S_ext[need])
    assert float(M2[~need].abs().max()) == 0.0 and torch.equal(S2[~need], skipped[~need])


@pytest.mark.parametrize("chunk_size", [64, 32])
def test_wired_forward_and_refusals(chunk_size: int) -> None:
    lengths = (100, 30)
    q, k, v, g, beta, cu, _ = _inputs(lengths, H=2, HV=2)
    h0 = make_state(2, 2, 32, 32, device=DEVICE)
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    call = {"initial_state": h0, "output_final_state": True, "cu_seqlens": cu, "split_chunks": 1, "chunk_size": chunk_size}
    o, ht = chunk_gdn_fwd(q, k, v, g, beta, scale=32**-0.5, fwd_path="fused", **call)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    with pytest.raises(ValueError, match="fwd_path must be one of"):
        check_fwd_path("fast", op="gdn", fused_fwd=None, keep_wy=False, keep_states=False)
    with pytest.raises(ValueError, match="without kept states"):
        chunk_gdn_fwd(q, k, v, g, beta, scale=32**-0.5, fwd_path="fused", keep={}, keep_states=True, **call)


def test_auto_path_rule() -> None:
    """The default fwd_path ("auto") runs GDN's fused forward (with a warm window too; under the default policy it
    keeps its Ag pass's outputs); the WY path where the plan keeps the WY factors for the backward (they exist only
    there) and where the output pass is unfused. Both are exact (KDA's rule: tests/kernels/ops/kda/test_fused.py)."""
    lengths = (100, 30)
    q, k, v, g, beta, cu, _ = _inputs(lengths, H=2, HV=2)
    o_ref, _ = _reference(q, k, v, g, beta, cu, None)
    cases = (({}, "auto", True), ({"warm_chunks": 2}, "auto", True), ({"keep": {}}, "auto", True),
             ({"keep": {}}, "wy", False), ({"fuse_output": False}, "auto", False))  # fmt: skip
    for extra, policy, fused in cases:
        rec = LaunchRecorder()
        o, _ = chunk_gdn_fwd(q, k, v, g, beta, scale=32**-0.5, cu_seqlens=cu, plan=LaunchPlan(keep=policy, recorder=rec),
                             **extra)  # fmt: skip
        assert_rel_close(f"o {extra}", o_ref, o, TOL)
        assert ("gdn_fused_state_output_fwd" in rec) == fused and ("wy_gdn_fwd" in rec) != fused, (extra, list(rec))
        if "keep" in extra:  # the WY path kept its factors; the fused path under "auto" (GDN: "ag") its Ag pass's
            assert {"w", "u"} <= set(extra["keep"]) if policy == "wy" else set(extra["keep"]) == {"ag", "gs", *KEPT_REV_SUMS}


def test_reverse_sums_kept_only_where_the_forward_may_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ag pass makes the backward's reverse bound sums (`KEPT_REV_SUMS`) only where the forward may split: not
    with split_chunks=0, nor where the TileLang walk's one-wave rule leaves the sequences whole (as at 8x8K on an
    H200: 8 x 16 heads fill 132 SMs), and it still does under the walk where it splits (1 sequence) and on the Triton
    pass (whose split rule needs the Ag pass's launch config). The walk is patched in as on an H200 (the SM count
    too); o is the same either way."""
    import kernels.ops.gdn.fused as fused

    lengths = (100, 30)
    q, k, v, g, beta, cu, index = _inputs(lengths, H=2, HV=2)
    o_ref, _ = _reference(q, k, v, g, beta, cu, None)
    plan = LaunchPlan()
    assert fused.forward_splits(index, k, v, plan, None)  # the Triton pass: may split
    assert not fused.forward_splits(index, k, v, plan, 0)
    call = {"scale": 32**-0.5, "index": index, "launch": plan}
    keep: dict[str, Tensor] = {}
    o, _ = gdn_fused_fwd(q, k, v, g, beta, keep=keep, split_chunks=0, **call)
    assert set(keep) == {"ag", "gs"}
    assert_rel_close("o split_chunks=0", o_ref, o, TOL)
    monkeypatch.setattr(fused, "fwd_walk_wanted", lambda k, v, BT, launch, **kw: True)
    monkeypatch.setattr(fused, "device_sms", lambda device: 2 * 2)  # two sequences x two heads: one wave, no split
    assert not fused.forward_splits(index, k, v, plan, None)
    assert fused.forward_splits(index, k, v, plan, None, keep_states=True)  # "ag+states": the Triton pass's rule
    monkeypatch.setattr(fused, "device_sms", lambda device: 132)  # 132 SMs for 4 programs: the walk splits ...
    long_index = prepare_chunk_index(torch.tensor([0, 1000, 1030], device=DEVICE), batch=1, seq_len=1030, chunk_size=BT,
                                     device=k.device)  # fmt: skip
    assert fused.forward_splits(long_index, k, v, plan, None)
    assert not fused.forward_splits(index, k, v, plan, None)  # ... a sequence of at least two segments


def test_no_decay_bound_sums_where_the_forward_cannot_split() -> None:
    """(session 33) The Ag pass sums the decay bound for the forward's warm windows (`bnd`, reading v) only where the
    forward may split (`fused.forward_splits`): with split_chunks=0 it is asked for none and o is the same; on the
    Triton pass, which may split, it is. (On an H200 the walk's one-wave rule leaves 8x8K whole: `forward_splits`'
    own test above.)"""
    from kernels.common.warm_split import warm_inputs, with_chunk_bound
    from kernels.ops.gdn.wy_ag import wy_gdn_ag

    lengths = (100, 30)
    q, k, v, g, beta, cu, index = _inputs(lengths, H=2, HV=2)
    o_ref, _ = _reference(q, k, v, g, beta, cu, None)
    asked: list[bool] = []

    def ag_prep(*args, bnd=None, **kw):  # type: ignore[no-untyped-def]
        asked.append(bnd is not None)
        return wy_gdn_ag(*args, bnd=bnd, **kw)

    for split, want in ((0, False), (None, True), (1, True)):
        warm = with_chunk_bound(warm_inputs("gdn", k, v, g, beta, 1, path="fused"), index.num_chunks)
        asked.clear()
        o, _ = gdn_fused_fwd(q, k, v, g, beta, scale=32**-0.5, index=index, launch=LaunchPlan(), split_chunks=split,
                             warm=warm, ag_prep=ag_prep)  # fmt: skip
        assert asked == [want], (split, asked)
        assert_rel_close(f"o split_chunks={split}", o_ref, o, TOL)
