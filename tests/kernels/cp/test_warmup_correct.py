"""cp.warmup_correct on one device: accuracy vs the fp32 reference within the asked tolerance, and the report.

Scenarios (torch backend, fp32, H = 2, K = 16, V = 32):
- strong decay (lb = -5), warmup only (fallback="none"): the bound certifies every segment (violations 0)
  and the output is within tol of the reference; the report gives per-segment windows and segment bounds.
- weak decay (lb = -0.05): at least half the segments fail the bound; fallback="exact" is exact (1e-5) and
  counts them, fallback="none" reports them as violations.
- the state-level guarantee: every warmup-built entering state is within report.state_err_bound of the
  exact one, and within tol * ||S|| where the report says ok.
- KDA with ONE slow key channel (g ~ 0) among fast ones: a mean over channels looks converged, the
  per-channel bound does not (FlashKDA's averaged test would miss it); warmup alone is then wrong.
- varlen with short unsplit sequences next to long ones; segments=1 (no split) equals the plain forward.
- fallback="auto" (the default), decided per segment on the device: fast gates everywhere except a slow
  time range (one key channel of one head for KDA, one head for GDN) that covers the warmup windows of
  some segments. fallback_count and the fallen-back segments equal those found independently with the
  simple per-channel test exp(sum over the window of max_{h,k} g) > tol (the margins are wide both ways:
  ~e^-29 vs ~0.94); the output is within tol of the reference (< 1e-5: the failing links take the exact
  map), and so are the failing segments' entering states, while under "none" they err by > tol; on gates where every window holds, "auto" is bitwise "none"; every
  entering state is within report.state_err_bound of the exact one; a step has no aten::item; the
  triton backend (interpreted, tiny: 1 head, 4 segments of 64) takes the same decisions and states.
"""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.cp as cp
from runners.profile import profile_step
from tests.utils import assert_rel_close, make_inputs, rel_err

H, K, V = 2, 16, 32
LENGTHS = (512, 40, 300)


def _run(op: str, lb: float, *, lengths=LENGTHS, seed: int = 3, **kw):
    q, k, v, g, beta, cu = make_inputs(op, lengths, H=H, K=K, V=V, lb=lb, seed=seed)
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    o, rep = cp.warmup_correct(op, q, k, v, g, beta, cu_seqlens=cu.tolist(), backend="torch", **kw)
    return (q, k, v, g, beta, cu), ref, o, rep


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_strong_decay_warmup_within_tol(op: str) -> None:
    tol = 1e-4
    _, ref, o, rep = _run(op, -5.0, segments=4, tol=tol, window=1, fallback="none")
    d = rep.to_dict()
    assert d["violations"] == 0 and d["fallback_count"] == 0, d
    assert_rel_close("o", ref, o, tol)
    # 512 -> 4 segments of 128, 40 stays whole, 300 -> 3 segments (128, 128, 44)
    assert rep.segment_bounds == (0, 128, 256, 384, 512, 552, 680, 808, 852)
    assert rep.window == (0, 64, 64, 64, 0, 0, 64, 64)
    assert d["max_state_err_bound"] <= tol * 1e-3


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_weak_decay_falls_back_exactly(op: str) -> None:
    _, ref, o, rep = _run(op, -0.05, segments=4, tol=1e-3, window=1, fallback="exact")
    d = rep.to_dict()
    non_first = sum(1 for w in rep.window if w)
    assert d["fallback_count"] >= non_first / 2 and d["violations"] == 0, d
    assert_rel_close("o (exact fallback)", ref, o, 1e-5)
    _, _, o2, rep2 = _run(op, -0.05, segments=4, tol=1e-3, window=1, fallback="none")
    d2 = rep2.to_dict()
    assert d2["violations"] == d2["fallback_count"] == d["fallback_count"], d2


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("lb", [-2.0, -0.5])
def test_state_error_within_bound(op: str, lb: float) -> None:
    tol = 1e-3
    _, _, _, exact = _run(op, lb, segments=4, tol=tol, window=2, fallback="exact")
    S_exact = exact.initial_states.double()
    norm = S_exact.flatten(2).norm(dim=-1)
    for fb in ("none", "auto"):
        _, _, _, warm = _run(op, lb, segments=4, tol=tol, window=2, fallback=fb)
        err = (warm.initial_states.double() - S_exact).flatten(2).norm(dim=-1)      # [segments, H]
        assert bool((err <= warm.state_err_bound * (1 + 1e-6) + 1e-5 * norm).all()), (fb, err, warm.state_err_bound)
        assert bool((err <= tol * norm + 1e-5 * norm)[warm.ok].all()), fb


