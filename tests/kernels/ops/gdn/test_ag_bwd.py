"""GDN's backward from the forward's kept Ag (`kernels.ops.gdn.ag_bwd`, the recompute policy "ag") on random inputs
(interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1, bf16).

- `wy_from_ag`: w, u, Aqk and T = I - Ag M against what the recompute path makes (`wy_gdn_fwd`, `wy_inverse`), with
  grouped value heads, varlen with partial and sub-chunk sequences, strong gates (-5 to -5.5 per token) and tiny
  beta (1e-6: T needs no division by beta, so it stays exact there);
- the training step under keep="ag" through `kernels.forward` (autograd): no `wy_gdn_fwd`, `wy_inverse` or Ag pass in
  the backward, its chunk states recomputed by `chunk_state_fwd` from `wy_from_ag`'s w, u; every gradient (dq, dk,
  dv, dg, dbeta, dh0) against autograd through the fp32 per-token reference and against the recompute policy
  "inputs"; varlen with an initial state and dht, grouped heads (HV = 2H); dense B=2 with strong gates; the split
  forced as on a GPU (the backward runs the forward's split from its segment states: no transitions, no chain); with
  2-chunk segments and the reverse window of 1 chunk (the sums of the windows' certification from the forward's
  kept q, k side and do, `kernels.common.warm_bwd.reverse_chunk_bound_kept`);
- `chunk_gdn_bwd_ag` called directly with the reverse pass split into one-chunk segments (its own transitions and
  chain, no segment states handed in), and with `wy=None` (the Ag pass run in the backward: bitwise the same);
- (KDA under "ag": tests/kernels/ops/kda/test_ag_bwd.py.)
Tolerances: relative L2, 1e-5 against the reference on CPU (IEEE fp32 dots; measured ~2e-7), 3e-4 for strong gates
(dg cancels to ~1e-5 of its terms, as tests/kernels/common/test_chunk_bwd.py), 1e-5 between the two policies and for
the factors; on a GPU in bf16 5e-3 (the issue's bound) and 2e-2 for the bf16-stored factors.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.chunk_bwd import wy_inverse
from kernels.common.index import prepare_chunk_index
from kernels.common.wy import wy_gdn_fwd
from kernels.ops.gdn.ag_bwd import chunk_gdn_bwd_ag, wy_from_ag
from kernels.ops.gdn.chunk import chunk_gdn_bwd
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.parallel_compile import PARALLEL_COMPILE_ENV
from kernels.plan import LaunchPlan, LaunchRecorder, default_plan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state
from tests.utils.gdn_reference import gdn_reference_grads

DEVICE = TEST_DEVICE
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOL = 1e-5 if DEVICE == "cpu" else 5e-3
FACTOR_TOL = 1e-5 if DEVICE == "cpu" else 2e-2
DIM = 32 if DEVICE == "cpu" else 64  # K = V (on the GPU 64: see test_chunk_bwd.py on BV=32)
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
# what the backward launches only when it recomputes the WY factors and the chunk states
RECOMPUTE = {"wy_gdn_fwd", "wy_inverse", "chunk_state_fwd", "chunk_state_transition_fwd", "wy_gdn_ag_fwd"}
WY_RECOMPUTE = {"wy_gdn_fwd", "wy_inverse", "wy_gdn_ag_fwd"}  # what the backward from the kept Ag never runs


def _case(lengths=(37, 70, 5), *, B=None, T=None, H=1, HV=2, lb=-0.05, seed=5):
    """q, k `[.., H, K]`, v, g, beta `[.., HV, ..]` (dtype DTYPE), cu_seqlens, h0, do, dht."""
    q, k, _, _, _, cu = make_inputs("gdn", lengths, B=B, T=T, H=H, K=DIM, V=DIM, dtype=DTYPE, device=DEVICE)
    _, _, v, g, beta, _ = make_inputs("gdn", lengths, B=B, T=T, H=HV, K=DIM, V=DIM, lb=lb, seed=seed, dtype=DTYPE,
                                      device=DEVICE)  # fmt: skip
    N = len(lengths) if lengths is not None else B
    h0 = make_state(N, HV, DIM, DIM, device=DEVICE)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    return q, k, v, g, beta, cu, h0, do, dht


def _reference(q, k, v, g, beta, h0, do, dht, bounds):
    return gdn_reference_grads(q, k, v, g, beta, h0, do, dht, bounds, scale=DIM**-0.5)


def _check(got, ref, tol=TOL):
    for name, a, r in zip(NAMES, got, ref, strict=True):
        if r is None:
            assert a is None, name
            continue
        assert torch.isfinite(a).all(), name
        assert_rel_close(name, r, a.float(), tol)


def _step(q, k, v, g, beta, h0, do, dht, cu, keep: str):
    """One training step through `kernels.forward` under `keep`: (the six gradients, the kernels the backward ran)."""
    rec = LaunchRecorder()
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    o, ht = kernels.forward("gdn", *xs, initial_state=s0, output_final_state=True, cu_seqlens=cu, backend="triton",
                            plan=LaunchPlan(keep=keep, recorder=rec))  # fmt: skip
    rec.clear()
    ((o.float() * do.float()).sum() + ((ht * dht).sum() if dht is not None else 0.0)).backward()
    return [x.grad for x in xs] + [s0.grad if s0 is not None else None], set(rec)


@pytest.mark.parametrize(
    "case",
    [
        {"lengths": (37, 70, 5), "HV": 2},  # varlen, partial and sub-chunk sequences, grouped heads
        {"lengths": None, "B": 2, "T": 40, "H": 1, "HV": 1, "strong": True},  # dense, gates -5 to -5.5 per token
        {"lengths": (70,), "HV": 1, "beta": 1e-6},  # tiny beta: T = I - Ag M without any 1/beta
    ],
    ids=["varlen-grouped", "dense-strong", "tiny-beta"],
)
def test_factors_from_ag_equal_the_recomputed_ones(case) -> None:
    case = dict(case)
    tiny, strong = case.pop("beta", None), case.pop("strong", False)
    q, k, v, g, beta, cu, *_ = _case(**case)
    if strong:
        g = (-5.0 - 0.5 * torch.rand(g.shape, generator=torch.Generator().manual_seed(1))).to(DEVICE)
    if tiny is not None:
        beta = torch.full_like(beta, tiny)
    index = prepare_chunk_index(cu, batch=k.shape[0], seq_len=k.shape[1], chunk_size=64, device=k.device)
    ag, gcum = wy_gdn_ag(k, g, beta, index=index)
    w, u, aqk, tt, bnd = wy_from_ag(q, k, v, ag, gcum, scale=DIM**-0.5, index=index)
    assert bnd is None  # no bound asked for
    G = v.shape[2] // k.shape[2]
    qe, ke = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    w_ref, u_ref, gs_ref, aqk_ref = wy_gdn_fwd(qe, ke, v, g, beta, scale=DIM**-0.5, index=index)
    tt_ref = wy_inverse(ke, g, beta, index=index, gate_vector=False)
    low = torch.ones(64, 64, device=DEVICE).tril().bool()
    rows = torch.arange(k.shape[1], device=DEVICE) % 64  # each token's row in its chunk (dense: chunks start at 0)
    if cu is not None:
        starts = torch.repeat_interleave(cu[:-1], cu.diff())
        rows = (torch.arange(k.shape[1], device=DEVICE) - starts) % 64
    mask = low[rows][None, :, None, :]  # the lower triangle each row holds (the blocks above are not read)
    assert torch.equal(gcum, gs_ref)
    assert_rel_close("w", w_ref.float(), w.float(), FACTOR_TOL)
    assert_rel_close("u", u_ref.float(), u.float(), FACTOR_TOL)
    low = lambda x: torch.where(mask, x.float(), 0.0)  # noqa: E731 (the recompute leaves the upper blocks unwritten)
    assert_rel_close("aqk", low(aqk_ref), low(aqk), FACTOR_TOL)
    assert_rel_close("T", low(tt_ref), low(tt), FACTOR_TOL)
    assert torch.equal(torch.where(mask, 0.0, aqk.float()), torch.zeros_like(aqk, dtype=torch.float32))  # zeros above
    if tiny is not None:  # T -> I - beta M as beta -> 0: its off-diagonal (~1e-6) keeps its relative accuracy
        eye = torch.eye(64, device=DEVICE)[rows][None, :, None, :]
        off, off_ref = low(tt) - eye, low(tt_ref) - eye
        assert 0 < off_ref.abs().max() < 1e-4
        assert_rel_close("T - I", off_ref, off, FACTOR_TOL)


def test_training_step_from_ag_varlen_grouped() -> None:
    """keep="ag": the forward keeps Ag and the gate cumsum, the backward runs no WY prep, inverse or Ag pass (its
    chunk states from `wy_from_ag`'s w, u); gradients (with h0 and dht, grouped heads) equal the "inputs" policy's and
    the reference's."""
    q, k, v, g, beta, cu, h0, do, dht = _case(HV=2)
    got, ran = _step(q, k, v, g, beta, h0, do, dht, cu, "ag")
    assert {"wy_from_ag", "chunk_state_fwd", "chunk_state_bwd", "chunk_bwd_dqk_wy"} <= ran, sorted(ran)
    assert not ran & (WY_RECOMPUTE | {"gdn_fused_state_output_fwd"}), sorted(ran)
    old, ran_old = _step(q, k, v, g, beta, h0, do, dht, cu, "inputs")
    assert {"wy_gdn_fwd", "wy_inverse"} <= ran_old
    for name, a, b in zip(NAMES, got, old, strict=True):
        assert_rel_close(f"{name} vs inputs", b.float(), a.float(), 1e-5 if DEVICE == "cpu" else 2e-2)
    _check(got, _reference(q, k, v, g, beta, h0, do, dht, cu.tolist()))


def test_training_step_from_ag_dense_strong_gates() -> None:
    """Dense B=2, no initial state nor dht (dh0 is None), gates at -5 to -5.5 per token."""
    B, T = 2, 40
    q, k, v, g, beta, _, _, do, _ = _case(None, B=B, T=T, HV=1)
    g = (-5.0 - 0.5 * torch.rand(g.shape, generator=torch.Generator().manual_seed(2))).to(DEVICE)
    got, ran = _step(q, k, v, g, beta, None, do, None, None, "ag")
    assert not ran & WY_RECOMPUTE, sorted(ran)
    _check(got, _reference(q, k, v, g, beta, None, do, None, [i * T for i in range(B + 1)]), max(TOL, 3e-4))


def test_backward_from_ag_split() -> None:
    """The backward from Ag called directly with the reverse pass split into one-chunk segments and no segment states
    handed in (`chunk_bwd`'s own transitions, chain and state recompute from `wy_from_ag`'s w, u): the recompute
    backward's gradients, same split, and the reference's; with `wy=None` (the Ag pass run in the backward) bitwise
    the same."""
    q, k, v, g, beta, cu, h0, do, dht = _case(HV=2, seed=9)
    index = prepare_chunk_index(cu, batch=1, seq_len=k.shape[1], chunk_size=64, device=k.device)
    ag, gcum = wy_gdn_ag(k, g, beta, index=index)
    rec = LaunchRecorder()
    opts = {"scale": DIM**-0.5, "initial_state": h0, "dht": dht, "cu_seqlens": cu, "split_chunks": 1}
    got = chunk_gdn_bwd_ag(q, k, v, g, beta, do, wy={"ag": ag, "gs": gcum}, plan=default_plan().with_recorder(rec),
                           **opts)  # fmt: skip
    assert {"chunk_state_transition_fwd", "seg_chain_fwd", "chunk_state_fwd", "seg_chain_bwd"} <= set(rec), sorted(rec)
    assert not set(rec) & WY_RECOMPUTE, sorted(rec)
    ref = chunk_gdn_bwd(q, k, v, g, beta, do, **opts)
    for name, a, b in zip(NAMES, got, ref, strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-5 if DEVICE == "cpu" else 2e-2)
    rec.clear()  # wy=None: the Ag pass runs again in the backward, the same Ag: the same gradients
    again = chunk_gdn_bwd_ag(q, k, v, g, beta, do, wy=None, plan=default_plan().with_recorder(rec), **opts)
    assert "wy_gdn_ag_fwd" in rec and not set(rec) & (WY_RECOMPUTE - {"wy_gdn_ag_fwd"}), sorted(rec)
    for name, a, b in zip(NAMES, again, got, strict=True):
        assert torch.equal(a, b), name
    _check(got, _reference(q, k, v, g, beta, h0, do, dht, cu.tolist()))


def test_training_step_from_ag_split_uses_the_forwards_segment_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """keep="ag" through the autograd node with the split forced as on a GPU (one-chunk segments): the forward keeps
    Ag, the gate cumsum and its split's segment entering states; the backward runs the forward's split from them (no
    forward chain, no certification) and no WY recompute; gradients equal the "inputs" policy's (same
    split, same segment states) and the reference's."""
    import kernels.common.seqsplit as seqsplit

    monkeypatch.setattr(seqsplit, "auto_seg_chunks", lambda index, *, H, NV, device: 1)
    q, k, v, g, beta, cu, h0, do, dht = _case(HV=2, seed=13)
    got, ran = _step(q, k, v, g, beta, h0, do, dht, cu, "ag")
    assert {"wy_from_ag", "chunk_state_fwd", "seg_chain_bwd"} <= ran, sorted(ran)
    assert not ran & (WY_RECOMPUTE | {"seg_chain_fwd", "certify_chunk_windows"}), sorted(ran)  # (the maps of the
    # reverse chain, `chunk_state_transition_fwd`, still run: these one-chunk windows cannot certify the weak gates)
    old, ran_old = _step(q, k, v, g, beta, h0, do, dht, cu, "inputs")
    assert {"wy_gdn_fwd", "wy_inverse", "chunk_state_fwd"} <= ran_old and "seg_chain_fwd" not in ran_old
    for name, a, b in zip(NAMES, got, old, strict=True):
        assert_rel_close(f"{name} vs inputs", b.float(), a.float(), 1e-5 if DEVICE == "cpu" else 2e-2)
    _check(got, _reference(q, k, v, g, beta, h0, do, dht, cu.tolist()))


def test_training_step_from_ag_warm_windows_read_the_forwards_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """keep="ag" through the autograd node with 2-chunk segments forced and the plan's reverse window of 1 chunk
    (`LaunchPlan.bwd_warm`; head 0's gates 100x: some windows certify): the forward's Ag pass keeps the q, k side of
    the reverse bound sums (`kernels.common.warm_bwd.KEPT_REV_SUMS`), which the autograd node saves, and the backward
    makes the sums from them and do (`reverse_chunk_bound_kept`, once), not by `reverse_chunk_bound` or
    `wy_from_ag(bound=)`; gradients equal the reference's."""
    import kernels.common.chunk_bwd as cb
    import kernels.common.seqsplit as seqsplit
    import kernels.common.warm_bwd as warm_bwd
    import kernels.ops.gdn.ag_bwd as ag_bwd

    monkeypatch.setattr(seqsplit, "auto_seg_chunks", lambda index, *, H, NV, device: 2)
    # the launches of this call alone: on a GPU a new kind of call is first dry-run to compile its kernels ahead
    # (`kernels.parallel_compile.compile_ahead`), which calls the watched functions too
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "0")
    q, k, v, g, beta, cu, h0, do, dht = _case((37, 200, 5), seed=3)  # the second sequence: 4 chunks, 2 segments
    g[:, :, 0] *= 100
    seen: dict[str, list] = {"reverse_chunk_bound": [], "reverse_chunk_bound_kept": [], "wy_from_ag": [], "certified": []}

    def watch(module, name, record):  # noqa: ANN001, ANN202
        fn = getattr(module, name)

        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            out = fn(*args, **kwargs)
            seen[name if name in seen else "certified"].append(record(kwargs, out))
            return out

        monkeypatch.setattr(module, name, run)

    watch(cb, "reverse_chunk_bound", lambda kw, out: True)
    watch(cb, "reverse_chunk_bound_kept", lambda kw, out: True)
    watch(ag_bwd, "wy_from_ag", lambda kw, out: kw.get("bound") is not None)
    watch(warm_bwd, "certify_reverse_windows", lambda kw, out: out[0].tolist())
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_()
    o, ht = kernels.forward("gdn", *xs, initial_state=s0, output_final_state=True, cu_seqlens=cu, backend="triton",
                            plan=LaunchPlan(keep="ag", bwd_warm=1))  # fmt: skip
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    assert seen["reverse_chunk_bound"] == [] and seen["reverse_chunk_bound_kept"] == [True], seen
    assert seen["wy_from_ag"] == [False]  # (no bound from its loads of q and k)
    assert [any(any(row) for row in ok) for ok in seen["certified"]] == [True], seen["certified"]
    _check([x.grad for x in xs] + [s0.grad], _reference(q, k, v, g, beta, h0, do, dht, cu.tolist()))
