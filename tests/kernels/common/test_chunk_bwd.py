"""The Triton backward of GDN and KDA (`kernels.common.chunk_bwd`, through `kernels.ops.<op>.chunk.chunk_<op>_bwd`)
against autograd through the fp32 per-token reference (interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1, in bf16). Every test runs for both ops.

Scenarios: varlen with lengths not multiples of 64 and shorter than a chunk, an initial state and an incoming
final-state gradient (dht), slow-decay gates (lb = -0.01, so gradients travel across chunks and segments), the
reverse state pass split into one-chunk segments (transition, reverse chain, the ext pass); dense input without an
initial state or dht, with gates at -5 to -5.5 per token (the old Triton KDA limit; any gate works now, see
common/test_decay_gate_range.py), through the plain pass.
Tolerance: 1e-5 relative L2 on CPU (the interpreter computes dots in IEEE fp32: measured 2e-7 to 5e-7 for every
gradient), 3e-4 for the strong-decay case (dg there is a reverse cumsum of terms of ~1e-3 that cancel to ~1e-5:
measured 5e-5 (GDN) and 1.2e-4 (KDA) relative, 3e-7 absolute, the fp32 rounding of the reference itself); 5e-3 on a GPU with bf16 inputs
(the issue's bound; bf16 operands of the tensor-core products).
"""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from kernels.plan import LaunchPlan, LaunchRecorder, default_plan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

DEVICE = TEST_DEVICE
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOL = 1e-5 if DEVICE == "cpu" else 5e-3
# on the GPU K = V = 64: a state block of 32 columns with one pipeline stage hits the known Triton 3.6 sm_90
# miscompile (kernels/NOTES.md), which a 32-wide head dim would force
DIM = 32 if DEVICE == "cpu" else 64
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")

pytestmark = pytest.mark.parametrize("OP", ["gdn", "kda"])


def _bwd(op: str):
    return getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_bwd")


def _reference_grads(op, q, k, v, g, beta, h0, do, dht, bounds):
    """Autograd through the per-token reference in fp32: (dq, dk, dv, dg, dbeta, dh0 or None)."""
    mod = importlib.import_module("kernels.ops.gdn.naive" if op == "gdn" else "kernels.ops.kda.naive")
    ref = getattr(mod, f"naive_recurrent_{op}")
    xs = [x.detach().float().clone().requires_grad_() for x in (q, k, v, g, beta)]
    s0 = h0.detach().clone().requires_grad_() if h0 is not None else None
    o, ht = ref(*xs, scale=q.shape[-1] ** -0.5, initial_state=s0, output_final_state=True, cu_seqlens_cpu=bounds)
    loss = (o * do.float()).sum() + ((ht * dht).sum() if dht is not None else 0.0)
    loss.backward()
    return [x.grad for x in xs] + [s0.grad if s0 is not None else None]


def _check(got, ref, tol=TOL):
    for name, a, r in zip(NAMES, got, ref, strict=True):
        if r is None:
            assert a is None, f"{name}: expected None"
            continue
        assert_rel_close(name, r, a.float(), tol)


def _varlen_case(op: str):
    """Three sequences (37, 70, 5 tokens: partial chunks, one shorter than a chunk), slow-decay gates (lb -0.01),
    an initial state, random do and dht: the one case of every varlen test here (its results are shared below)."""
    lengths = (37, 70, 5)
    q, k, v, g, beta, cu = make_inputs(op, lengths, H=1, K=DIM, V=DIM, lb=-0.01, dtype=DTYPE, device=DEVICE)
    h0 = make_state(len(lengths), 1, DIM, DIM, device=DEVICE)
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    dht = torch.randn(h0.shape, generator=gen).to(DEVICE)
    return q, k, v, g, beta, cu, h0, do, dht


