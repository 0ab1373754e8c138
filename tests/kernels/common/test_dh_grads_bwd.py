"""GDN's backward with the reverse state pass fused into the gradient kernel (`kernels.common.dh_grads_bwd`, chosen
by `LaunchPlan(bwd_grads="fused_dh")`) against autograd through the fp32 per-token reference, and against the
default path (`bwd_grads="fused"`: `chunk_state_bwd` storing dh, then `chunk_bwd_dqk_wy`) on the same inputs
(interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1, in bf16).

Scenarios: varlen (37, 70, 5 tokens: partial chunks, one shorter than a chunk) with grouped value heads (one q/k head,
two value heads), an initial state, dht, slow-decay gates, the reverse pass split into one-chunk segments (exact
maps and chain: the windows do not fit) and unsplit; the gate-certified warm windows of `kernels.common.warm_bwd` active
(test_warm_bwd.py's case: varlen 75 and 40 tokens in 16-token chunks, 2-chunk segments, windows of 1 chunk, head 0
certified and head 1 not); dense input unsplit without h0 or dht, gates at -5 to -5.5 per token; dense input split,
dht without h0. The `ds_mem` code variant (dS in a per-program scratch, the key side in BK blocks: two blocks of K / 2,
and one) on the varlen case, split and unsplit, against the register kernel and the reference, and in two blocks on
the strong-decay dense case; unknown VARIANT bits refused. Which kernels ran, and with which config, is checked from
the launch recorder. KDA and head dims above 128 are refused; the automatic split is asked for one program per
(segment, head) on this path.
Tolerance: as test_chunk_bwd.py (1e-5 relative L2 on CPU, 3e-4 for the strong-decay case's dg against the reference,
5e-3 on a GPU); against the default path 1e-5 on CPU (the same products in another order, and the gate cumsum
formed here instead of read from the WY prep), 5e-3 on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from kernels.common import chunk_bwd as cb
from kernels.common.dh_grads_bwd import DH_VARIANTS
from kernels.configs import LaunchConfig
from kernels.plan import LaunchPlan, LaunchRecorder
from tests.kernels.common import test_warm_bwd as warm
from tests.kernels.common.test_dqk_wy_bwd import _bwd, _check, _reference_grads
from tests.utils import TEST_DEVICE, make_inputs, make_state

DEVICE = TEST_DEVICE
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOL = 1e-5 if DEVICE == "cpu" else 5e-3
DIM = 32 if DEVICE == "cpu" else 64  # K = V (64 on the GPU: test_chunk_bwd.py says why)


def _grads(*args, bwd_grads: str, **kwargs):  # noqa: ANN002, ANN003, ANN202
    """GDN's gradients under `bwd_grads`, checking which gradient kernel ran (and with which config: `dh_config`)."""
    rec = LaunchRecorder()
    cfg = kwargs.pop("dh_config", None)
    plan_kw = kwargs.pop("plan_kw", {}) | ({"configs": {"chunk_bwd_dh_grads": cfg}} if cfg else {})
    plan = LaunchPlan(bwd_grads=bwd_grads, recorder=rec, **plan_kw)
    got = _bwd("gdn")(*args, **kwargs, plan=plan)
    fused_dh = bwd_grads == "fused_dh"
    assert ("chunk_bwd_dh_grads" in rec) == fused_dh and ("chunk_bwd_dqk_wy" in rec) != fused_dh, sorted(rec)
    assert cfg is None or rec["chunk_bwd_dh_grads"][1] == cfg
    return got


