"""KDA's Ag pass (`kernels.ops.kda.wy_ag.wy_kda_ag`) on the Triton backend (interpreted on CPU; on a GPU with
CPBENCH_TEST_GPU=1):
- Ag = T diag(beta), Aqk (on and below the diagonal) and the per-key gate cumsum against an fp64 torch triangular
  solve of the per-key decayed grams (`kernels.ops.kda.ag_torch.kda_ag_reference`), varlen at chunk 64 and dense at chunk 32 (sequences not a
  multiple of the chunk), grouped value heads (HV = 2H); value head 0 strong (gates down to -20 per token: spans past
  FAST_SPAN, the elementwise diagonal blocks) with -1000 masks on a few tokens, the other heads weak (the
  tensor-core diagonal blocks); the entries above Ag's diagonal written as exact zeros; fp32 at 1e-5 relative L2 on
  CPU (1e-2 on a GPU: tf32 products), bf16 at 1e-2;
- the per-chunk decay-bound sums (`bnd`) equal `wy_kda_fwd`'s on the same inputs;
- the `gated` variant: the same Ag and Aqk, and qg, ke, kd, G_C against the fp64 G (the same inputs and layouts);
  with store_t T itself: unit diagonal, zeros above, T diag(beta) = Ag;
- bad arguments are refused with one line.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.ops.kda.ag_torch import kda_ag_reference
from kernels.ops.kda.wy_ag import WY_KDA_AG_FWD, GatedKeys, gated_ag_plan, wy_kda_ag
from kernels.plan import default_plan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
H, HV, DIM = 1, 2, 16  # key heads, value heads (HV = 2H), head dims
LAYOUTS = {"dense": {"B": 1, "T": 70}, "varlen": {"lengths": (37, 90)}}
MASKED = (5, 50, 66)  # tokens whose gate is -1000 on value head 0 (a mask)


def kda_grouped_inputs(layout: str, dtype: torch.dtype = torch.float32, lb: float = -0.5):
    """KDA inputs (`make_inputs`), q, k with H heads, v, g, beta with HV; value head 0's gates times 40 (down to -20
    per token) and -1000 at MASKED, the other heads weak."""
    q, k, v, g, beta, cu = make_inputs("kda", H=HV, K=DIM, V=DIM, lb=lb, seed=5, dtype=dtype, device=DEVICE,
                                       **LAYOUTS[layout])  # fmt: skip
    g[:, :, 0] *= 40
    g[:, list(MASKED), 0, ::3] = -1000.0
    return q[:, :, :H].contiguous(), k[:, :, :H].contiguous(), v, g, beta, cu


def _index(cu: Tensor | None, v: Tensor, chunk: int) -> ChunkIndex:
    return prepare_chunk_index(cu, batch=v.shape[0], seq_len=v.shape[1], chunk_size=chunk, device=v.device)


def _row_in_chunk(index: ChunkIndex, B: int, T: int) -> Tensor:
    """Each token's row within its chunk, [B, T] int64 (host)."""
    bounds = index.cu_seqlens_cpu
    pos = torch.empty(B * T, dtype=torch.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        pos[a:b] = torch.arange(b - a) % index.chunk_size
    return pos.view(B, T)


@pytest.mark.parametrize(("layout", "chunk"), [("varlen", 64), ("dense", 32)])
def test_ag_aqk_and_gate_match_the_triangular_solve(layout: str, chunk: int) -> None:
    q, k, v, g, beta, cu = kda_grouped_inputs(layout)
    index = _index(cu, v, chunk)
    ag, aqk, gcum = wy_kda_ag(q, k, g, beta, scale=DIM**-0.5, index=index)
    ag_ref, aqk_ref, g_ref = kda_ag_reference(q, k, g, beta, index=index, scale=DIM**-0.5)
    B, T = v.shape[:2]
    assert ag.shape == aqk.shape == (B, T, HV, chunk) and ag.dtype == aqk.dtype == k.dtype
    assert gcum.shape == g.shape and gcum.dtype == torch.float32
    above = (torch.arange(chunk)[None, None, :] > _row_in_chunk(index, B, T)[..., None]).to(DEVICE)  # [B, T, chunk]
    assert bool((ag.permute(0, 1, 3, 2)[above] == 0).all()), "entries above Ag's diagonal must be written as 0"
    assert float(ag_ref.abs().max()) > 0.5 and float(g_ref.min()) < -300  # nontrivial Ag, strong head, masks (floored)
    assert_rel_close("Ag", ag_ref, ag, TOL)
    assert_rel_close("Aqk", aqk_ref, aqk.masked_fill(above[:, :, None], 0.0), TOL)
    torch.testing.assert_close(gcum.double(), g_ref, rtol=1e-6, atol=1e-3)


def test_ag_in_bf16() -> None:
    q, k, v, g, beta, cu = kda_grouped_inputs("varlen", torch.bfloat16)
    index = _index(cu, v, 64)
    ag, aqk, _ = wy_kda_ag(q, k, g, beta, scale=DIM**-0.5, index=index)
    ag_ref, aqk_ref, _ = kda_ag_reference(q, k, g, beta, index=index, scale=DIM**-0.5)
    above = (torch.arange(64)[None, None, :] > _row_in_chunk(index, *v.shape[:2])[..., None]).to(DEVICE)
    assert ag.dtype == aqk.dtype == torch.bfloat16
    assert_rel_close("Ag bf16", ag_ref, ag, 1e-2)
    assert_rel_close("Aqk bf16", aqk_ref, aqk.masked_fill(above[:, :, None], 0.0), 1e-2)


def test_chunk_bounds_equal_the_wy_pass() -> None:
    from kernels.common.wy import wy_kda_fwd

    q, k, v, g, beta, cu = kda_grouped_inputs("varlen")
    index = _index(cu, v, 64)
    beta[:, 37:101] = 0.0  # a chunk that writes nothing: W = -inf
    bnd = torch.empty(index.num_chunks, HV, 2, device=DEVICE)
    wy_kda_ag(q, k, g, beta, scale=1.0, index=index, bnd=bnd, v=v)
    ref = torch.empty_like(bnd)
    wy_kda_fwd(None, k, v, g, beta, scale=1.0, index=index, bnd=ref)
    assert bool(torch.isinf(ref[:, :, 1]).any()) and bool(torch.isfinite(ref[:, :, 0]).all())
    torch.testing.assert_close(bnd, ref, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_refused() -> None:
    q, k, v, g, beta, cu = kda_grouped_inputs("dense")
    index = _index(cu, v, 64)
    with pytest.raises(ValueError, match="bnd needs v"):
        wy_kda_ag(q, k, g, beta, scale=1.0, index=index, bnd=torch.empty(index.num_chunks, HV, 2, device=DEVICE))
    with pytest.raises(ValueError, match="HV a multiple"):
        wy_kda_ag(q, k, g[..., 0], beta, scale=1.0, index=index)
    with pytest.raises(ValueError, match="chunk_size must be one of"):
        wy_kda_ag(q, k, g, beta, scale=1.0, index=_index(cu, v, 128))


@pytest.mark.parametrize(("layout", "chunk"), [("varlen", 64), ("dense", 32)])
def test_gated_variant_stores_the_gated_keys(layout: str, chunk: int) -> None:
    """The `gated` variant (KDA_AG_VARIANTS): the same Ag and Aqk, and instead of G the gated qg = scale Q exp(G),
    ke = K exp(G), kd = K exp(G_C - G) and G_C per chunk, against the fp64 G (strong head 0 with masks: exps that
    underflow are 0)."""
    q, k, v, g, beta, cu = kda_grouped_inputs(layout)
    index = _index(cu, v, chunk)
    scale = DIM**-0.5
    ag0, aqk0, _ = wy_kda_ag(q, k, g, beta, scale=scale, index=index)
    ag, aqk, gated = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=gated_ag_plan())
    assert isinstance(gated, GatedKeys)
    torch.testing.assert_close(ag, ag0, rtol=0, atol=0)
    B, T = v.shape[:2]
    above = (torch.arange(chunk)[None, None, :] > _row_in_chunk(index, B, T)[..., None]).to(DEVICE)[:, :, None]
    torch.testing.assert_close(aqk.masked_fill(above, 0.0), aqk0.masked_fill(above, 0.0), rtol=0, atol=0)  # not above
    G = kda_ag_reference(q, k, g, beta, index=index, scale=scale)[2]  # [B, T, HV, K] fp64
    seqs = list(zip(index.cu_seqlens_cpu[:-1], index.cu_seqlens_cpu[1:], strict=True))
    last = [min(a + (c + 1) * chunk, b) - 1 for a, b in seqs for c in range(-(-(b - a) // chunk))]  # each chunk's last row
    gc_ref = G.reshape(B * T, HV, DIM)[last]  # [NT_total, HV, K]
    tok_chunk = torch.cat([index.chunk_offsets_cpu[n] + torch.arange(b - a) // chunk for n, (a, b) in enumerate(seqs)])
    Gc = gc_ref[tok_chunk.to(DEVICE)].view(B, T, HV, DIM)  # G_C of each token's chunk
    qh, kh = (x.double().repeat_interleave(HV // H, 2) for x in (q, k))
    assert gated.gc.shape == (index.num_chunks, HV, DIM) and gated.gc.dtype == torch.float32
    torch.testing.assert_close(gated.gc.double(), gc_ref, rtol=1e-6, atol=1e-3)
    assert_rel_close("qg", scale * qh * G.exp(), gated.qg, TOL)
    assert_rel_close("ke", kh * G.exp(), gated.ke, TOL)
    assert_rel_close("kd", kh * (Gc - G).exp(), gated.kd, TOL)
    assert float((Gc - G).max()) <= 1e-9 and float(G.min()) < -300  # every factor <= 1, the masks reached
    # store_t: T = (I + A)^-1 itself (the backward from Ag's, no `wy_inverse`): unit diagonal, zeros above it, and
    # Ag = T diag(beta) column by column (beta of the token the column stands for)
    ag_t, _, gated_t = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=gated_ag_plan(), store_t=True)
    assert isinstance(gated_t, GatedKeys) and gated_t.tt is not None and gated.tt is None
    torch.testing.assert_close(ag_t, ag, rtol=0, atol=0)
    r = _row_in_chunk(index, B, T).to(DEVICE)  # [B, T]
    cols = torch.arange(chunk, device=DEVICE)
    tok = (torch.arange(T, device=DEVICE)[None, :, None] - r[..., None] + cols).clamp(0, T - 1)  # [B, T, C]
    bcol = beta[torch.arange(B, device=DEVICE)[:, None, None], tok].permute(0, 1, 3, 2).float()  # [B, T, HV, C]
    tt = gated_t.tt.float()
    assert bool((tt.masked_fill(above, 0.0) == tt).all())  # zeros above the diagonal
    diag = tt.gather(3, r[:, :, None, None].expand(B, T, HV, 1))
    torch.testing.assert_close(diag, torch.ones_like(diag), rtol=0, atol=0)
    assert_rel_close("T diag(beta)", ag.float(), tt * bcol, TOL)
    with pytest.raises(ValueError, match="unknown VARIANT bits"):
        wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=default_plan().with_configs(
            {"wy_kda_ag_fwd": dataclasses.replace(WY_KDA_AG_FWD.default, VARIANT=2)}))  # fmt: skip
