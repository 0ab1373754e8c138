"""KDA's TileLang Ag pass (`kernels.ops.kda.ag_hopper`).

On any machine: the refusals name their reason in one line; `LaunchPlan.ag_pass` picks the pass (auto: the kernel
in bf16 where it runs, `KDA_AG_HOPPER_AUTO`; "tilelang" refuses fp16). Its decomposition's CPU mirror is tested in
tests/kernels/ops/kda/test_ag_torch.py. On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (bf16, K = V = 128,
chunk 64), through `wy_kda_ag` with `ag_pass="tilelang"` on inputs with a partial last chunk (dense) and varlen
(37, 300, 64, 5 tokens), grouped heads (H = 2, HV = 4), value head 0 strong (gates down to -20 per token and -1000
masks: the exact diagonal blocks) and weak heads, outputs NaN-poisoned before the call:
- Ag and Aqk against the fp64 solve on the same bf16 inputs (relative L2 1e-2, the Triton pass's bf16 bar) and
  against the mirror with the kernel's bf16 operands (4e-3: the outputs' bf16 rounding); exact zeros above Ag's
  diagonal;
- qg, ke, kd against the mirror (1e-2: bf16 outputs), G_C within 1e-5 of the mirror's;
- the decay-bound summary (L, W) within 1e-4 of the Triton pass's (its gated variant, the same inputs);
- (session 33) the exact lab build `chunk_ref` (one reference a key for a chunk whose every key spans under
  FAST_SPAN: the weak heads' chunks; the strong head's take the blocks' path) against the mirror (4e-3) and the
  default build (4e-3), its gated keys equal to the default's.
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.index import prepare_chunk_index
from kernels.ops.kda.ag_hopper import (
    KDA_AG_EXACT_SWITCHES,
    KDA_AG_HOPPER_AUTO,
    kda_ag_hopper,
    kda_ag_hopper_refusal,
    kda_ag_hopper_wanted,
)
from kernels.ops.kda.ag_torch import kda_ag_blocks, kda_ag_reference
from kernels.ops.kda.wy_ag import GatedKeys, gated_ag_plan, wy_kda_ag
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs

DIM, BT, H, HV = 128, 64, 2, 4
WHY = kda_ag_hopper_refusal(DIM, DIM, BT, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))
LAYOUTS = {"dense": {"B": 2, "T": 200}, "varlen": {"lengths": (37, 300, 64, 5)}}


def test_refusals_name_their_reason() -> None:
    assert "KDA Ag pass takes K = V = 128 and chunk 64, got K=64" in str(
        kda_ag_hopper_refusal(64, 128, 64, torch.device("cpu"))
    )
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    index = prepare_chunk_index(None, batch=1, seq_len=64, chunk_size=BT)
    with pytest.raises(ValueError, match="the TileLang KDA Ag pass runs on CUDA only"):
        kda_ag_hopper(k, k, torch.zeros(1, 64, 1, DIM), torch.zeros(1, 64, 1), scale=1.0, index=index)


def test_the_plan_picks_the_pass() -> None:
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    assert not kda_ag_hopper_wanted(k, BT, LaunchPlan(), None)  # auto: the kernel is refused on the CPU
    assert KDA_AG_HOPPER_AUTO and not kda_ag_hopper_wanted(k.half(), BT, LaunchPlan(), None)  # auto: bf16 only
    assert not kda_ag_hopper_wanted(k, BT, LaunchPlan(ag_pass="triton"), None)
    with pytest.raises(ValueError, match=r"ag_pass='tilelang'\): the TileLang KDA Ag pass runs on CUDA only"):
        kda_ag_hopper_wanted(k, BT, LaunchPlan(ag_pass="tilelang"), None)
    with pytest.raises(ValueError, match=r"ag_pass='tilelang'\): the TileLang KDA Ag pass takes bf16 q, k, got "):
        kda_ag_hopper_wanted(k.half(), BT, LaunchPlan(ag_pass="tilelang"), None)


def _inputs(layout: str):  # type: ignore[no-untyped-def]
    q, k, v, g, beta, cu = make_inputs("kda", H=HV, K=DIM, V=DIM, lb=-1.0, seed=9, device="cuda", **LAYOUTS[layout])
    g[:, :, 0] *= 20  # value head 0 strong: 16-row spans past FAST_SPAN
    g[:, 5::41, 0, ::3] = -1000.0
    q, k = (x[:, :, :H].bfloat16().contiguous() for x in (q, k))
    return q, k, v.bfloat16(), g, beta.bfloat16(), cu


def _rows_in_chunk(index, B: int, T: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Each token's position in its sequence, [B, T] on the GPU (its row in its chunk: % BT)."""
    if not index.is_varlen:
        return torch.arange(T, device="cuda").expand(B, T)
    starts = torch.repeat_interleave(index.cu_seqlens[:-1].long(), index.cu_seqlens.diff().long())
    return (torch.arange(T, device="cuda") - starts).view(B, T)


def _t_times_beta(tt: torch.Tensor, beta: torch.Tensor, index) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """T diag(beta) per chunk: row i of a chunk times beta of each column's token (the chunk's rows)."""
    B, T, HV, C = tt.shape
    rows = _rows_in_chunk(index, B, T)
    first = torch.arange(T, device="cuda").expand(B, T) - rows % C  # the chunk's first token
    cols = (first[..., None] + torch.arange(C, device="cuda")).clamp_max(T - 1)  # [B, T, C] (past the end: masked)
    bcol = torch.stack([beta[b][cols[b]] for b in range(B)])  # [B, T, C, HV]
    return tt.float() * bcol.permute(0, 1, 3, 2).float()