# the interpreter takes seconds per backward: each result below is computed once per op (and split) and shared by
# the tests that compare against it (read-only)
@functools.cache
def _varlen_reference(op: str) -> list[torch.Tensor | None]:
    """The fp32 reference's gradients of the varlen case."""
    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(op)
    return _reference_grads(op, q, k, v, g, beta, h0, do, dht, cu.tolist())


@functools.cache
def _varlen_bwd(op: str, split: int) -> tuple[tuple[torch.Tensor, ...], frozenset[str]]:
    """(the Triton backward's gradients of the varlen case with h0 and dht, split into `split`-chunk segments, the
    kernels it launched)."""
    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(op)
    rec = LaunchRecorder()
    got = _bwd(op)(q, k, v, g, beta, do, scale=DIM**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu,
                   split_chunks=split, plan=default_plan().with_recorder(rec))
    return tuple(got), frozenset(rec)


def test_triton_bwd_varlen_split(OP: str) -> None:
    _, _, _, g, *_ = _varlen_case(OP)
    got, ran = _varlen_bwd(OP, 1)
    assert {"chunk_state_transition_fwd", "seg_chain_fwd", "chunk_state_bwd", "seg_chain_bwd"} <= ran
    assert got[0].dtype == DTYPE and got[3].dtype == g.dtype and got[5].dtype == torch.float32
    _check(got, _varlen_reference(OP))


def test_triton_bwd_dense_strong_decay(OP: str) -> None:
    """No initial state (dh0 is None) nor dht; gates at the old bound -5.5 (spans of 80-88 per 16-row block)."""
    B, T, H, K, V = 2, 40, 1, DIM, DIM
    q, k, v, _, beta, _ = make_inputs(OP, B=B, T=T, H=H, K=K, V=V, dtype=DTYPE, device=DEVICE)
    gen = torch.Generator().manual_seed(7)
    g_shape = (B, T, H) if OP == "gdn" else (B, T, H, K)
    g = (-5.0 - 0.5 * torch.rand(*g_shape, generator=gen)).to(DEVICE)
    do = torch.randn(v.shape, generator=gen).to(DEVICE, DTYPE)
    got = _bwd(OP)(q, k, v, g, beta, do, scale=K**-0.5, split_chunks=0)
    assert all(torch.isfinite(x).all() for x in got[:5])
    _check(got, _reference_grads(OP, q, k, v, g, beta, None, do, None, [i * T for i in range(B + 1)]), max(TOL, 3e-4))


# kernels the backward launches only when it recomputes (per recompute policy, `LaunchPlan.keep`)
_RECOMPUTED = {"wy": ("wy_{op}_fwd",), "wy+states": ("wy_{op}_fwd", "chunk_state_fwd", "chunk_state_transition_fwd")}


@functools.cache
def _autograd_grads(op: str, keep: str) -> tuple[tuple[torch.Tensor, ...], frozenset[str]]:
    """(the gradients of the varlen case through `kernels.forward` on triton with `LaunchPlan(keep=keep)` and
    autograd, the kernels its backward launched: the backward launches with the plan of its forward, so its launches
    reach the forward's recorder)."""
    import kernels

    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(op)
    rec = LaunchRecorder()
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = kernels.forward(op, *xs[:5], initial_state=xs[5], output_final_state=True, cu_seqlens=cu,
                            backend="triton", plan=LaunchPlan(keep=keep, recorder=rec))
    rec.clear()
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    return tuple(x.grad for x in xs), frozenset(rec)