def _both(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    """(fused_dh's gradients, the default path's), the first checked against the second at TOL (dh0 too)."""
    got = _grads(*args, bwd_grads="fused_dh", **dict(kwargs))
    ref = _grads(*args, bwd_grads="fused", **dict(kwargs))
    assert [x.dtype for x in got[:5]] == [x.dtype for x in ref[:5]]
    _check(got, ref, TOL)
    return got, ref


@pytest.mark.parametrize("split", [1, 0])
def test_varlen_grouped(split: int) -> None:
    """One-chunk segments (dh0 from each sequence's first segment, `final_idx`), or one pass per sequence."""
    lengths = (37, 70, 5)
    _, _, v, g, beta, cu = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-0.01, seed=11, dtype=DTYPE, device=DEVICE)
    q, k, *_ = make_inputs("gdn", lengths, H=1, K=DIM, V=DIM, seed=12, dtype=DTYPE, device=DEVICE)
    h0 = make_state(len(lengths), 2, DIM, DIM, device=DEVICE)
    gen = torch.Generator().manual_seed(13)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    kw = {"scale": DIM**-0.5, "initial_state": h0, "dht": dht, "cu_seqlens": cu, "split_chunks": split}
    got, _ = _both(q, k, v, g, beta, do, **kw)
    assert got[0].shape == q.shape and got[1].shape == k.shape
    _check(got, _reference_grads("gdn", q, k, v, g, beta, h0, do, dht, cu.tolist()), TOL)