@GPU
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_matches_the_solve_the_mirror_and_the_triton_bound(layout: str) -> None:
    q, k, v, g, beta, cu = _inputs(layout)
    B, T = v.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=BT, device="cuda")
    scale = DIM**-0.5
    bnd = torch.full((index.num_chunks, HV, 2), float("nan"), device="cuda")
    ag, aqk, gated = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=LaunchPlan(ag_pass="tilelang"),
                               bnd=bnd, v=v, store_t=True)  # fmt: skip
    assert isinstance(gated, GatedKeys) and ag.dtype == aqk.dtype == gated.qg.dtype == torch.bfloat16
    assert gated.tt is not None  # T = (I + A)^-1: T diag(beta) is Ag, and Triton's `wy_inverse` forms the same T
    assert_rel_close("T diag(beta) vs Ag", ag.float(), _t_times_beta(gated.tt, beta, index), 1e-2)
    from kernels.common.chunk_bwd import wy_inverse

    kg, gcw = gated.kd.clone(), gated.gc.clone()  # (wy_inverse rewrites them with its own values)
    tt_ref = wy_inverse(k, g, beta, index=index, gate_vector=True, kg=kg, gc=gcw)
    rows = _rows_in_chunk(index, B, T)
    low = torch.arange(BT, device="cuda")[None, None, :] <= (rows % BT)[..., None]
    assert_rel_close("T vs wy_inverse", tt_ref.masked_fill(~low[:, :, None], 0).float(), gated.tt.float(), 1e-2)
    ag_ref, aqk_ref, _ = kda_ag_reference(q, k, g, beta, index=index, scale=scale)
    m_ag, m_aqk, (qg, ke, kd, gc) = kda_ag_blocks(q, k, g, beta, index=index, scale=scale)
    assert float(ag_ref.abs().amax()) > 0.5
    assert_rel_close("Ag vs the solve", ag_ref, ag, 1e-2)
    assert_rel_close("Aqk vs the solve", aqk_ref, aqk, 1e-2)
    assert_rel_close("Ag vs the mirror", m_ag, ag, 4e-3)
    assert_rel_close("Aqk vs the mirror", m_aqk, aqk, 4e-3)
    above = torch.arange(BT, device="cuda")[None, None, :] > (rows % BT)[..., None]
    assert bool((ag.permute(0, 1, 3, 2)[above] == 0).all()), "entries above Ag's diagonal must be written as 0"
    for name, ref, got in (("qg", qg, gated.qg), ("ke", ke, gated.ke), ("kd", kd, gated.kd)):
        assert_rel_close(name, ref, got, 1e-2)
    torch.testing.assert_close(gated.gc, gc.float(), rtol=1e-5, atol=1e-4)
    ref_bnd = torch.full_like(bnd, float("nan"))
    wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=gated_ag_plan(LaunchPlan(ag_pass="triton")), bnd=ref_bnd,
              v=v)  # fmt: skip
    torch.testing.assert_close(bnd, ref_bnd, rtol=1e-4, atol=1e-4)


@GPU
def test_the_two_kernel_forward_on_it_matches_the_reference() -> None:
    """KDA's two-kernel forward (fwd_path "fused") with the TileLang Ag pass, then the Triton gated pass or the TileLang
    walk (`fwd_pass`), against the fp32 per-token reference."""
    import kernels
    from kernels.ops.kda.chunk import chunk_kda_fwd

    q, k, v, g, beta, cu = _inputs("varlen")
    o_ref, ht_ref = kernels.reference("kda", q.float(), k.float(), v.float(), g, beta.float(), scale=DIM**-0.5,
                                      cu_seqlens=cu, output_final_state=True)  # fmt: skip
    for fwd_pass in ("triton", "tilelang"):  # the Triton gated pass, KDA's TileLang walk: the whole forward on TileLang
        for split in (0, 2):  # the plain pass, and the intra-device split
            plan = LaunchPlan(ag_pass="tilelang", fwd_pass=fwd_pass)
            o, ht = chunk_kda_fwd(q, k, v, g, beta, scale=DIM**-0.5, output_final_state=True, cu_seqlens=cu,
                                  split_chunks=split, plan=plan, fwd_path="fused")  # fmt: skip
            assert_rel_close(f"o, {fwd_pass} pass, split {split}", o_ref, o, 5e-3)
            assert_rel_close(f"final state, {fwd_pass} pass, split {split}", ht_ref, ht, 5e-3)


@GPU
@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("switch", sorted(KDA_AG_EXACT_SWITCHES))
def test_the_exact_lab_builds_match_the_mirror(layout: str, switch: str) -> None:
    q, k, v, g, beta, cu = _inputs(layout)
    B, T = v.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=BT, device="cuda")
    scale = DIM**-0.5
    got = kda_ag_hopper(q, k, g, beta, scale=scale, index=index, store_t=True, lab=frozenset({switch}))
    base = kda_ag_hopper(q, k, g, beta, scale=scale, index=index, store_t=True)
    m_ag, m_aqk, _ = kda_ag_blocks(q, k, g, beta, index=index, scale=scale)
    assert float(m_ag.abs().amax()) > 0.5
    for name, mirror, b, x in (("Ag", m_ag, base[0], got[0]), ("Aqk", m_aqk, base[1], got[1])):
        assert bool(torch.isfinite(x.float()).all()), name
        assert_rel_close(f"{name} ({switch}) vs the mirror", mirror, x, 4e-3)
        assert_rel_close(f"{name} ({switch}) vs the default build", b.float(), x.float(), 4e-3)
    for name, b, x in zip(("qg", "ke", "kd", "G_C"), base[2][:4], got[2][:4], strict=True):
        assert torch.equal(b, x), name  # (the gated keys do not depend on the products' references)