@pytest.mark.parametrize("policy", ["wy", "wy+states"])
def test_triton_bwd_with_what_the_forward_kept(OP: str, policy: str) -> None:
    """`LaunchPlan.keep`: the forward keeps its WY factors (and with "wy+states" its chunk states, v_new and
    segment maps) and the backward skips their recompute (those launchers do not run in the backward); the
    gradients are those of the recompute path (bitwise: the same kernels on the same inputs) and of the
    reference, varlen, with an initial state and dht."""
    kept, ran = _autograd_grads(OP, policy)
    assert not {name.format(op=OP) for name in _RECOMPUTED[policy]} & ran, sorted(ran)
    recomputed, ran = _autograd_grads(OP, "inputs")
    assert f"wy_{OP}_fwd" in ran and "chunk_state_fwd" in ran, sorted(ran)
    for name, a, b in zip(NAMES, kept, recomputed, strict=True):
        assert torch.equal(a, b), name
    _check(kept, _varlen_reference(OP))


def test_triton_bwd_from_the_forwards_segment_states(OP: str) -> None:
    """The forward split into one-chunk segments hands its segments' entering states to the backward (`seg_states`):
    the backward runs the forward's split from them (no split_chunks given) without the recompute's chain, and gives
    the recompute path's gradients (the same split; on a GPU within bf16's rounding of the states, which the
    forward's fused pass and the backward's recompute round apart) and the reference's."""
    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    fwd = getattr(importlib.import_module(f"kernels.ops.{OP}.chunk"), f"chunk_{OP}_fwd")
    seg: dict[str, object] = {}
    fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu, split_chunks=1,
        seg_states=seg)
    hs = seg["hs"]
    assert seg["seg_chunks"] == 1 and isinstance(hs, torch.Tensor)
    assert hs.shape == (4, 1, DIM, DIM) and hs.dtype == torch.float32  # 1 + 2 + 1 one-chunk segments
    rec = LaunchRecorder()
    got = _bwd(OP)(q, k, v, g, beta, do, scale=DIM**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu, seg_states=seg,
                   plan=default_plan().with_recorder(rec))
    assert "seg_chain_fwd" not in rec and {"chunk_state_fwd", "seg_chain_bwd"} <= set(rec), sorted(rec)
    ref, ran = _varlen_bwd(OP, 1)  # the recompute path, the same split
    assert "seg_chain_fwd" in ran
    for name, a, b in zip(NAMES, got, ref, strict=True):  # the same states by other kernels (the forward's): fp32
        assert_rel_close(name, b.float(), a.float(), 1e-6 if DEVICE == "cpu" else TOL)  # alike; bf16: 8e-4 (H200)
    _check(got, _varlen_reference(OP))


def test_public_op_hands_its_segment_states_to_its_backward(OP: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the autograd node (`kernels.forward`, triton) with the split forced as on a GPU (one-chunk segments):
    the backward launches no recompute chain (the node saved the forward's segment states) and its gradients are
    the reference's."""
    import kernels
    import kernels.common.seqsplit as seqsplit

    monkeypatch.setattr(seqsplit, "auto_seg_chunks", lambda index, *, H, NV, device: 1)
    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    rec = LaunchRecorder()
    xs = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = kernels.forward(OP, *xs[:5], initial_state=xs[5], output_final_state=True, cu_seqlens=cu,
                            backend="triton", plan=LaunchPlan(recorder=rec))
    assert "seg_chain_fwd" in rec  # the forward split
    rec.clear()
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    assert "seg_chain_fwd" not in rec and "chunk_state_fwd" in rec, sorted(rec)
    _check([x.grad for x in xs], _varlen_reference(OP))


@pytest.mark.parametrize("fuse", [True, False])
def test_triton_bwd_with_the_forwards_states_split(OP: str, fuse: bool) -> None:
    """The forward split into one-chunk segments keeps the maps of every segment, its states and v_new (fused output
    pass or plain pass); the backward reuses them (no transition or forward state pass) and gives the gradients of
    the recompute path, the same split."""
    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    fwd = getattr(importlib.import_module(f"kernels.ops.{OP}.chunk"), f"chunk_{OP}_fwd")
    keep: dict[str, torch.Tensor] = {}
    o, ht = fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                split_chunks=1, fuse_output=fuse, keep=keep, keep_states=True)
    o_plain, ht_plain = fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True,
                            cu_seqlens=cu, split_chunks=1, fuse_output=fuse, fwd_path="wy")  # the path that keeps
    assert torch.equal(o, o_plain) and torch.equal(ht, ht_plain)  # keeping changes what is stored, not the result
    assert int(keep["split"]) == 1 and keep["split"].device.type == "cpu"
    assert keep["M"].shape[0] == keep["h"].shape[0]  # one-chunk segments: one map per chunk, the last ones too
    rec = LaunchRecorder()
    got = _bwd(OP)(q, k, v, g, beta, do, scale=DIM**-0.5, initial_state=h0, dht=dht, cu_seqlens=cu, wy=keep,
                   plan=default_plan().with_recorder(rec))
    assert not {"chunk_state_fwd", "chunk_state_transition_fwd", "seg_chain_fwd"} & set(rec), sorted(rec)
    assert "seg_chain_bwd" in rec
    ref, _ = _varlen_bwd(OP, 1)  # the recompute path, the same split
    for name, a, b in zip(NAMES, got, ref, strict=True):
        assert_rel_close(name, b.float(), a.float(), 1e-6)
    _check(got, _varlen_reference(OP))


