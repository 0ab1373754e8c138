"""KDA (gate per key dim): torch backend and reference against each other, fp32, random inputs.

Scenarios (the dense/varlen grid shared with GDN is in common/test_chunk_torch.py): strong decay (lb = -5: per-key gates whose chunk cumsums reach
-320, where exp(G_i) exp(-G_j) factorisations overflow); bf16 inputs.
Tolerance 1e-5 relative L2: both sides are fp32, same math in another summation order (measured ~5e-7).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.utils import assert_rel_close, make_inputs, make_state

OP = "kda"
TOL = 1e-5


@pytest.mark.parametrize("lb", [-0.05, -5.0], ids=["weak_decay", "strong_decay"])
def test_chunk_decay_range(lb: float) -> None:
    q, k, v, g, beta, cu = make_inputs(OP, (150, 20), H=2, K=32, V=16, lb=lb)
    h0 = make_state(2, 2, 32, 16)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True, backend="torch")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_chunk_gate_per_key_matters() -> None:
    # guards against a path that would silently use one gate per head: a per-key gate must change the result
    q, k, v, g, beta, _ = make_inputs(OP, B=1, T=70, H=2, K=16, V=16)
    o, _ = kernels.forward(OP, q, k, v, g, beta, backend="torch")
    o_mean, _ = kernels.forward(OP, q, k, v, g.mean(-1, keepdim=True).expand_as(g), beta, backend="torch")
    o_gdn, _ = kernels.forward("gdn", q, k, v, g.mean(-1), beta, backend="torch")
    assert_rel_close("o(mean gate) vs gdn", o_gdn, o_mean, 1e-5)
    assert not torch.allclose(o, o_mean, rtol=1e-3, atol=1e-4)


def test_chunk_bf16() -> None:
    q, k, v, g, beta, cu = make_inputs(OP, (90, 40), H=2, K=32, V=32, dtype=torch.bfloat16)
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, backend="torch")
    assert o.dtype == torch.bfloat16 and ht is not None and ht.dtype == torch.float32
    # same bf16 inputs, fp32 compute on both sides; o differs by its final bf16 rounding only
    assert_rel_close("o", o_ref.float(), o.float(), 4e-3)
    assert_rel_close("ht", ht_ref, ht, TOL)
