"""The public differentiable ops kernels.chunk_gdn / chunk_kda: grouped value heads, the in-op l2norm, and bad input (a
ValueError naming the argument, forward and backward). FLA's other options: test_fla_args.py.

Grouped heads (HV = 2H and 4H) and `use_qk_l2norm_in_kernel` are checked forward and backward against an oracle
built by hand: q and k normalised with FLA's formula x / sqrt(sum x^2 + 1e-6) and expanded with repeat_interleave
(query/key head h // (HV/H) serves value head h), then autograd through the fp64 per-token reference. Tolerance
1e-5 relative L2 for the fp32 torch backend (as common/test_chunk_bwd_torch.py), 1e-10 for the reference backend (same math).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import kernels
from tests.utils import assert_rel_close, make_inputs, make_state

TOL32 = 1e-5
NAMES = ("q", "k", "v", "g", "beta", "h0")


def _entry(op: str):  # noqa: ANN202
    return kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda


def _grouped(op: str, H: int, HV: int, lengths: tuple[int, ...] = (37, 100), K: int = 16, V: int = 8):  # noqa: ANN202
    """fp64 inputs with q, k of H heads and v, g, beta, h0 of HV heads; a random do and dht."""
    _, _, v, g, beta, cu = make_inputs(op, lengths, H=HV, K=K, V=V, lb=-2.0, seed=5, dtype=torch.float64)
    q, k, _, _, _, _ = make_inputs(op, lengths, H=H, K=K, V=V, seed=6, dtype=torch.float64)
    h0 = make_state(len(lengths), HV, K, V).double()
    gen = torch.Generator().manual_seed(9)
    do = torch.randn(*v.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(*h0.shape, generator=gen, dtype=torch.float64)
    return (3 * q, 2 * k, v, g.double(), beta, h0), cu, do, dht   # q, k not unit-norm: the l2norm matters


def _oracle(op: str, xs, cu, do, dht, *, l2norm: bool) -> list[Tensor]:  # noqa: ANN001
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    q, k, v, g, beta, h0 = leaves
    if l2norm:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    G = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    o, ht = kernels.reference(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    ((o * do).sum() + (ht * dht).sum()).backward()
    return [x.grad for x in leaves] + [o.detach(), ht.detach()]


def _ours(op: str, backend: str, dtype: torch.dtype, xs, cu, do, dht, *, l2norm: bool) -> list[Tensor]:  # noqa: ANN001
    leaves = [x.detach().to(dtype).requires_grad_() for x in xs]
    o, ht = _entry(op)(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, backend=backend,
                       use_qk_l2norm_in_kernel=l2norm)
    ((o.double() * do).sum() + (ht.double() * dht).sum()).backward()
    return [x.grad for x in leaves] + [o.detach(), ht.detach()]


@pytest.mark.parametrize("OP", ["gdn", "kda"])
@pytest.mark.parametrize("H,HV", [(2, 4), (1, 4), (2, 2)], ids=["HV=2H", "HV=4H", "HV=H"])
@pytest.mark.parametrize("l2norm", [False, True], ids=["raw", "l2norm"])
@pytest.mark.parametrize("backend,dtype,tol", [("torch", torch.float32, TOL32), ("reference", torch.float64, 1e-10)],
                         ids=["torch", "reference"])
def test_grouped_heads_and_l2norm(OP: str, H: int, HV: int, l2norm: bool, backend: str, dtype: torch.dtype,
                                  tol: float) -> None:
    xs, cu, do, dht = _grouped(OP, H, HV)
    ref = _oracle(OP, xs, cu, do, dht, l2norm=l2norm)
    got = _ours(OP, backend, dtype, xs, cu, do, dht, l2norm=l2norm)
    for name, r, x in zip((*(f"d{n}" for n in NAMES), "o", "ht"), ref, got, strict=True):
        assert_rel_close(name, r, x, tol)


@pytest.mark.parametrize("OP", ["gdn", "kda"])
def test_forward_takes_grouped_heads_without_grad(OP: str) -> None:
    xs, cu, _, _ = _grouped(OP, 2, 4)
    ref = _oracle(OP, xs, cu, torch.zeros_like(xs[2]), torch.zeros_like(xs[5]), l2norm=False)
    o, ht = kernels.forward(OP, *(x.float() for x in xs[:5]), initial_state=xs[5].float(), output_final_state=True,
                            cu_seqlens=cu, backend="torch")
    assert o.grad_fn is None and o.shape == xs[2].shape
    assert_rel_close("o", ref[6], o, TOL32)
    assert_rel_close("ht", ref[7], ht, TOL32)


def _gdn_args(**over):  # noqa: ANN003, ANN202
    q, k, v, g, beta, _ = make_inputs("gdn", B=2, T=20, H=2, K=16, V=16)
    args = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "backend": "torch"}
    args.update(over)
    return args


BAD = [
    ("hv_not_multiple", _gdn_args(v=torch.randn(2, 20, 3, 16)), r"v.shape\[2\] \(value heads HV=3\) must be a positive multiple of k.shape\[2\] \(key heads H=2\)"),
    ("beta_heads", _gdn_args(v=torch.randn(2, 20, 4, 16), g=-torch.rand(2, 20, 4)), r"beta.shape\[2\] \(heads HV\) must equal v.shape\[2\]=4"),
    ("g_heads", _gdn_args(v=torch.randn(2, 20, 4, 16), beta=torch.rand(2, 20, 4)), r"g.shape\[2\] \(heads HV\) must equal v.shape\[2\]=4"),
    ("h0_heads", _gdn_args(v=torch.randn(2, 20, 4, 16), beta=torch.rand(2, 20, 4), g=-torch.rand(2, 20, 4),
                           initial_state=torch.randn(2, 2, 16, 16)), r"initial_state must have shape \[N, HV, K, V\] = \(2, 4, 16, 16\)"),
    ("unknown_kwarg", _gdn_args(headfirst=True), r"chunk_gdn got an unexpected argument headfirst=True"),
    ("l2norm_type", _gdn_args(use_qk_l2norm_in_kernel="yes"), r"use_qk_l2norm_in_kernel must be a bool, got 'yes'"),
    ("triton_fp64", _gdn_args(backend="triton", q=torch.randn(2, 20, 2, 16, dtype=torch.float64)), r"q.dtype must be one of"),
]


@pytest.mark.parametrize("args,match", [pytest.param(a, m, id=n) for n, a, m in BAD])
def test_chunk_invalid(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kernels.chunk_gdn(**args)


def test_fla_defaults_are_accepted() -> None:
    a = _gdn_args()
    o0, _ = kernels.chunk_gdn(**a)
    o1, _ = kernels.chunk_gdn(**a, chunk_size=64, use_gate_in_kernel=False, state_v_first=False, cp_context=None)
    assert torch.equal(o0, o1)


def _bwd_args(**over):  # noqa: ANN003, ANN202
    q, k, v, g, beta, cu = make_inputs("kda", (5, 70), H=2, K=16, V=8)
    args = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "do": torch.randn_like(v), "cu_seqlens": cu,
            "initial_state": make_state(2, 2, 16, 8), "dht": torch.randn(2, 2, 16, 8), "backend": "torch"}
    args.update(over)
    return args


BAD_BWD = [
    ("do_shape", _bwd_args(do=torch.randn(1, 75, 2, 4)), r"do must have the shape of o \[B, T, HV, V\] = \(1, 75, 2, 8\), got do.shape=\(1, 75, 2, 4\)"),
    ("do_dtype", _bwd_args(do=torch.randn(1, 75, 2, 8, dtype=torch.float64)), r"do.dtype must equal o's dtype \(q.dtype=torch.float32\), got torch.float64"),
    ("do_type", _bwd_args(do=None), r"do must be a torch.Tensor \(the gradient of o\), got NoneType"),
    ("dht_shape", _bwd_args(dht=torch.randn(1, 2, 16, 8)), r"dht must have the shape of the final state \[N, H, K, V\] = \(2, 2, 16, 8\)"),
    ("dht_dtype", _bwd_args(dht=torch.randn(2, 2, 16, 8).bfloat16()), r"dht.dtype must be torch.float32 \(the final state's dtype\), got torch.bfloat16"),
    ("backend", _bwd_args(backend="reference"), r"backend must be 'torch', 'triton' or 'auto' for the chunked backward"),
    ("h0_shape", _bwd_args(initial_state=torch.randn(3, 2, 16, 8)), r"initial_state must have shape \[N, H, K, V\] = \(2, 2, 16, 8\)"),
]


@pytest.mark.parametrize("args,match", [pytest.param(a, m, id=n) for n, a, m in BAD_BWD])
def test_backward_invalid(args: dict, match: str) -> None:
    a = dict(args)
    with pytest.raises(ValueError, match=match):
        kernels.backward("kda", a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), a.pop("do"), **a)
