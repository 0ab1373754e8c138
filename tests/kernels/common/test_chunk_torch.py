"""GDN and KDA: the torch backend against the fp32 reference on dense batches (T a multiple of 64 and not) and on
varlen batches (lengths not multiples of 64, a 1-token sequence, several sequences), with and without an initial
state. The op-specific cases are in ops/gdn/test_naive.py and ops/kda/test_naive.py.
Tolerance 1e-5 relative L2: both sides are fp32, same math in another summation order (measured ~5e-7).
"""

from __future__ import annotations

import pytest

import kernels
from tests.utils import assert_rel_close, make_inputs, make_state

TOL = 1e-5
LENGTHS = [(63,), (37, 100, 4, 89), (1, 130), (64, 128)]

pytestmark = pytest.mark.parametrize("OP", ["gdn", "kda"])


@pytest.mark.parametrize("B,T", [(1, 64), (2, 100), (3, 37)], ids=lambda x: str(x))
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_chunk(OP: str, B: int, T: int, with_h0: bool) -> None:
    q, k, v, g, beta, _ = make_inputs(OP, B=B, T=T, H=2, K=32, V=16)
    h0 = make_state(B, 2, 32, 16) if with_h0 else None
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, initial_state=h0, output_final_state=True, backend="torch")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


@pytest.mark.parametrize("lengths", [pytest.param(c, id="lens-" + "-".join(map(str, c))) for c in LENGTHS])
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_chunk_varlen(OP: str, lengths: tuple[int, ...], with_h0: bool) -> None:
    q, k, v, g, beta, cu = make_inputs(OP, lengths, H=2, K=32, V=32, lb=-3.0)
    h0 = make_state(len(lengths), 2, 32, 32) if with_h0 else None
    o_ref, ht_ref = kernels.reference(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    o, ht = kernels.forward(OP, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True, backend="torch")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
