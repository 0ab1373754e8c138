"""The torch mirror of KDA's TileLang Ag pass (`kernels.ops.kda.ag_torch.kda_ag_blocks`) against the fp64
triangular solve of the per-key decayed grams (`kda_ag_reference`), on the CPU:
- the decomposition itself (operands not rounded, fp64): Ag, Aqk and the gated keys qg, ke, kd, G_C equal the
  reference's to 1e-10, dense (a partial last chunk) and varlen, grouped value heads (HV = 2H), value head 0 strong
  (gates down to -20 per token and -1000 masks: every chunk takes the exact elementwise diagonal blocks) and the
  other heads weak (the midpoint references);
- the kernel's bf16 operands at K = 128: Ag within 2e-3 of the fp64 solve, Aqk within 1e-4 (its lo parts' products:
  bf16 operands alone leave about 2e-3 there, `benchmarks/results/kda_ag_precision_s28_cpu.md`);
- chunk 64 only, refused in one line otherwise;
- (session 33) the same with the kernel's lab build `chunk_ref` (one reference a key where the whole chunk spans
  under FAST_SPAN), and at spans just under it, where the products' entries above A's diagonal overflow fp32 in
  fp32: none of them reaches an output.
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.chunk_torch import from_chunks, last_rows, to_chunks
from kernels.common.index import prepare_chunk_index
from kernels.ops.kda.ag_torch import kda_ag_blocks, kda_ag_reference
from tests.kernels.ops.kda.test_wy_ag import kda_grouped_inputs
from tests.utils import assert_rel_close, make_inputs


def _gated_reference(q, k, G, index, scale):  # type: ignore[no-untyped-def]
    """(qg, ke, kd, gc) from the fp64 G: scale Q e^G, K e^G, K e^(G_C - G) with G_C the chunk's last valid row."""
    HV = G.shape[2]
    qh, kh = (x.double().repeat_interleave(HV // x.shape[2], 2) for x in (q, k))
    B, T = G.shape[:2]
    Gc = to_chunks(G, index, torch.float64)  # [NT, HV, C, K], padded rows repeat the last valid row's G
    gc = Gc.gather(2, last_rows(index, B, T, HV, G.device)[..., None].expand(-1, -1, 1, G.shape[-1]))
    GC = from_chunks(gc.expand_as(Gc), index, B, T)
    return scale * qh * G.exp(), kh * G.exp(), kh * (GC - G).exp(), gc[..., 0, :]


@pytest.mark.parametrize("chunk_ref", [False, True], ids=["blocks", "chunk_ref"])
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_the_decomposition_equals_the_solve(layout: str, chunk_ref: bool) -> None:
    q, k, v, g, beta, cu = kda_grouped_inputs(layout, torch.float64)
    B, T = v.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=64)
    scale = q.shape[-1] ** -0.5
    ag_ref, aqk_ref, G = kda_ag_reference(q, k, g, beta, index=index, scale=scale)
    ag, aqk, (qg, ke, kd, gc) = kda_ag_blocks(q, k, g, beta, index=index, scale=scale, dtype=torch.float64,
                                              operand=None, chunk_ref=chunk_ref)  # fmt: skip
    assert float(ag_ref.abs().amax()) > 0.5 and float(G.min()) < -300  # a nontrivial solve, the masks reached
    assert_rel_close("Ag", ag_ref, ag, 1e-10)
    assert_rel_close("Aqk", aqk_ref, aqk, 1e-10)
    for name, ref, got in zip(("qg", "ke", "kd", "gc"), _gated_reference(q, k, G, index, scale), (qg, ke, kd, gc),
                              strict=True):  # fmt: skip
        assert_rel_close(name, ref, got, 1e-10)


@pytest.mark.parametrize("chunk_ref", [False, True], ids=["blocks", "chunk_ref"])
@pytest.mark.parametrize("lb", [-1.0, -2.8, -5.0])
def test_bf16_operands_keep_aqk_at_fp32_accuracy(lb: float, chunk_ref: bool) -> None:
    """(lb -2.8: chunks spanning 80-100, the whole-chunk reference's factors near e^+-50 and its entries above the
    diagonal past fp32's range where the span passes ~89)"""
    q, k, v, g, beta, _ = make_inputs("kda", B=1, T=200, H=2, K=128, V=128, lb=lb, seed=11)
    index = prepare_chunk_index(None, batch=1, seq_len=200, chunk_size=64)
    q, k, beta = (x.bfloat16().float() for x in (q, k, beta))  # the kernel's inputs
    ag_ref, aqk_ref, G = kda_ag_reference(q, k, g, beta, index=index, scale=128**-0.5)
    ag, aqk, _ = kda_ag_blocks(q, k, g, beta, index=index, scale=128**-0.5, chunk_ref=chunk_ref)
    if lb == -2.8:  # (the case this lb is for: some chunk's keys span past 89 and every key under FAST_SPAN there)
        span = -to_chunks(G, index, torch.float64)[..., -1, :]  # [NT, HV, K]
        assert bool(((span.amax(-1) < 100) & (span.amax(-1) > 89)).any()), span.amax(-1)
    assert bool(torch.isfinite(ag).all() and torch.isfinite(aqk).all())
    assert_rel_close("Ag (bf16 operands)", ag_ref, ag, 2e-3)
    assert_rel_close("Aqk (bf16 hi and lo operands)", aqk_ref, aqk, 1e-4)


def test_chunk_64_only() -> None:
    q, k, v, g, beta, cu = kda_grouped_inputs("dense")
    index = prepare_chunk_index(cu, batch=1, seq_len=v.shape[1], chunk_size=32)
    with pytest.raises(ValueError, match="takes chunk 64, got 32"):
        kda_ag_blocks(q, k, g, beta, index=index, scale=1.0)
