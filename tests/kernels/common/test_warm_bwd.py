"""The gate-certified warm window of the backward's split reverse state pass (`kernels.common.warm_bwd`,
`LaunchPlan.bwd_warm`), interpreted on CPU (on a GPU with CPBENCH_TEST_GPU=1).

Scenarios (GDN; KDA's reverse pass once): varlen (75 and 40 tokens) in chunks of 16 tokens, split into 2-chunk
segments, windows of 1 chunk; head 0 with strong gates (certified), head 1 with weak gates (not certified), in one
call, an initial state and dht. The certified mask is read after the call and must show both branches: with dht
a window that reaches its sequence's end is never certified; without dht it is. The whole backward against the fp32
per-token reference; the reverse pass alone (dh, dv_new, dh0) against the exact path (maps of all segments); the
forward's kept states without the maps (the masked transitions); `chunk_state_grad`'s pass; a dense batch; the bound sums
against fp64 per-token sums; the reverse sums from the forward's Ag pass (`wy_gdn_ag(rev=)`, its q, k side) and do
(`reverse_chunk_bound_kept`) against `reverse_chunk_bound`'s and fp64 per-token sums (varlen and dense, grouped heads,
zero q and do rows, gates weak to past the floor, bf16 once); GDN's backward under the reverse walk (the walk replaced
by a stub) from the forward's kept sums: the same certified windows, states and end gradients as from
`reverse_chunk_bound`'s (the step under "ag+states": tests/kernels/ops/gdn/test_ag_bwd_states.py).
Tolerance: 1e-5 relative L2 on CPU (test_chunk_bwd.py's), 5e-3 on a GPU.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from kernels.common import chunk_bwd as cb
from kernels.common.decay import GATE_FLOOR
from kernels.common.index import prepare_chunk_index
from kernels.common.warm_bwd import KEPT_REV_SUMS, RevWarmInputs, reverse_chunk_bound, reverse_chunk_bound_kept
from kernels.configs import LaunchConfig
from kernels.ops.gdn import reverse_bwd
from kernels.ops.gdn.ag_bwd import chunk_gdn_bwd_ag, wy_from_ag
from kernels.ops.gdn.chunk import chunk_gdn_fwd
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.plan import LaunchPlan, LaunchRecorder
from tests.kernels.common.test_chunk_bwd import NAMES, _reference_grads
from tests.utils import TEST_DEVICE, assert_rel_close, make_grouped_inputs, make_inputs, make_state
from tests.utils.spies import count_calls

DEVICE = TEST_DEVICE
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOL = 1e-5 if DEVICE == "cpu" else 5e-3
DIM = 32 if DEVICE == "cpu" else 64  # as test_chunk_bwd.py (the Triton 3.6 sm_90 miscompile at 32 columns)
LENGTHS, CHUNK, SPLIT, WINDOW = (75, 40), 16, 2, 1
WEAK, STRONG = -0.05, 100  # gates lb * sigmoid: ~-0.4 per 16-token window (never certified); head 0 times STRONG
# non-first segments: (seq 0, chunks 2-3), (seq 0, chunk 4: reaches its end), (seq 1, chunk 2: reaches its end)
# (rows: those segments, columns: heads). Without dht the last window of the batch drops nothing at all (nothing
# follows it on the flipped chunk axis): certified for the weak head too
CERTIFIED = {True: [[True, False], [False, False], [False, False]], False: [[True, False], [True, False], [True, True]]}


@functools.cache
def _case(op: str = "gdn", strong: bool = True):
    """Inputs (head 0 strong unless `strong` is False), h0, do, dht."""
    q, k, v, g, beta, cu = make_inputs(op, LENGTHS, H=2, K=DIM, V=DIM, lb=WEAK, dtype=DTYPE, device=DEVICE)
    if strong:  # KDA: every key channel at <= -2 (its slowest channel bounds the decay)
        g[:, :, 0] = g[:, :, 0] * STRONG - (2.0 if op == "kda" else 0.0)
    h0 = make_state(len(LENGTHS), 2, DIM, DIM, device=DEVICE)
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    return q, k, v, g, beta, cu, h0, do, dht


@functools.cache
def _factors(op: str = "gdn", strong: bool = True):
    """The index and the WY factors (w, u, ks, gs, qs, aqk) of the case, computed once."""
    q, k, v, g, beta, cu, *_ = _case(op, strong)
    index = prepare_chunk_index(cu, batch=1, seq_len=sum(LENGTHS), chunk_size=CHUNK, device=k.device)
    return index, cb._wy_factors(op == "kda", q, k, v, g, beta, scale=DIM**-0.5, index=index, launch=LaunchPlan(), wy=None)


@functools.cache
def _state_pass(op: str, strong: bool, warm: int, with_dht: bool, states: bool = True, kept_from: int | None = None):
    """(dh, dv_new, dh0, certified or None, launched kernels, h, v_new, certified_fwd or None) of the reverse pass
    alone (with the states' recompute unless kept); kept_from: the states h, v_new of that window's run handed over as
    kept, without the maps."""
    q, k, v, g, beta, cu, h0, do, dht = _case(op, strong)
    index, (w, u, ks, gs, qs, aqk) = _factors(op, strong)
    report: dict[str, torch.Tensor] = {}
    rec = LaunchRecorder()
    x = RevWarmInputs(q, k, g, beta, window_chunks=warm, report=report, v=v) if warm else None
    kept = None
    if kept_from is not None:
        h, v_new = _state_pass(op, strong, kept_from, with_dht)[5:7]
        kept = {"h": h, "v_new": v_new, "split": torch.tensor(SPLIT)}
    dh0 = torch.empty(len(LENGTHS), 2, DIM, DIM, dtype=torch.float32, device=k.device)
    h, v_new, dh, dv_new = cb._state_pass(qs, ks, w, u, gs, aqk, do, index=index, gate_vector=op == "kda",
                                          scale=DIM**-0.5, h0=h0, dht=dht if with_dht else None, dh0=dh0,
                                          launch=LaunchPlan(recorder=rec), split_chunks=SPLIT, states=states, warm=x,
                                          kept=kept)  # fmt: skip
    return dh, dv_new, dh0, report.get("certified"), frozenset(rec), h, v_new, report.get("certified_fwd")


@pytest.mark.parametrize("with_dht", [True, False])
def test_reverse_pass_certifies_strong_heads_and_matches_exact(with_dht: bool) -> None:
    """Head 0 (strong) certified where its window may be, head 1 (weak) nowhere, in both directions (the states'
    recompute takes the forward's certified windows from the same bound launch); dh, dv_new and dh0 those of the
    exact path (all maps, the full ext pass)."""
    dh, dv_new, dh0, ok, ran, _, _, ok_fwd = _state_pass("gdn", True, WINDOW, with_dht)
    assert ok is not None and ok.tolist() == CERTIFIED[with_dht]
    assert ok_fwd is not None and ok_fwd.tolist() == [[True, False]] * 3  # the forward windows end non-last segments
    assert {"chunk_state_transition_fwd", "seg_chain_fwd", "seg_chain_bwd"} <= ran  # masked maps, both chains
    ref = _state_pass("gdn", True, 0, with_dht)
    assert ref[3] is None  # the exact path reports nothing
    for name, a, b in zip(("dh", "dv_new", "dh0"), (dh, dv_new, dh0), ref[:3], strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-6 if DEVICE == "cpu" else 1e-3)


def test_gradient_alone_uses_masked_transitions() -> None:
    """Without the forward states (`chunk_state_grad`'s pass) the warm path computes the maps of the uncertified
    segments only (masked transitions, no forward state pass); dh0 is the exact path's."""
    _, _, dh0, ok, ran, *_ = _state_pass("gdn", True, WINDOW, True, states=False)
    assert ok is not None and ok.tolist() == CERTIFIED[True]
    assert "chunk_state_transition_fwd" in ran and "chunk_state_fwd" not in ran and "seg_chain_fwd" not in ran
    assert_rel_close("dh0", _state_pass("gdn", True, 0, True)[2], dh0, 1e-6 if DEVICE == "cpu" else 1e-3)


@functools.cache
def _reference(op: str = "gdn"):
    q, k, v, g, beta, cu, h0, do, dht = _case(op)
    return _reference_grads(op, q, k, v, g, beta, h0, do, dht, cu.tolist())


def test_backward_with_warm_window_against_reference() -> None:
    """The whole backward (`chunk_bwd` under `LaunchPlan(bwd_warm=1)`, the WY factors handed over), varlen with h0
    and dht, against the fp32 per-token reference; the report shows both branches."""
    q, k, v, g, beta, cu, h0, do, dht = _case()
    _, (w, u, _, gs, _, aqk) = _factors()
    report: dict[str, torch.Tensor] = {}
    got = cb.chunk_bwd("gdn", q, k, v, g, beta, do, scale=DIM**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu,
                       split_chunks=SPLIT, chunk_size=CHUNK, plan=LaunchPlan(bwd_warm=WINDOW), warm_report=report,
                       wy={"w": w, "u": u, "gs": gs, "aqk": aqk})  # fmt: skip
    assert report["certified"].tolist() == CERTIFIED[True]
    for name, a, r in zip(NAMES, got, _reference(), strict=True):
        assert_rel_close(name, r, a.float(), TOL)


@pytest.mark.parametrize("grouped", [False, True])
def test_backward_from_ag_sums_the_bound_in_wy_from_ag(monkeypatch: pytest.MonkeyPatch, grouped: bool) -> None:
    """GDN's backward from the kept Ag with the forward's segment states (the default step) takes the reverse bound
    sums from `wy_from_ag(bound=)`: the same sums as `reverse_chunk_bound` (which then does not run), the same
    certified windows, and the gradients of `chunk_bwd` with the sums from `reverse_chunk_bound` and the reference's.
    grouped: q and k of the first head serve both value heads (the windows certified then are the sums' own)."""
    q, k, v, g, beta, cu, h0, do, dht = _case()
    if grouped:
        q, k = q[:, :, :1].contiguous(), k[:, :, :1].contiguous()
    index = prepare_chunk_index(cu, batch=1, seq_len=sum(LENGTHS), chunk_size=CHUNK, device=k.device)
    ag, gcum = wy_gdn_ag(k, g, beta, index=index)
    plain = wy_from_ag(q, k, v, ag, gcum, scale=DIM**-0.5, index=index)
    *factors, bnd = wy_from_ag(q, k, v, ag, gcum, scale=DIM**-0.5, index=index, bound=(g, beta, do))
    ref_bnd, _ = reverse_chunk_bound(q, k, g, beta, do, scale=DIM**-0.5, index=index, gate_vector=False)
    assert plain[4] is None and all(torch.equal(a, b) for a, b in zip(factors, plain[:4], strict=True))
    torch.testing.assert_close(bnd, ref_bnd, rtol=1e-6, atol=1e-6)  # the same fp32 sums, other block order at most
    seg: dict = {}  # the forward's split (SPLIT chunks) and segment entering states, as the autograd node keeps them
    chunk_gdn_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, cu_seqlens=cu, split_chunks=SPLIT,
                  chunk_size=CHUNK, seg_states=seg)  # fmt: skip
    assert seg["seg_chunks"] == SPLIT
    calls = count_calls(monkeypatch, cb, "reverse_chunk_bound")
    report: dict[str, torch.Tensor] = {}
    got = chunk_gdn_bwd_ag(q, k, v, g, beta, do, scale=DIM**-0.5, wy={"ag": ag, "gs": gcum}, initial_state=h0,
                           dht=dht, cu_seqlens=cu, plan=LaunchPlan(bwd_warm=WINDOW), chunk_size=CHUNK,
                           warm_report=report, seg_states=seg)  # fmt: skip
    certified = report["certified"].tolist()
    assert not calls and (grouped or certified == CERTIFIED[True])
    report.clear()  # without the segment states: chunk_bwd's own split and `reverse_chunk_bound`
    old = chunk_gdn_bwd_ag(q, k, v, g, beta, do, scale=DIM**-0.5, wy={"ag": ag, "gs": gcum}, initial_state=h0,
                           dht=dht, cu_seqlens=cu, plan=LaunchPlan(bwd_warm=WINDOW), chunk_size=CHUNK,
                           split_chunks=SPLIT, warm_report=report)  # fmt: skip
    assert calls and report["certified"].tolist() == certified and any(map(any, certified))
    ref = _reference()
    if grouped:  # the reference with q, k expanded to the value heads, their gradients summed back over the group
        qe, ke = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
        ref = _reference_grads("gdn", qe, ke, v, g, beta, h0, do, dht, cu.tolist())
        ref[:2] = [r.sum(2, keepdim=True) for r in ref[:2]]
    for name, a, b, r in zip(NAMES, got, old, ref, strict=True):
        assert_rel_close(f"{name} vs reverse_chunk_bound's", b.float(), a.float(), 1e-5 if DEVICE == "cpu" else 2e-2)
        assert_rel_close(name, r, a.float(), TOL)


@pytest.mark.parametrize("warm", [WINDOW, 0])
def test_kept_states_without_maps(warm: int) -> None:
    """The forward's states h, v_new and split kept without the maps M: the warm pass computes the uncertified maps
    (masked transitions), the exact one all maps; no forward state pass; dh, dv_new, dh0 those of the recompute."""
    dh, dv_new, dh0, ok, ran, *_ = _state_pass("gdn", True, warm, True, kept_from=warm)
    assert "chunk_state_transition_fwd" in ran and not {"chunk_state_fwd", "seg_chain_fwd"} & ran, sorted(ran)
    assert (ok is not None and ok.tolist() == CERTIFIED[True]) if warm else ok is None
    ref = _state_pass("gdn", True, 0, True)
    for name, a, b in zip(("dh", "dv_new", "dh0"), (dh, dv_new, dh0), ref[:3], strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-6 if DEVICE == "cpu" else 1e-3)


def test_kda_reverse_pass() -> None:
    """KDA's reverse pass (per-key gates: the slowest channel bounds the decay): head 0 certified, the exact path's
    results."""
    dh, dv_new, dh0, ok, *_ = _state_pass("kda", True, WINDOW, True)
    assert ok is not None and ok.tolist() == CERTIFIED[True]
    ref = _state_pass("kda", True, 0, True)
    for name, a, b in zip(("dh", "dv_new", "dh0"), (dh, dv_new, dh0), ref[:3], strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-6 if DEVICE == "cpu" else 1e-3)


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_reverse_chunk_bound_against_fp64_sums(op: str) -> None:
    """The kernel's (L, W) per chunk (flipped order) are fp64 per-token sums rounded up: L >= sum l_t, W >= log sum_t
    u_t exp(inclusive in-chunk cumsum of l), by at most twice the margins (1e-4 of |L| + |W| + 1); with v the forward's
    (chunk order): W >= log sum_t |beta_t| ||k_t|| ||v_t|| exp(sum of l after t in the chunk)."""
    q, k, v, g, beta, cu, _, do, _ = _case(op)
    index = prepare_chunk_index(cu, batch=1, seq_len=sum(LENGTHS), chunk_size=CHUNK, device=k.device)
    bnd, fbnd = reverse_chunk_bound(q, k, g, beta, do, scale=DIM**-0.5, index=index, gate_vector=op == "kda", v=v)
    bnd, fbnd = bnd.double().cpu(), fbnd.double().cpu()  # type: ignore[union-attr]
    gmax = (g if op == "gdn" else g.amax(-1))[0].double().clamp_min(-112.0).cpu()
    kk = k[0].double().square().sum(-1).cpu()
    ell = gmax + (1.0 - beta[0].double().cpu() * kk).abs().clamp_min(1.0).log()
    log_u = (DIM**-0.5 * q[0].double().norm(dim=-1) * do[0].double().norm(dim=-1)).log().cpu()
    log_w = (beta[0].double() * k[0].double().norm(dim=-1) * v[0].double().norm(dim=-1)).log().cpu()  # the forward's
    bounds = cu.tolist()
    rows, frows = [], []
    for n in range(len(LENGTHS)):
        for t0 in range(bounds[n], bounds[n + 1], CHUNK):
            sl = slice(t0, min(t0 + CHUNK, bounds[n + 1]))
            L, cl = ell[sl].sum(0), ell[sl].cumsum(0)
            rows.append(torch.stack([L, torch.logsumexp(log_u[sl] + cl, 0)], -1))
            frows.append(torch.stack([L, torch.logsumexp(log_w[sl] + L - cl, 0)], -1))
    for got, want in ((bnd, torch.stack(rows[::-1])), (fbnd, torch.stack(frows))):  # the reverse sums: flipped order
        assert got.shape == want.shape
        assert bool((got >= want - 1e-9).all()), "not rounded up"
        assert bool((got - want <= 2e-4 * (1.0 + want[..., :1].abs() + want.abs())).all()), "margins past 1e-4 relative"


@functools.cache
def _dense_state_pass(warm: int):
    """(dh, dv_new, dh0, certified) of the reverse pass alone on a dense batch (B=2, T=60: 4 chunks, 2 segments per
    sequence), one strong head, dht."""
    q, k, v, g, beta, _ = make_inputs("gdn", B=2, T=60, H=1, K=DIM, V=DIM, lb=WEAK * STRONG, dtype=DTYPE, device=DEVICE)
    gen = torch.Generator().manual_seed(5)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(2, 1, DIM, DIM, generator=gen).to(DEVICE)
    index = prepare_chunk_index(None, batch=2, seq_len=60, chunk_size=CHUNK, device=k.device)
    w, u, ks, gs, qs, aqk = cb._wy_factors(False, q, k, v, g, beta, scale=DIM**-0.5, index=index, launch=LaunchPlan(), wy=None)
    report: dict[str, torch.Tensor] = {}
    x = RevWarmInputs(q, k, g, beta, window_chunks=warm, report=report, v=v) if warm else None
    dh0 = torch.empty(2, 1, DIM, DIM, dtype=torch.float32, device=k.device)
    _, _, dh, dv_new = cb._state_pass(qs, ks, w, u, gs, aqk, do, index=index, gate_vector=False, scale=DIM**-0.5,
                                      h0=None, dht=dht, dh0=dh0, launch=LaunchPlan(), split_chunks=SPLIT, states=True,
                                      warm=x)  # fmt: skip
    return dh, dv_new, dh0, report.get("certified"), report.get("certified_fwd")


def test_dense_batch() -> None:
    """A dense batch (the flat token axis of B rows): each sequence's second segment certified in both directions, the
    exact path's dh, dv_new, dh0."""
    dh, dv_new, dh0, ok, ok_fwd = _dense_state_pass(WINDOW)
    assert ok is not None and ok.tolist() == [[True], [True]] and ok_fwd is not None and ok_fwd.tolist() == [[True], [True]]
    ref = _dense_state_pass(0)
    for name, a, b in zip(("dh", "dv_new", "dh0"), (dh, dv_new, dh0), ref[:3], strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-6 if DEVICE == "cpu" else 1e-3)


def _exact_reverse_sums(q, k, g, beta, do, bounds: list[int], chunk: int, scale: float) -> torch.Tensor:
    """fp64 per-token (L, W) of every chunk, flipped chunk order (module docstring of `kernels.common.warm_bwd`):
    L = sum l_t, W = log sum_t scale ||q_t|| ||do_t|| exp(inclusive in-chunk cumsum of l), -inf without a write;
    q, k at head h // G of value head h; bounds: the sequences' token bounds on the flattened token axis."""
    G = g.shape[2] // k.shape[2]
    flat = [x.double().cpu().flatten(0, 1) for x in (q, k, g, beta, do)]
    qf, kf, gf, bf, dof = flat
    kk = kf.square().sum(-1).repeat_interleave(G, 1)  # [T_all, HV]
    ell = gf.clamp_min(GATE_FLOOR) + (1.0 - bf * kk).abs().clamp_min(1.0).log()
    log_u = math.log(scale) + qf.norm(dim=-1).repeat_interleave(G, 1).log() + dof.norm(dim=-1).log()  # log 0 = -inf
    rows = []
    for n in range(len(bounds) - 1):
        for t0 in range(bounds[n], bounds[n + 1], chunk):
            sl = slice(t0, min(t0 + chunk, bounds[n + 1]))
            rows.append(torch.stack([ell[sl].sum(0), torch.logsumexp(log_u[sl] + ell[sl].cumsum(0), 0)], -1))
    return torch.stack(rows[::-1])


@pytest.mark.parametrize(
    ("layout", "chunk", "dtype", "BR"),
    [
        ("varlen", 16, torch.float32, 16),
        ("varlen", 64, torch.float32, 16),
        ("dense", 32, torch.float32, 64),
        ("varlen", 64, torch.bfloat16, 16),
    ],
    ids=["varlen-c16", "varlen-c64", "dense-c32-BR64", "varlen-c64-bf16"],
)
def test_reverse_sums_from_the_forwards_ag_pass(layout: str, chunk: int, dtype: torch.dtype, BR: int) -> None:
    """The Ag pass's q, k side of the reverse sums (`wy_gdn_ag(rev=, q=)`) plus do's (`reverse_chunk_bound_kept`) give
    `reverse_chunk_bound`'s (L, W) on the same inputs: odd lengths (varlen 75, 40, 3 or dense B=2 T=75), grouped heads
    (H=2, HV=4), a zero q row (both value heads of its key head) and a zero do row, gates of four strengths per value
    head (down to -20 per token, one head past the floor at some tokens), keys of norm up to 1.5 (|1 - beta ||k||^2|
    above 1 at some tokens). The two round differently (16-row blocks and the gram's diagonal against whole-chunk
    sums): they agree within 1e-6 (1 + A + |value|) on CPU (about 8 fp32 ulp; 1e-5 on a GPU, a tenth of the margins),
    and are -inf at the same places; the new sums are >= the fp64 per-token sums (1e-9: that reference's own
    rounding), by at most twice the margins."""
    H, HV, scale = 2, 4, DIM**-0.5
    lengths, B, T = ((75, 40, 3), None, None) if layout == "varlen" else (None, 2, 75)
    q, k, v, g, beta, cu = make_grouped_inputs(H, HV, DIM, lengths, B=B, T=T, strong=1.0, seed=17, device=DEVICE)
    g = g * torch.tensor([0.1, 1.0, 10.0, 40.0], device=g.device)  # lb -0.5: weak to -20 per token
    g[:, ::7, 3] = -150.0  # below the gate floor (-112)
    k = k * (1.0 + 0.5 * torch.rand(k.shape[:3], generator=torch.Generator().manual_seed(2)).to(k.device))[..., None]
    q[:, 5, 1] = 0.0  # value heads 2 and 3 read key head 1
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    do[:, 9, 0] = 0.0
    q, k, v, beta, do = (x.to(dtype) for x in (q, k, v, beta, do))
    B, T = k.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=chunk, device=k.device)
    sums = (torch.empty(B, T, HV, device=k.device), torch.empty(index.num_chunks, HV, 2, device=k.device))
    plan = LaunchPlan(configs={"wy_gdn_ag_fwd": LaunchConfig(BK=32, num_warps=4 if BR == 64 else 1, num_stages=2, BR=BR)})
    ag, gcum = wy_gdn_ag(k, g, beta, index=index, launch=plan, rev=sums, q=q)
    ag_plain, gcum_plain = wy_gdn_ag(k, g, beta, index=index, launch=plan)
    assert torch.equal(ag, ag_plain) and torch.equal(gcum, gcum_plain)  # the sums change nothing else
    assert bool((sums[0][:, 5, 2:] == float("-inf")).all()) and bool(torch.isfinite(sums[0][:, :5]).all())
    got = reverse_chunk_bound_kept(do, sums, scale=scale, index=index).double().cpu()
    ref, _ = reverse_chunk_bound(q, k, g, beta, do, scale=scale, index=index, gate_vector=False)
    ref = ref.double().cpu()
    A = sums[1][..., 1].double().cpu().flip(0)[..., None]  # sum |l| per chunk, flipped like the sums
    assert torch.equal(got.isinf(), ref.isinf())  # (no chunk without a write here: W = -inf nowhere)
    fin = torch.isfinite(ref)
    ratio = ((got - ref).abs() / (1.0 + A + ref.abs()))[fin]  # CPU: <= 8.6e-8 seen
    assert bool((ratio <= (1e-6 if DEVICE == "cpu" else 1e-5)).all()), ratio.max()
    bounds = cu.tolist() if cu is not None else [b * T for b in range(B + 1)]
    exact = _exact_reverse_sums(q, k, g, beta, do, bounds, chunk, scale)
    assert torch.equal(exact.isinf(), got.isinf())
    assert bool((got[fin] >= exact[fin] - 1e-9).all()), "not rounded up"
    assert bool((got - exact)[fin].le(2e-4 * (1.0 + A + exact.abs())[fin]).all()), "margins past 1e-4 relative"


def test_reverse_walk_takes_the_forwards_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """GDN's backward under the reverse walk (`bwd_grads="reverse"`: the H200's default for long bf16 steps) from a
    forward that kept Ag, its segment states and the q, k side of the reverse sums (`KEPT_REV_SUMS`): its reverse
    state pass certifies from `reverse_chunk_bound_kept` (`reverse_chunk_bound` does not run) the same windows, and
    hands the walk the same chunk states and end gradients, as without those kept sums (`reverse_chunk_bound` runs).
    The TileLang walk itself (GPU only: tests/kernels/ops/gdn/test_reverse_bwd.py) is replaced by a stub recording
    what it gets."""
    q, k, v, g, beta, cu, h0, do, dht = _case()
    plan = LaunchPlan(keep="ag", bwd_warm=WINDOW, bwd_grads="reverse")
    kept: dict[str, torch.Tensor] = {}
    seg: dict = {}
    chunk_gdn_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, cu_seqlens=cu, split_chunks=SPLIT,
                  chunk_size=CHUNK, keep=kept, seg_states=seg, plan=plan)  # fmt: skip
    assert set(KEPT_REV_SUMS) <= set(kept) and seg["seg_chunks"] == SPLIT
    walked: list[tuple[torch.Tensor, torch.Tensor]] = []

    def walk(q, k, v, g, gs, beta, ag, h, do, **kw):  # noqa: ANN001, ANN003, ANN202
        walked.append((h.clone(), kw["ends"].clone()))
        z = torch.zeros_like(v[..., :1])
        return q * 0, k * 0, v * 0, g * 0, beta * 0, z.new_zeros(kw["num_seqs"], *h.shape[1:])

    monkeypatch.setattr(reverse_bwd, "reverse_bwd_tilelang", walk)
    calls = count_calls(monkeypatch, cb, "reverse_chunk_bound")
    certified = []
    for wy in (kept, {n: t for n, t in kept.items() if n not in KEPT_REV_SUMS}):
        report: dict[str, torch.Tensor] = {}
        chunk_gdn_bwd_ag(q, k, v, g, beta, do, scale=DIM**-0.5, wy=wy, initial_state=h0, dht=dht, cu_seqlens=cu,
                         plan=plan, chunk_size=CHUNK, warm_report=report, seg_states=seg)  # fmt: skip
        certified.append(report["certified"].tolist())
        assert len(calls) == (0 if wy is kept else 1)
    assert certified[0] == certified[1] == CERTIFIED[True]
    (h, ends), (h_old, ends_old) = walked
    assert torch.equal(h, h_old) and torch.equal(ends, ends_old)