def test_slow_channel_is_caught() -> None:
    q, k, v, g, beta, cu = make_inputs("kda", (512,), H=H, K=K, V=V, lb=-5.0, seed=5)
    g[..., 0] = -1e-4                        # one key channel barely decays; the mean over K still looks fast
    ref, _ = kernels.reference("kda", q, k, v, g, beta, cu_seqlens=cu)
    mean_decay = g.mean(-1).sum(1)           # what an averaged test sees over the whole sequence: very negative
    assert float(mean_decay.max()) < -100
    o, rep = cp.warmup_correct("kda", q, k, v, g, beta, cu_seqlens=[0, 512], segments=4, tol=1e-3, window=1,
                               fallback="none", backend="torch")
    d = rep.to_dict()
    assert d["violations"] == 3, d           # every non-first segment fails the per-channel bound
    assert rel_err(ref, o) > 1e-3            # and the warmup estimate is indeed wrong
    o, rep = cp.warmup_correct("kda", q, k, v, g, beta, cu_seqlens=[0, 512], segments=4, tol=1e-3, window=1,
                               backend="torch")
    assert rep.to_dict()["fallback_count"] == 3
    assert_rel_close("o (exact)", ref, o, 1e-5)


def test_one_segment_is_the_plain_forward() -> None:
    (q, k, v, g, beta, cu), ref, o, rep = _run("gdn", -1.0, segments=1)
    assert rep.segment_bounds == tuple(cu.tolist()) and rep.window == (0, 0, 0)
    o_plain, _ = kernels.forward("gdn", q, k, v, g, beta, cu_seqlens=cu, backend="torch")
    torch.testing.assert_close(o, o_plain, rtol=0, atol=0)
    assert_rel_close("o", ref, o, 1e-5)


# --- fallback="auto": per-segment decision on the device --------------------------------------------------

SLOW_RANGES = ((192, 256), (744, 808))   # the windows (window=1) of segments 2 and 7 of LENGTHS at segments=4


def _mixed_gates(op: str, seed: int = 3):
    """Fast gates (lb = -3) with a barely decaying (g = -1e-3) channel (KDA) / head (GDN) over SLOW_RANGES."""
    q, k, v, g, beta, cu = make_inputs(op, LENGTHS, H=H, K=K, V=V, lb=-3.0, seed=seed)
    for a, b in SLOW_RANGES:
        if op == "kda":
            g[0, a:b, 1, 3] = -1e-3          # one key channel of one head, hidden among 15 fast ones
        else:
            g[0, a:b, 1] = -1e-3
    return q, k, v, g, beta, cu