@pytest.mark.parametrize("split", [0, 1])
def test_triton_state_grad_alone(OP: str, split: int) -> None:
    """`chunk_state_grad` (what true_cp gathers before it knows its dht): the dh0 of the whole backward, from the WY
    prep and the reverse state pass alone (no chunk states, T or gradient kernels), plain and split, with dht."""
    from kernels.common.chunk_bwd import chunk_state_grad

    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    rec = LaunchRecorder()
    got = chunk_state_grad(OP, q, k, v, g, beta, do, scale=DIM**-0.5, dht=dht, cu_seqlens=cu, split_chunks=split,
                           plan=default_plan().with_recorder(rec))
    ran = set(rec)
    assert "chunk_state_bwd" in ran and not ran & {"chunk_state_fwd", "wy_inverse", "chunk_bwd_dqk", "wy_bwd"}, ran
    full = _varlen_bwd(OP, split)[0][5]
    assert_rel_close("dh0", full, got, 1e-6 if DEVICE == "cpu" else 1e-3)
    assert_rel_close("dh0 vs reference", _varlen_reference(OP)[5], got, TOL)


def test_state_gradient_api_torch_and_triton(OP: str) -> None:
    """`kernels.api.chunk_state_gradient` (`kernels.cp.prims.state_grad`): both backends give the reference's
    dh0, without an initial state (it does not depend on one); a `do` of the wrong shape is refused by name."""
    from kernels.api import chunk_state_gradient

    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    ref = _varlen_reference(OP)[5]
    for backend in ("torch", "triton"):
        got = chunk_state_gradient(OP, q, k, v, g, beta, do, dht=dht, cu_seqlens=cu, backend=backend)
        assert got.dtype == torch.float32
        assert_rel_close(f"dh0 ({backend})", ref, got, TOL)
    with pytest.raises(ValueError, match="do"):
        chunk_state_gradient(OP, q, k, v, g, beta, do[:, :-1], cu_seqlens=cu, backend="torch")


def test_unknown_keep_policy_is_one_line_error(OP: str) -> None:
    """A `LaunchPlan.keep` outside KEEP_POLICIES fails before any launch, naming the allowed policies."""
    import kernels

    q, k, v, g, beta, cu, h0, do, dht = _varlen_case(OP)
    rec = LaunchRecorder()
    allowed = r"auto, inputs, ag, ag\+states, wy, wy\+states"
    with pytest.raises(ValueError, match=rf"^LaunchPlan\.keep must be one of {allowed}, got 'states'$"):
        kernels.forward(OP, q.requires_grad_(), k, v, g, beta, cu_seqlens=cu, backend="triton",
                        plan=LaunchPlan(keep="states", recorder=rec))
    assert not rec
