"""The torch mirror of the TileLang forward walk (`kernels.common.fwd_walk_torch`) against the per-token references, in
fp64 at 1e-9 relative L2: three varlen sequences (37, 300, 5 tokens; chunk 32: partial and sub-chunk last chunks),
grouped value heads (Hk = 1, HV = 2), initial states, walked
- in two-chunk ranges from each range's entering state (the kept chunk state there), the programs in reverse order
  through the program map: o, the final state of each sequence (stored by its last range through final_idx; the
  other ranges store nothing), and every chunk's entering state (store_h) against the torch Ag form's;
- as whole sequences from h0 (the plain pass).
Random inputs, never zeros; rows past a range's end read the next range's tokens, as the kernel's loads do.
GDN's form (Ag and the gate cumsum from the torch Ag form), and KDA's gated form (qg, ke, kd, G_C, Ag, Aqk from the
chunked torch path, `tests.utils.kda_gated`; Aqk's entries above its diagonal NaN, as the Ag pass leaves them
unwritten) against `kernels.reference("kda")` at the same ranges, value head 0's gates strong (down to -20 per
token); and the gated form against the Triton pass it mirrors (`gdn_fused_state_output` with kd, PRE_GATED) on the
Triton gated Ag pass's outputs (interpreted, fp32, chunk 64, K = V = 16: 1e-5, their summation orders differ).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.fwd_walk_torch import fwd_walk
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state
from tests.utils.kda_gated import gated_for_walk
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


@pytest.mark.parametrize("span", [2 * C, 10**9], ids=["two-chunk-ranges", "whole-sequences"])
def test_gated_walk_matches_the_kda_reference(span: int) -> None:
    """KDA's gated form: o, the final states and every chunk's entering state at the ranges of GDN's test."""
    q, k, _, _, _, cu = make_inputs("kda", LENGTHS, H=1, K=K, V=V, dtype=torch.float64)
    _, _, v, g, beta, _ = make_inputs("kda", LENGTHS, H=2, K=K, V=V, lb=-0.5, seed=3, dtype=torch.float64)
    g = g.double()
    g[:, :, 0] *= 40
    scale = K**-0.5
    h0 = make_state(3, 2, K, V).double()
    o_ref, ht_ref = kernels.reference("kda", q, k, v, g, beta, scale=scale, initial_state=h0,
                                      output_final_state=True, cu_seqlens=cu)  # fmt: skip
    x = gated_for_walk(q, k, v, g, beta, h0, CU, C, scale)
    above = torch.ones(C, C, dtype=torch.bool).triu(1)[torch.arange(v.shape[1]) - _chunk_start(v.shape[1])]
    aqk = x["aqk"][0].masked_fill(above[:, None], float("nan"))  # (unwritten by the Ag pass)
    r = forward_ranges(CU, x["first"], x["h"], span, C)
    o, ht, hs = fwd_walk(x["qg"][0], x["ke"][0], v[0], x["ag"][0], x["gc"], cu=r["cu"], co=r["co"], pmap=r["pmap"],
                         fin=r["fin"], scale=float("nan"), h0=r["h0"], num_states=3, num_chunks=x["h"].shape[0],
                         aqk=aqk, kd=x["kd"][0])  # fmt: skip
    assert o is not None and ht is not None and hs is not None
    assert_rel_close("o", o_ref[0], o, 1e-9)
    assert_rel_close("ht", ht_ref, ht, 1e-9)
    assert_rel_close("h", x["h"], hs, 1e-9)
    assert o.abs().max() > 0.1 and ht.abs().max() > 0.1 and x["gc"][:, 0].min() < -20  # (no zeros; strong gates)


def _chunk_start(T: int) -> torch.Tensor:
    """Each token's first row of its chunk within its sequence (CU, chunk C), [T] int64."""
    t = torch.arange(T)
    bos = torch.tensor(CU)[torch.searchsorted(torch.tensor(CU), t, right=True) - 1]
    return bos + (t - bos) // C * C


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the interpreted Triton pass: CPU only (the GPU test is ops/kda's)")
def test_gated_walk_matches_the_triton_gated_pass() -> None:
    """The mirror on the Triton gated Ag pass's outputs (Aqk unwritten above its diagonal: NaN-poisoned) against the
    Triton fused pass on them (PRE_GATED, whole sequences from h0): o, the final states, and the state pass alone."""
    from kernels.common.index import prepare_chunk_index
    from kernels.common.seqsplit import whole_sequences
    from kernels.ops.gdn.fused import gdn_fused_state_output
    from kernels.ops.kda.wy_ag import GatedKeys, gated_ag_plan, wy_kda_ag

    dim, chunk = 16, 64
    q, k, _, _, _, cu = make_inputs("kda", LENGTHS, H=1, K=dim, V=dim)
    _, _, v, g, beta, _ = make_inputs("kda", LENGTHS, H=2, K=dim, V=dim, lb=-0.5, seed=3)
    g[:, :, 0] *= 40
    h0 = make_state(3, 2, dim, dim)
    index = prepare_chunk_index(cu, batch=1, seq_len=v.shape[1], chunk_size=chunk, device=v.device)
    ag, aqk, gated = wy_kda_ag(q, k, g, beta, scale=dim**-0.5, index=index, launch=gated_ag_plan())
    assert isinstance(gated, GatedKeys) and torch.isnan(aqk).any()
    o_tr, ht_tr = gdn_fused_state_output(gated.qg, gated.ke, v, ag, gated.gc, layout=whole_sequences(index), BT=chunk,
                                         h0=h0, output_final_state=True, aqk=aqk, kd=gated.kd)  # fmt: skip
    walk = {"cu": cu, "co": index.chunk_offsets, "pmap": torch.arange(3), "fin": torch.arange(3), "scale": 1.0,
            "h0": h0, "num_states": 3, "kd": gated.kd[0]}  # fmt: skip
    o, ht, _ = fwd_walk(gated.qg[0], gated.ke[0], v[0], ag[0], gated.gc, aqk=aqk[0], **walk)
    assert o is not None and o_tr is not None and ht is not None and ht_tr is not None
    assert_rel_close("o", o_tr[0], o, 1e-5)
    assert_rel_close("ht", ht_tr, ht, 1e-5)
    _, ht_state, _ = fwd_walk(None, gated.ke[0], v[0], ag[0], gated.gc, **walk)
    assert ht_state is not None
    assert_rel_close("ht (state only)", ht_tr, ht_state, 1e-5)
