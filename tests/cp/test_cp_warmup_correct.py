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
"""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.cp as cp
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
    _, _, _, warm = _run(op, lb, segments=4, tol=tol, window=2, fallback="none")
    S_exact, S_warm = exact.initial_states.double(), warm.initial_states.double()
    err = (S_warm - S_exact).flatten(2).norm(dim=-1)                      # [segments, H]
    norm = S_exact.flatten(2).norm(dim=-1)
    assert bool((err <= warm.state_err_bound * (1 + 1e-6) + 1e-5 * norm).all()), (err, warm.state_err_bound)
    assert bool((err <= tol * norm + 1e-5 * norm)[warm.ok].all())


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
