"""Gates of any strength (issue 25, Build 2): strong per-key gates, -1000 and -inf masks, on every backend.

The rule under test is `kernels.common.decay` (the gate floor) and the row-block split of the Triton KDA kernels.
Scenarios, for GDN and KDA, each as a varlen batch with an initial state (lengths 45 and 83: partial chunks and
16-row blocks) and random do / dht:
- safe: gates in [-5, 0) (FLA's safe gate): 16-token spans up to 80, below the Triton KDA kernels' FAST_SPAN, so
  their diagonal blocks take the tensor-core product split at the block's midpoint (factors up to e^40);
- strong: gates down to -20 (per key for KDA, mixed with weak ones so that states still carry): spans above
  FAST_SPAN, the diagonal blocks elementwise;
- mask1000: weak gates with -1000 on random tokens (every key) and, for KDA, on random single keys;
- maskinf: the same masks at -inf.
First the reference is shown exact: the fp32 per-token reference against the same recurrence in fp64
(tolerance 1e-6 relative L2; a -inf gate is exp(-inf) = 0 in both). Then the torch and triton backends (the
interpreter on CPU) against the fp32 reference: forward (o, final state), backward through autograd (every
gradient finite and close, dh0 included) and the transition (M, S_ext). Tolerance: 5e-5 relative L2 for o, the
states and the gradients; the measured errors are 1e-7 to 3e-6 (the decays after a floored token carry the
rounding of the gate cumsum, ulp(112 k) after k masks in a chunk; with strong gates dg is a reverse cumsum of
cancelling terms). A masked gate's gradient is exactly 0 on every backend (the reference's: d exp(g) = 0).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

# the triton backend runs on TEST_DEVICE (the interpreter on CPU; CPBENCH_TEST_GPU=1: the GPU, where the fp32 inputs
# go through tf32 products, hence the looser bound there); the reference always runs in fp32 on the CPU
TOL = 5e-5 if TEST_DEVICE == "cpu" else 5e-3
LENGTHS = (45, 83)
H, K, V = 1, 32, 32
OPS = ["gdn", "kda"]
KINDS = ["safe", "strong", "mask1000", "maskinf"]
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _gate(op: str, kind: str, T: int, seed: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, masked): g `[1, T, H]` (GDN) or `[1, T, H, K]` (KDA) fp32 <= 0 and the bool mask of the masked entries."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, T, H) if op == "gdn" else (1, T, H, K)
    g = -0.3 * torch.rand(*shape, generator=gen)
    if kind == "safe":
        return -5.0 * torch.rand(*shape, generator=gen), torch.zeros(shape, dtype=torch.bool)
    if kind == "strong":  # half of the entries (per key for KDA) anywhere in [-20, 0)
        strong = torch.rand(*shape, generator=gen) < 0.5
        return torch.where(strong, -20.0 * torch.rand(*shape, generator=gen), g), torch.zeros(shape, dtype=torch.bool)
    masked = torch.rand(1, T, H, generator=gen) < 0.12
    if op == "kda":
        masked = masked[..., None] | (torch.rand(*shape, generator=gen) < 0.03)
    return g.masked_fill(masked, -1000.0 if kind == "mask1000" else float("-inf")), masked


def _case(op: str, kind: str):
    q, k, v, _, beta, cu = make_inputs(op, LENGTHS, H=H, K=K, V=V)
    g, masked = _gate(op, kind, sum(LENGTHS))
    h0 = make_state(len(LENGTHS), H, K, V)
    gen = torch.Generator().manual_seed(5)
    return q, k, v, g, beta, cu, h0, torch.randn(v.shape, generator=gen), torch.randn(h0.shape, generator=gen), masked


def _run(op: str, backend: str, q, k, v, g, beta, cu, h0, do, dht):
    """(o, ht, grads of q, k, v, g, beta, h0) through `kernels.forward` (or `kernels.reference`) and autograd."""
    device = TEST_DEVICE if backend == "triton" else "cpu"
    cu = cu.to(device)
    xs = [x.detach().to(device).requires_grad_() for x in (q, k, v, g, beta, h0)]
    do, dht = do.to(device), dht.to(device)
    if backend == "reference":
        o, ht = kernels.reference(op, *xs[:5], initial_state=xs[5], output_final_state=True, cu_seqlens=cu)
    else:
        o, ht = kernels.forward(op, *xs[:5], initial_state=xs[5], output_final_state=True, cu_seqlens=cu, backend=backend)
    ((o * do).sum() + (ht * dht).sum()).backward()
    return o.detach().cpu(), ht.detach().cpu(), [x.grad.cpu() for x in xs]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
def test_reference_is_exact(op: str, kind: str) -> None:
    """The fp32 per-token reference against the same recurrence in fp64, output and final state."""
    q, k, v, g, beta, cu, h0, *_ = _case(op, kind)
    o32, ht32 = kernels.reference(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o64, ht64 = kernels.reference(
        op, *(x.double() for x in (q, k, v, g, beta)), initial_state=h0.double(), output_final_state=True, cu_seqlens=cu
    )
    assert_rel_close("o fp32 vs fp64", o64, o32.double(), 1e-6)
    assert_rel_close("ht fp32 vs fp64", ht64, ht32.double(), 1e-6)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
def test_forward_backward_against_reference(op: str, kind: str, backend: str) -> None:
    """o, the final state and every gradient finite and within TOL of the reference; masked gates get dg = 0."""
    q, k, v, g, beta, cu, h0, do, dht, masked = _case(op, kind)
    o_ref, ht_ref, grads_ref = _run(op, "reference", q, k, v, g, beta, cu, h0, do, dht)
    o, ht, grads = _run(op, backend, q, k, v, g, beta, cu, h0, do, dht)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    for name, r, x in zip(NAMES, grads_ref, grads, strict=True):
        assert_rel_close(name, r, x, TOL)
    dg_ref, dg = grads_ref[3], grads[3]
    assert bool((dg_ref[masked] == 0).all()) and bool((dg[masked] == 0).all()), "a masked gate's gradient is 0"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
def test_transition_against_reference(op: str, kind: str, backend: str) -> None:
    """(M, S_ext) of each sequence finite and within TOL of the per-token reference's."""
    _, k, v, g, beta, cu, *_ = _case(op, kind)
    M_ref, S_ref = kernels.transition(op, k, v, g, beta, cu_seqlens=cu, backend="reference")
    device = TEST_DEVICE if backend == "triton" else "cpu"
    M, S = kernels.transition(op, *(x.to(device) for x in (k, v, g, beta)), cu_seqlens=cu.to(device), backend=backend)
    assert_rel_close("M", M_ref, M.cpu(), TOL)
    assert_rel_close("S_ext", S_ref, S.cpu(), TOL)


