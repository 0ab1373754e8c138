"""The reverse walk's factors on demand (`kernels.ops.gdn.ag_bwd.ag_factors`, `kernels.common.chunk_bwd.LazyFactors`),
interpreted on CPU (on a GPU with CPBENCH_TEST_GPU=1, bf16), on random inputs:

- the state pass in the Ag form (`chunk_state_ag_fwd`: v_new = Ag (v - exp(G) o (K S)), no w, u) against the plain
  pass from `wy_from_ag`'s w, u: varlen with partial and sub-chunk sequences, grouped value heads and an initial state;
  dense with strong gates (-5 to -5.5 per token); and against the fp32 per-token reference's states;
- `wy_from_ag(sel=)`: the flagged chunks (per chunk, or per chunk and value head) equal the unselected launch's, the
  others keep what the buffers held (NaN here);
- `reverse_ends(lazy=)` against the same call with every chunk's factors: the test_warm_bwd.py scenario (chunks of 16,
  2-chunk segments from the forward's segment states, 1-chunk windows, head 0 certified and head 1 not: the
  uncertified segments' factors formed after the certification), and without a split; the same chunk states, ends
  and certified windows, and no factor formed where no pass reads it.
Tolerances: relative L2 1e-5 on CPU (IEEE fp32), 2e-2 on a GPU for the bf16-stored states (test_ag_bwd.py's factors').
"""

from __future__ import annotations

import pytest
import torch

from kernels.common import chunk_bwd as cb
from kernels.common.chunk_state import SeqLayout, chunk_state_ag_fwd, chunk_state_fwd
from kernels.common.index import prepare_chunk_index
from kernels.common.warm_bwd import RevWarmInputs
from kernels.ops.gdn.ag_bwd import ag_factors, wy_from_ag
from kernels.ops.gdn.chunk import chunk_gdn_fwd
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOL = 1e-5 if DEVICE == "cpu" else 2e-2
DIM = 32 if DEVICE == "cpu" else 64


def _inputs(lengths, *, B=None, T=None, HV=2, lb=-0.5, chunk=64, strong=False, strong_head0=False):
    """q, k `[.., 1, K]`, v, g, beta `[.., HV, ..]`, cu, h0, the index, Ag and the gate cumsum; strong: every gate
    -5 to -5.5; strong_head0: head 0's gates 100x (its warm windows certified, head 1's not)."""
    q, k, _, _, _, cu = make_inputs("gdn", lengths, B=B, T=T, H=1, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    _, _, v, g, beta, _ = make_inputs("gdn", lengths, B=B, T=T, H=HV, K=DIM, V=DIM, lb=lb, seed=9, dtype=DTYPE,
                                      device=DEVICE)  # fmt: skip
    if strong:
        g = (-5.0 - 0.5 * torch.rand(g.shape, generator=torch.Generator().manual_seed(2))).to(DEVICE)
    if strong_head0:
        g[:, :, 0] = g[:, :, 0] * 100
    N = len(lengths) if lengths is not None else B
    h0 = make_state(N, HV, DIM, DIM, device=DEVICE)
    index = prepare_chunk_index(cu, batch=k.shape[0], seq_len=k.shape[1], chunk_size=chunk, device=k.device)
    ag, gs = wy_gdn_ag(k, g, beta, index=index)
    return q, k, v, g, beta, cu, h0, index, ag, gs


def _layout(index) -> SeqLayout:
    if index.is_varlen:
        return SeqLayout(index.num_seqs, index.cu_seqlens, index.chunk_offsets)
    return SeqLayout(index.num_seqs)


def _reference_states(k, v, g, beta, h0, bounds, C):
    """fp32 per-token recurrence: the state entering every C-token chunk of each sequence, `[NT, H, K, V]`."""
    G = v.shape[2] // k.shape[2]
    kk, vv, gg, bb = (x.double().flatten(0, 1) for x in (k.repeat_interleave(G, 2), v, g, beta))
    out = []
    for n in range(len(bounds) - 1):
        S = h0[n].double().clone()
        for t in range(bounds[n], bounds[n + 1]):
            if (t - bounds[n]) % C == 0:
                out.append(S.clone())
            S = S * gg[t].exp()[:, None, None]  # alpha_t S, then the delta rule's update
            kS = torch.einsum("hk,hkv->hv", kk[t], S)
            S = S + bb[t][:, None, None] * kk[t][:, :, None] * (vv[t] - kS)[:, None, :]
    return torch.stack(out)


@pytest.mark.parametrize("case", ["varlen-grouped", "dense-strong"])
def test_state_pass_in_ag_form_equals_the_wu_form(case: str) -> None:
    if case == "varlen-grouped":
        q, k, v, g, beta, cu, h0, index, ag, gs = _inputs((37, 150, 5))
        bounds = cu.tolist()
    else:
        q, k, v, g, beta, cu, h0, index, ag, gs = _inputs(None, B=2, T=100, HV=1, strong=True)
        bounds = [0, 100, 200]
    w, u, *_ = wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index)
    want, _, _ = chunk_state_fwd(k, w, u, gs, layout=_layout(index), num_chunks=index.num_chunks, BT=64,
                                 gate_vector=False, h0=h0)  # fmt: skip
    got = chunk_state_ag_fwd(k, v, ag, gs, layout=_layout(index), num_chunks=index.num_chunks, BT=64, h0=h0)
    assert got.shape == want.shape == (index.num_chunks, v.shape[2], DIM, DIM)
    assert_rel_close("h vs the w, u form", want.float(), got.float(), TOL)
    ref = _reference_states(k, v, g, beta, h0, bounds, 64)
    assert_rel_close("h vs the per-token reference", ref.float(), got.float(), 1e-5 if DEVICE == "cpu" else 5e-3)