# the ds_mem variant (dS in the per-program scratch) in two key blocks at K = 32 (BK = 16), and in one (BK = K)
DS_MEM = [LaunchConfig(BK=bk, num_warps=8, num_stages=1, VARIANT=DH_VARIANTS["ds_mem"]) for bk in (DIM // 2, DIM)]


# each key-block form once and each split once (the two other crossings added 13 s of interpreter time to the suite)
@pytest.mark.parametrize(("split", "cfg"), [(1, DS_MEM[0]), (0, DS_MEM[1])], ids=["split-bk_half", "unsplit-bk_all"])
def test_ds_mem_variant(split: int, cfg: LaunchConfig) -> None:
    """test_varlen_grouped's case (one-chunk segments with dh0 through `final_idx`, or unsplit; grouped heads, h0,
    dht) under the ds_mem variant: against the register kernel and the reference at TOL."""
    lengths = (37, 70, 5)
    _, _, v, g, beta, cu = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-0.01, seed=11, dtype=DTYPE, device=DEVICE)
    q, k, *_ = make_inputs("gdn", lengths, H=1, K=DIM, V=DIM, seed=12, dtype=DTYPE, device=DEVICE)
    h0 = make_state(len(lengths), 2, DIM, DIM, device=DEVICE)
    gen = torch.Generator().manual_seed(13)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    kw = {"scale": DIM**-0.5, "initial_state": h0, "dht": dht, "cu_seqlens": cu, "split_chunks": split}
    got = _grads(q, k, v, g, beta, do, bwd_grads="fused_dh", dh_config=cfg, **kw)
    _check(got, _grads(q, k, v, g, beta, do, bwd_grads="fused_dh", **kw), TOL)
    _check(got, _reference_grads("gdn", q, k, v, g, beta, h0, do, dht, cu.tolist()), TOL)


def test_ds_mem_dense_strong_decay() -> None:
    """The ds_mem variant in two key blocks on a dense batch without h0 or dht, unsplit, gates at -5 to -5.5 per
    token (test_dense_strong_decay_unsplit's case); unknown VARIANT bits refused."""
    B, T = 2, 100
    q, k, v, _, beta, _ = make_inputs("gdn", B=B, T=T, H=2, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    gen = torch.Generator().manual_seed(7)
    g = (-5.0 - 0.5 * torch.rand(B, T, 2, generator=gen)).to(DEVICE)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    got = _grads(q, k, v, g, beta, do, bwd_grads="fused_dh", dh_config=DS_MEM[0], scale=DIM**-0.5, split_chunks=0)
    ref = _reference_grads("gdn", q, k, v, g, beta, None, do, None, [i * T for i in range(B + 1)])
    _check(got, ref, TOL, max(TOL, 3e-4))
    with pytest.raises(ValueError, match="unknown VARIANT bits 2"):
        _grads(q, k, v, g, beta, do, bwd_grads="fused_dh", dh_config=LaunchConfig(VARIANT=2), scale=1.0)


def test_warm_windows() -> None:
    """The split's segment ends from the certified warm windows (`LaunchPlan(bwd_warm=1)`), both branches in one call
    (the report read after it), h0 and dht; against the reference and the default path under the same windows."""
    q, k, v, g, beta, cu, h0, do, dht = warm._case()
    report: dict[str, torch.Tensor] = {}
    kw = {"scale": DIM**-0.5, "initial_state": h0, "dht": dht, "cu_seqlens": cu, "split_chunks": warm.SPLIT,
          "chunk_size": warm.CHUNK, "plan_kw": {"bwd_warm": warm.WINDOW}}  # fmt: skip
    got = _grads(q, k, v, g, beta, do, bwd_grads="fused_dh", warm_report=report, **kw)
    assert report["certified"].tolist() == warm.CERTIFIED[True]
    _check(got, _grads(q, k, v, g, beta, do, bwd_grads="fused", **kw), TOL)
    _check(got, warm._reference(), TOL)


def test_dense_strong_decay_unsplit() -> None:
    """No h0 nor dht, one pass per sequence (split_chunks=0), a partial last chunk, gates at -5 to -5.5 per token."""
    B, T = 2, 100
    q, k, v, _, beta, _ = make_inputs("gdn", B=B, T=T, H=2, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    gen = torch.Generator().manual_seed(7)
    g = (-5.0 - 0.5 * torch.rand(B, T, 2, generator=gen)).to(DEVICE)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    got, _ = _both(q, k, v, g, beta, do, scale=DIM**-0.5, split_chunks=0)
    assert got[5] is None
    ref = _reference_grads("gdn", q, k, v, g, beta, None, do, None, [i * T for i in range(B + 1)])
    _check(got, ref, TOL, max(TOL, 3e-4))


def test_dense_split_with_dht() -> None:
    """A dense batch in one-chunk segments (every sequence's first segment takes no dh0: none asked), dht alone."""
    B, T = 2, 160
    q, k, v, g, beta, _ = make_inputs("gdn", B=B, T=T, H=2, K=DIM, V=DIM, lb=-0.05, seed=5, dtype=DTYPE, device=DEVICE)
    gen = torch.Generator().manual_seed(8)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(B, 2, DIM, DIM, generator=gen).to(DEVICE)
    got, _ = _both(q, k, v, g, beta, do, scale=DIM**-0.5, dht=dht, split_chunks=1)
    ref = _reference_grads("gdn", q, k, v, g, beta, None, do, dht, [i * T for i in range(B + 1)])
    _check(got, ref, TOL)


def test_refused_outside_gdn_up_to_128() -> None:
    """KDA, and a head dim above 128, raise the one-line ValueError before any launch."""
    q, k, v, g, beta, _ = make_inputs("kda", B=1, T=16, H=1, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    plan = LaunchPlan(bwd_grads="fused_dh")
    with pytest.raises(ValueError, match=r"^LaunchPlan\.bwd_grads='fused_dh' runs GDN with K, V <= 128 only, got kda"):
        cb.chunk_bwd("kda", q, k, v, g, beta, torch.randn_like(v), scale=1.0, plan=plan)
    q, k, v, g, beta, _ = make_inputs("gdn", B=1, T=16, H=1, K=16, V=256, dtype=DTYPE, device=DEVICE)
    with pytest.raises(ValueError, match=r"got gdn K=16 V=256$"):
        cb.chunk_bwd("gdn", q, k, v, g, beta, torch.randn_like(v), scale=1.0, plan=plan)


def test_automatic_split_counts_one_program_per_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The automatic split (a GPU's: here recorded, not run) is asked for fused_dh's one program per (segment, head),
    and for the default path's V blocks of `chunk_state_bwd` (two at V = 32 under a 16-column config)."""
    asked: list[int] = []
    real = cb.resolve_split

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        asked.append(kwargs["NV"])
        return real(*args, **kwargs)

    monkeypatch.setattr(cb, "resolve_split", spy)
    q, k, v, g, beta, _ = make_inputs("gdn", B=1, T=40, H=1, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    do = torch.randn_like(v)
    configs = {"chunk_state_bwd": LaunchConfig(BV=DIM // 2, num_warps=4, num_stages=1)}
    for grads in ("fused_dh", "fused"):
        cb.chunk_bwd("gdn", q, k, v, g, beta, do, scale=1.0, plan=LaunchPlan(bwd_grads=grads, configs=configs))
    assert asked == [1, 2]