def test_decay_bound_finite_under_masks() -> None:
    """The warmup bound of `kernels.common.decay_bound` over a -inf-masked span: finite span sums (no -inf - -inf),
    each masked token contributing the floor, and a window bound that is finite or -inf, never NaN."""
    from kernels.common.decay import GATE_FLOOR
    from kernels.common.decay_bound import log_span_bound, log_window_bound, token_terms

    q, k, v, g, beta, cu, *_, masked = _case("kda", "maskinf")
    ell, log_u = token_terms("kda", k, v, g, beta)
    assert bool(torch.isfinite(ell).all())
    every_key = masked.all(-1)[0]  # [T, H] tokens masked on every key
    assert bool((ell[every_key] <= GATE_FLOOR + 1e-9).all())  # unit keys, beta <= 1: l_t = max_k g
    T = k.shape[1]
    starts, ends = torch.tensor([0, 10, 40]), torch.tensor([T, 60, 41])
    span = log_span_bound(ell, starts, ends)
    assert bool(torch.isfinite(span).all())
    win = log_window_bound(ell, log_u, ends, starts, torch.tensor([False, True, True]))
    assert not bool(torch.isnan(win).any()) and bool(torch.isfinite(win[1:]).all())


def test_gate_floor_is_a_reset_in_fp32() -> None:
    """The premise of `kernels.common.decay`: exp of the floor (and of anything below it) is exactly 0 in fp32, a
    gate at -inf becomes the floor, and the clamp's gradient is 0 below it (1 above)."""
    from kernels.common.decay import GATE_FLOOR, floor_gate

    assert torch.exp(torch.tensor(GATE_FLOOR, dtype=torch.float32)).item() == 0.0
    assert torch.exp(torch.tensor(GATE_FLOOR * 64, dtype=torch.float32)).item() == 0.0
    g = torch.tensor([float("-inf"), -1000.0, -112.5, -50.0, 0.0], requires_grad=True)
    out = floor_gate(g)
    assert out.tolist() == [GATE_FLOOR, GATE_FLOOR, GATE_FLOOR, -50.0, 0.0]
    out.sum().backward()
    assert g.grad is not None and g.grad.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