def test_state_pass_in_ag_form_refuses_mismatched_factors() -> None:
    q, k, v, g, beta, cu, h0, index, ag, gs = _inputs((37, 70))
    with pytest.raises(ValueError, match=r"chunk_state_ag_fwd: Ag \(1, 107, 2, 32\) / gs \(1, 107, 2\) do not match"):
        chunk_state_ag_fwd(k, v, ag[..., :32], gs, layout=_layout(index), num_chunks=index.num_chunks, BT=64)


@pytest.mark.parametrize("per_head", [False, True])
def test_wy_from_ag_forms_only_the_selected_chunks(per_head: bool) -> None:
    q, k, v, g, beta, cu, h0, index, ag, gs = _inputs((37, 150, 5))
    full = wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index)[:4]
    NT, HV = index.num_chunks, v.shape[2]
    sel = torch.zeros(NT, HV, dtype=torch.bool, device=DEVICE) if per_head else torch.zeros(NT, dtype=torch.bool,
                                                                                              device=DEVICE)  # fmt: skip
    sel[1] = True
    sel[3] = True
    if per_head:
        sel[4, 1] = True
    out = tuple(torch.full_like(x, float("nan")) for x in full)
    got = wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index, sel=sel, out=out)
    assert all(a is b for a, b in zip(got[:4], out, strict=True)) and got[4] is None
    # each token's chunk (varlen: the chunks of 37, 150 and 5 tokens are 0 | 1 2 3 | 4)
    chunk_of = torch.tensor([0] * 37 + [1] * 64 + [2] * 64 + [3] * 22 + [4] * 5, device=DEVICE)
    rows = sel[chunk_of] if per_head else sel[chunk_of][:, None].expand(-1, HV)  # [T, HV]
    for name, a, b in zip(("w", "u", "aqk", "T"), out, full, strict=True):
        m = rows[None, :, :, None].expand_as(a)
        assert torch.equal(a[m], b[m]), name
        assert torch.isnan(a[~m]).all(), name
    with pytest.raises(ValueError, match=r"wy_from_ag: sel must be bool \[5\] or \[5, 2\] without a bound"):
        wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index, sel=sel.float())


LENGTHS, CHUNK, SPLIT, WINDOW = (75, 40), 16, 2, 1  # test_warm_bwd.py's scenario


def _ends(lazy: bool, *, split: bool, kept: dict | None = None):
    """reverse_ends' (h, ends, certified or None, chunk rows of w formed) with every factor or with `ag_factors`;
    kept: the chunk states handed over as the forward keeps them (no maps)."""
    q, k, v, g, beta, cu, h0, index, ag, gs = _inputs(LENGTHS, HV=2, lb=-0.05, chunk=CHUNK, strong_head0=True)
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    seg: dict = {}
    if split:
        chunk_gdn_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, cu_seqlens=cu, split_chunks=SPLIT,
                      chunk_size=CHUNK, seg_states=seg)  # fmt: skip
        assert seg["seg_chunks"] == SPLIT
    report: dict[str, torch.Tensor] = {}
    warm = RevWarmInputs(q, k, g, beta, window_chunks=WINDOW, report=report, v=v)
    launch = LaunchPlan(bwd_warm=WINDOW)
    formed: list[torch.Tensor | None] = []
    if lazy:
        base = ag_factors(q, k, v, ag, gs, scale=DIM**-0.5, index=index, launch=launch)

        def form(sel):
            formed.append(None if sel is None else sel.clone())
            return base.form(sel)

        facs = cb.LazyFactors(form, base.states)
        w = u = aqk = None
    else:
        facs = None
        w, u, aqk, _, _ = wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index)
    h, _, _, ends = cb.reverse_ends(q, k, w, u, gs, aqk, do, index=index, gate_vector=False, scale=DIM**-0.5,
                                    h0=h0, dht=dht, launch=launch, split_chunks=None, states=True, warm=warm,
                                    seg_states=None if kept else seg or None, kept=kept, lazy=facs)  # fmt: skip
    return h, ends, report.get("certified"), formed


