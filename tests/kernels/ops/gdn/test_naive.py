"""GDN (scalar gate per head): torch backend and reference against each other, fp32, random inputs.

Scenarios (the dense/varlen grid shared with KDA is in common/test_chunk_torch.py): `auto` is torch on CPU; scale and
bf16 handling; varlen equals the dense runs; the reference's varlen semantics (== per-sequence dense runs); GDN's reference == KDA's reference with the gate
broadcast over K; dtype handling (bf16 in, bf16 out, fp32 state).
Tolerance 1e-5 relative L2: both sides are fp32, same math in another summation order (measured ~5e-7).
"""

from __future__ import annotations

import torch

import kernels
from kernels.ops.kda.naive import naive_recurrent_kda
from tests.utils import assert_rel_close, make_inputs, make_state

OP = "gdn"
TOL = 1e-5


def test_chunk_auto_is_torch_on_cpu_and_no_final_state() -> None:
    q, k, v, g, beta, cu = make_inputs(OP, (70, 30), H=2, K=16, V=32)
    o_auto, ht_auto = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu)
    o_torch, _ = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, backend="torch")
    assert ht_auto is None
    assert torch.equal(o_auto, o_torch)


def test_chunk_scale_and_dtype() -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=1, T=80, H=2, K=32, V=32, dtype=torch.bfloat16)
    h0 = make_state(1, 2, 32, 32)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, scale=0.3, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, scale=0.3, initial_state=h0, output_final_state=True, backend="torch")
    assert o.dtype == torch.bfloat16 and ht is not None and ht.dtype == torch.float32
    # both compute in fp32 from the same bf16 inputs; o differs by the final bf16 rounding (2^-8 relative at most)
    assert_rel_close("o", o_ref.float(), o.float(), 4e-3)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_chunk_varlen_equals_dense() -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=3, T=90, H=2, K=32, V=16)
    cu = torch.tensor([0, 90, 180, 270], dtype=torch.int64)
    flat = [x.reshape(1, 270, *x.shape[2:]) for x in (q, k, v, g, beta)]
    o_d, ht_d = kernels.forward(OP, q, k, v, g, beta, output_final_state=True, backend="torch")
    o_v, ht_v = kernels.forward(OP, *flat, cu_seqlens=cu, output_final_state=True, backend="torch")
    assert_rel_close("o", o_d.reshape(1, 270, 2, 16), o_v, 1e-6)
    assert_rel_close("ht", ht_d, ht_v, 1e-6)


def test_naive_varlen_is_per_sequence() -> None:
    lengths = (37, 100, 4)
    q, k, v, g, beta, cu = make_inputs(OP, lengths, H=2, K=16, V=16)
    h0 = make_state(3, 2, 16, 16)
    o, ht = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    bos = 0
    for n, L in enumerate(lengths):
        sl = [x[:, bos : bos + L] for x in (q, k, v, g, beta)]
        o_n, ht_n = kernels.reference(OP, *sl, initial_state=h0[n : n + 1], output_final_state=True)
        assert torch.allclose(o[:, bos : bos + L], o_n) and torch.allclose(ht[n : n + 1], ht_n)
        bos += L


def test_naive_matches_kda_with_broadcast_gate() -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=2, T=50, H=2, K=16, V=16)
    h0 = make_state(2, 2, 16, 16)
    o, ht = kernels.reference(OP, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_k, ht_k = naive_recurrent_kda(q, k, v, g[..., None].expand(*g.shape, 16), beta, initial_state=h0, output_final_state=True)
    assert_rel_close("o", o, o_k, 1e-6)
    assert_rel_close("ht", ht, ht_k, 1e-6)