def _failing(g: torch.Tensor, rep: cp.WarmupReport, tol: float) -> list[int]:
    """Segments whose window fails the simple per-channel test: exp(sum_t max_{h,k} g_t) over the window > tol."""
    gmax = g[0].amax(dim=tuple(range(1, g[0].dim())))                       # [T]: slowest head and channel
    out, b0 = [], rep.segment_bounds
    for s, w in enumerate(rep.window):
        if w and float(gmax[b0[s] - w:b0[s]].sum().exp()) > tol:
            out.append(s)
    return out


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_auto_falls_back_per_segment(op: str) -> None:
    tol = 1e-3
    q, k, v, g, beta, cu = _mixed_gates(op)
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    kw = {"cu_seqlens": cu.tolist(), "segments": 4, "tol": tol, "window": 1, "backend": "torch"}
    o, rep = cp.warmup_correct(op, q, k, v, g, beta, **kw)                 # the default is "auto"
    d = rep.to_dict()
    expected = _failing(g, rep, tol)
    assert expected == [2, 7], expected
    assert d["fallback"] == "auto" and d["fallback_count"] == len(expected) and d["violations"] == 0, d
    assert d["fallback_segments"] == expected, d
    assert_rel_close("o (auto) vs reference", ref, o, tol)
    assert rel_err(ref, o) < 1e-5                                          # failing links took the exact map
    _, rep_none = cp.warmup_correct(op, q, k, v, g, beta, fallback="none", **kw)
    _, rep_exact = cp.warmup_correct(op, q, k, v, g, beta, fallback="exact", **kw)
    assert rep_none.to_dict()["violations"] == len(expected)
    S_exact = rep_exact.initial_states[expected]
    err_none = rel_err(S_exact, rep_none.initial_states[expected])        # the failing segments' entering states
    err_auto = rel_err(S_exact, rep.initial_states[expected])
    assert err_none > tol and err_auto <= 1e-5, (err_none, err_auto)      # warmup alone is wrong there; auto is not
    if op == "kda":                                                        # FlashKDA's averaged test would pass
        for a, b in SLOW_RANGES:
            assert float(g[0, a:b].mean(-1).sum(0).max()) * 1.4427 < -10   # log2 units, its -10 threshold


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_auto_is_none_when_every_window_holds(op: str) -> None:
    q, k, v, g, beta, cu = make_inputs(op, LENGTHS, H=H, K=K, V=V, lb=-5.0, seed=4)
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    kw = {"cu_seqlens": cu.tolist(), "segments": 4, "tol": 1e-4, "window": 1, "backend": "torch"}
    o, rep = cp.warmup_correct(op, q, k, v, g, beta, fallback="auto", **kw)
    o_none, _ = cp.warmup_correct(op, q, k, v, g, beta, fallback="none", **kw)
    d = rep.to_dict()
    assert d["fallback_count"] == 0 and d["fallback_segments"] == [] and d["violations"] == 0, d
    torch.testing.assert_close(o, o_none, rtol=0, atol=0)
    assert_rel_close("o (auto) vs reference", ref, o, 1e-4)


@pytest.mark.parametrize("lengths", [(256,), (256, 64, 192)], ids=["one-seq", "three-seqs"])
def test_auto_triton_matches_torch(lengths: tuple[int, ...]) -> None:
    """The triton backend (interpreted; masked transition and one-launch chain kernels) takes the same decisions
    and reaches the same states; with several sequences the chain restarts at each sequence's first segment."""
    q, k, v, g, beta, cu = make_inputs("kda", lengths, H=1, K=16, V=16, lb=-3.0, seed=1)
    g[0, 128:192, 0, 5] = -1e-3                                            # the window of segment 3
    kw = {"cu_seqlens": [int(x) for x in cu], "segments": 4, "tol": 1e-3, "window": 1}
    o_t, rep_t = cp.warmup_correct("kda", q, k, v, g, beta, backend="triton", **kw)
    o, rep = cp.warmup_correct("kda", q, k, v, g, beta, backend="torch", **kw)
    assert rep_t.to_dict()["fallback_segments"] == rep.to_dict()["fallback_segments"]
    assert 3 in rep.to_dict()["fallback_segments"]
    assert_rel_close("S0 triton vs torch", rep.initial_states, rep_t.initial_states, 1e-5)
    assert_rel_close("o triton vs torch", o, o_t, 1e-5)


def test_auto_step_has_no_host_sync() -> None:
    q, k, v, g, beta, cu = _mixed_gates("kda")
    ctx = cp.build_context(cu, 1, 0)
    opts = {"segments": 4, "window": 1, "fallback": "auto"}

    def step() -> object:
        return cp.forward("warmup_correct", "kda", q, k, v, g, beta, group=None, ctx=ctx, backend="torch", options=opts)

    step()
    res = profile_step(step, device=torch.device("cpu")).as_dict()
    assert res["collectives"] == {} and res["unclassified"] == [], res
    assert res["host_syncs"] == 0, res


def test_bad_fallback_is_refused() -> None:
    q, k, v, g, beta, cu = make_inputs("gdn", (128,), H=H, K=K, V=V)
    with pytest.raises(ValueError, match=r"fallback must be one of \('auto', 'exact', 'none'\), got fallback='some'"):
        cp.warmup_correct("gdn", q, k, v, g, beta, cu_seqlens=cu.tolist(), backend="torch", fallback="some")