@pytest.mark.parametrize("states", ["recomputed", "kept"])
def test_reverse_ends_on_demand_equal_every_factors_with_the_forwards_segments(states: str) -> None:
    kept = None
    if states == "kept":  # the states the recompute makes, handed over as "ag+states" keeps them (no maps)
        h, *_ = _ends(False, split=True)
        kept = {"h": h, "v_new": None, "split": SPLIT}
    h, ends, cert, _ = _ends(False, split=True, kept=kept)
    h_l, ends_l, cert_l, formed = _ends(True, split=True, kept=kept)
    assert cert is not None and cert_l is not None and torch.equal(cert, cert_l)
    assert cert.any() and not cert.all()  # both branches: certified windows and the refill of uncertified segments
    assert_rel_close("h", h.float(), h_l.float(), TOL)
    assert_rel_close("ends", ends.float(), ends_l.float(), TOL)
    # formed twice: the windows (the first chunk of each non-first segment), then the uncertified segments' others
    assert len(formed) == 2 and formed[0] is not None and formed[1] is not None
    win, rest = formed
    assert win.dim() == 1 and 0 < int(win.sum()) < win.numel()
    assert rest.dim() == 2 and not (rest & win[:, None]).any() and not rest[:, 0].any()  # head 0: every window certified
    assert (win | rest.any(1)).sum() < win.numel()  # the first segments' chunks are never formed


def test_reverse_ends_on_demand_without_a_split_forms_nothing() -> None:
    h, ends, _, _ = _ends(False, split=False)
    h_l, ends_l, _, formed = _ends(True, split=False)
    assert formed == [] and ends_l is not None
    assert_rel_close("h", h.float(), h_l.float(), TOL)
    assert_rel_close("ends", ends.float(), ends_l.float(), TOL)


def test_state_passes_without_the_new_values_store_the_same_states() -> None:
    """(session 31) KDA's "tilelang" gradients form U and dU themselves, so `chunk_bwd` runs its state passes without
    v_new and dv_new (`chunk_state_fwd(save_v_new=False)`, `chunk_state_bwd(dv_new=None)`, STORE_DV off): the chunk
    states, their gradients and the entering gradient equal those of the passes that store both (varlen, grouped
    value heads, an initial state and an end gradient)."""
    from kernels.common.state_bwd import chunk_state_bwd

    q, k, v, g, beta, cu, h0, index, ag, gs = _inputs((37, 150, 5))
    w, u, aqk, *_ = wy_from_ag(q, k, v, ag, gs, scale=DIM**-0.5, index=index)
    layout = _layout(index)
    h, v_new, _ = chunk_state_fwd(k, w, u, gs, layout=layout, num_chunks=index.num_chunks, BT=64, gate_vector=False,
                                  h0=h0)  # fmt: skip
    h2, none, _ = chunk_state_fwd(k, w, u, gs, layout=layout, num_chunks=index.num_chunks, BT=64, gate_vector=False,
                                  h0=h0, save_v_new=False)  # fmt: skip
    assert v_new is not None and none is None
    assert torch.equal(h, h2)
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE, DTYPE)
    dht = make_state(index.num_seqs, v.shape[2], DIM, DIM, device=DEVICE)
    outs = []
    for store_dv in (True, False):
        dh = k.new_empty(index.num_chunks, v.shape[2], DIM, DIM)
        dv_new = torch.full_like(v, float("nan")) if store_dv else None
        ds = torch.empty_like(dht)
        chunk_state_bwd(q, k, w, gs, aqk, do, layout=layout, BT=64, gate_vector=False, scale=DIM**-0.5, dht=dht,
                        ds_out=ds, dh=dh, dv_new=dv_new)  # fmt: skip
        outs.append((dh, ds, dv_new))
    (dh, ds, dv_new), (dh2, ds2, _) = outs
    assert dv_new is not None and not dv_new.isnan().any()  # the storing pass wrote every row
    assert dh.abs().amax() > 0 and torch.equal(dh, dh2) and torch.equal(ds, ds2)
    # (session 32) the pairs need skips start from dht's row plus skipped's (the warm windows' gradients, no torch
    # `where` after the launch); the others are bitwise the unmasked pass's
    need = torch.tensor([[True, False], [False, True], [True, True]], device=DEVICE)
    skip = torch.randn(dht.shape, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    ds3 = torch.empty_like(dht)
    chunk_state_bwd(q, k, w, gs, aqk, do, layout=layout, BT=64, gate_vector=False, scale=DIM**-0.5, dht=dht,
                    ds_out=ds3, need=need, skipped=skip)  # fmt: skip
    assert torch.equal(ds3[need], ds[need]) and torch.equal(ds3[~need], dht[~need] + skip[~need])
