"""The torch mirror of GDN's TileLang forward walk (`kernels.common.fwd_walk_torch`) against the per-token reference, in
fp64 at 1e-9 relative L2: three varlen sequences (37, 300, 5 tokens; chunk 32: partial and sub-chunk last chunks),
grouped value heads (Hk = 1, HV = 2), initial states, walked
- in two-chunk ranges from each range's entering state (the kept chunk state there), the programs in reverse order
  through the program map: o, the final state of each sequence (stored by its last range through final_idx; the
  other ranges store nothing), and every chunk's entering state (store_h) against the torch Ag form's;
- as whole sequences from h0 (the plain pass).
Random inputs, never zeros; rows past a range's end read the next range's tokens, as the kernel's loads do.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.fwd_walk_torch import fwd_walk
from tests.utils import assert_rel_close, make_inputs, make_state
from tests.utils.reverse_walk import forward_ranges, kept_for_walk

C, K, V = 32, 16, 8
LENGTHS = (37, 300, 5)
CU = [0, 37, 337, 342]


@pytest.mark.parametrize("span", [2 * C, 10**9], ids=["two-chunk-ranges", "whole-sequences"])
def test_walk_matches_the_reference(span: int) -> None:
    q, k, _, _, _, cu = make_inputs("gdn", LENGTHS, H=1, K=K, V=V, dtype=torch.float64)
    _, _, v, g, beta, _ = make_inputs("gdn", LENGTHS, H=2, K=K, V=V, lb=-1.0, seed=3, dtype=torch.float64)
    g = g.double()
    scale = K**-0.5
    h0 = make_state(3, 2, K, V).double()
    o_ref, ht_ref = kernels.reference("gdn", q, k, v, g, beta, scale=scale, initial_state=h0,
                                      output_final_state=True, cu_seqlens=cu)  # fmt: skip
    ag, gs, h, first = kept_for_walk(q, k, v, g, beta, h0, CU, C, scale)
    r = forward_ranges(CU, first, h, span, C)
    flat = [x[0] for x in (q, k, v, ag, gs)]
    o, ht, hs = fwd_walk(*flat, cu=r["cu"], co=r["co"], pmap=r["pmap"], fin=r["fin"], scale=scale, h0=r["h0"],
                         num_states=3, num_chunks=h.shape[0])  # fmt: skip
    assert o is not None and ht is not None and hs is not None
    assert_rel_close("o", o_ref[0], o, 1e-9)
    assert_rel_close("ht", ht_ref, ht, 1e-9)
    assert_rel_close("h", h, hs, 1e-9)
    assert o.abs().min() >= 0 and o.abs().max() > 0.1 and ht.abs().max() > 0.1  # (not a walk over zeros)


def test_state_pass_alone_and_an_unstored_final_state() -> None:
    """Without q the walk forms no output; a program whose final_idx is -1 stores no final state."""
    q, k, _, _, _, _ = make_inputs("gdn", LENGTHS, H=1, K=K, V=V, dtype=torch.float64)
    _, _, v, g, beta, _ = make_inputs("gdn", LENGTHS, H=2, K=K, V=V, lb=-1.0, seed=4, dtype=torch.float64)
    g = g.double()
    h0 = make_state(3, 2, K, V).double()
    ag, gs, h, first = kept_for_walk(q, k, v, g, beta, h0, CU, C, K**-0.5)
    flat = [x[0] for x in (k, v, ag, gs)]
    o, ht, hs = fwd_walk(None, *flat, cu=torch.tensor(CU), co=torch.tensor(first), pmap=torch.arange(3),
                         fin=torch.tensor([0, -1, 1]), scale=1.0, h0=h0, num_states=2, num_chunks=h.shape[0])  # fmt: skip
    assert o is None and ht is not None and hs is not None
    assert_rel_close("h", h, hs, 1e-9)
    _, ht_ref = kernels.reference("gdn", q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  cu_seqlens=torch.tensor(CU))  # fmt: skip
    assert_rel_close("ht", ht_ref[[0, 2]], ht, 1e-9)
