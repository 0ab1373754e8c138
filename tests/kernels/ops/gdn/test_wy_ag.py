"""GDN's Ag pass (`kernels.ops.gdn.wy_ag.wy_gdn_ag`) on the Triton backend (interpreted on CPU; on a GPU with
CPBENCH_TEST_GPU=1), both row tilings (BR 16 and 64) and BR 16 with its code variants (two chunks a program, exp2,
the diagonal blocks' inverse by exact substitution):
- Ag = T diag(beta) and the gate cumsum against the fp64 triangular solve (`kernels.common.ag_torch.ag_reference`),
  dense and varlen (sequences not a multiple of the chunk, the lengths scaled with the chunk size), chunk sizes
  16/32/64, grouped value heads (HV = 2H),
  one strong head (gates down to -20 per token) and weak ones; the entries above the diagonal written as exact zeros
  (allocations are NaN-poisoned); fp32 at 1e-5 relative L2 on CPU (1e-2 on a GPU: tf32 products, as
  test_dispatch_triton.py), bf16 at 1e-2;
- the per-chunk decay-bound sums (`bnd`) equal `wy_gdn_fwd`'s on the same inputs (the reverse sums' q, k side, `rev`:
  tests/kernels/common/test_warm_bwd.py);
- end to end: o and the final state from the kernel's Ag through the torch chunk recurrence
  (`ag_chunk_forward`) against the fp32 per-token reference at the same tolerance;
- BR 64's block extraction from the 64x64 register tile (`_lower_blocks`) is a bitwise copy;
- bad arguments are refused with one line.
"""

from __future__ import annotations

import functools

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.common.ag_torch import ag_chunk_forward, ag_reference
from kernels.common.index import prepare_chunk_index
from kernels.configs import LaunchConfig
from kernels.ops.gdn.wy_ag import AG_VARIANTS, _lower_blocks, wy_gdn_ag
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_grouped_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
H, HV, DIM = 2, 4, 32  # key heads, value heads (HV = 2H), head dims
LENGTHS = (37, 130, 64)
LAYOUTS = {"dense": {"B": 2, "T": 100}, "varlen": {"lengths": LENGTHS}}  # at chunk 64 (smaller chunks: `_layout`)


def _plan(BR: int, variant: int | None = None) -> LaunchPlan:
    cfg = LaunchConfig(BK=32, num_warps=1 if BR == 16 else 4, BR=BR, VARIANT=variant)
    return LaunchPlan(configs={"wy_gdn_ag_fwd": cfg})


def _layout(layout: str, chunk: int) -> dict:
    """LAYOUTS with every length scaled by chunk / 64, rounded up: at chunks of 16 and 32 the same chunk structure (a
    sequence shorter than a chunk, one of whole chunks and a partial one, one of exactly one chunk; dense T with a
    partial last chunk) in the programs of chunk 64, since the interpreter's time grows with the programs."""
    scaled = {name: -(-n * chunk // 64) if name == "T" else n for name, n in LAYOUTS[layout].items() if name != "lengths"}
    if layout == "varlen":
        scaled["lengths"] = tuple(-(-n * chunk // 64) for n in LENGTHS)
    return scaled


def _case(layout: str, chunk: int, dtype: torch.dtype = torch.float32):
    q, k, v, g, beta, cu = make_grouped_inputs(H, HV, DIM, dtype=dtype, device=DEVICE, **_layout(layout, chunk))
    index = prepare_chunk_index(cu, batch=v.shape[0], seq_len=v.shape[1], chunk_size=chunk, device=DEVICE)
    return q, k, v, g, beta, cu, index


@functools.cache
def _ag(layout: str, chunk: int, BR: int, variant: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass's (Ag, gcum) on `_case(layout, chunk)` with the BR tiling and code variant: computed once (the
    interpreter takes seconds), read by the solve test and the end-to-end test of the same case (read-only)."""
    _, k, _, g, beta, _, index = _case(layout, chunk)
    return wy_gdn_ag(k, g, beta, index=index, launch=_plan(BR, variant))


def _positions(index, B: int, T: int) -> torch.Tensor:
    """Each token's row within its chunk, [B, T] int64 (host)."""
    bounds = index.cu_seqlens_cpu
    pos = torch.empty(B * T, dtype=torch.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        pos[a:b] = torch.arange(b - a) % index.chunk_size
    return pos.view(B, T)


# BR 16 with two chunks per program, exp2 and the exact inverse (AG_VARIANTS): odd chunk counts (dense at 16, varlen at
# 64) run the last chunk twice; the default inverse (tf32 product form) in the BR16 and BR64 rows
VARIANTS = AG_VARIANTS["two_chunks"] | AG_VARIANTS["exp2"] | AG_VARIANTS["exact_inverse"]


@pytest.mark.parametrize(("BR", "variant"), [(16, None), (64, None), (16, VARIANTS)],
                         ids=["BR16", "BR64", "BR16-two_chunks-exp2-exact"])  # fmt: skip
@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_ag_matches_the_triangular_solve(BR: int, variant: int | None, chunk: int, layout: str) -> None:
    _, k, _, g, beta, _, index = _case(layout, chunk)
    ag, gcum = _ag(layout, chunk, BR, variant)
    ag_ref, g_ref = ag_reference(
        k.cpu(),
        g.cpu(),
        beta.cpu(),
        index=prepare_chunk_index(
            None if not index.is_varlen else index.cu_seqlens.cpu(), batch=k.shape[0], seq_len=k.shape[1], chunk_size=chunk
        ),
    )
    B, T = k.shape[:2]
    assert ag.shape == (B, T, HV, chunk) and ag.dtype == k.dtype and gcum.dtype == torch.float32
    above = torch.arange(chunk)[None, None, :] > _positions(index, B, T)[..., None]  # [B, T, chunk]
    assert bool((ag.cpu().permute(0, 1, 3, 2)[above] == 0).all()), "entries above the diagonal must be written as 0"
    assert float(ag_ref.abs().max()) > 0.5 and float(g_ref.min()) < -100  # nontrivial Ag, a strong head
    assert_rel_close("Ag", ag_ref, ag.cpu(), TOL)
    torch.testing.assert_close(gcum.cpu().double(), g_ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("BR", [16, 64])
def test_ag_in_bf16(BR: int) -> None:
    _, k, _, g, beta, cu, index = _case("varlen", 64, torch.bfloat16)
    ag, _ = wy_gdn_ag(k, g, beta, index=index, launch=_plan(BR))
    ag_ref, _ = ag_reference(k.cpu(), g.cpu(), beta.cpu(), index=prepare_chunk_index(cu.cpu(), batch=1, seq_len=k.shape[1]))
    assert ag.dtype == torch.bfloat16
    assert_rel_close("Ag bf16", ag_ref, ag.cpu(), 1e-2)


@pytest.mark.parametrize("BR", [16, 64])
def test_chunk_bounds_equal_the_wy_pass(BR: int) -> None:
    from kernels.common.wy import wy_gdn_fwd

    _, k, v, g, beta, _, index = _case("varlen", 64)
    beta[:, 37:101] = 0.0  # a chunk that writes nothing: W = -inf
    bnd = torch.empty(index.num_chunks, HV, 2, device=DEVICE)
    wy_gdn_ag(k, g, beta, index=index, launch=_plan(BR), bnd=bnd, v=v)
    ref = torch.empty_like(bnd)
    wy_gdn_fwd(None, k.repeat_interleave(HV // H, 2), v, g, beta, scale=1.0, index=index, bnd=ref)
    assert bool(torch.isinf(ref[:, :, 1]).any()) and bool(torch.isfinite(ref[:, :, 0]).all())
    torch.testing.assert_close(bnd, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("BR", [16, 64])
@pytest.mark.parametrize(("layout", "chunk"), [("varlen", 64), ("dense", 32)])
def test_output_through_the_chunk_recurrence_matches_the_reference(BR: int, layout: str, chunk: int) -> None:
    q, k, v, g, beta, cu, index = _case(layout, chunk)
    h0 = make_state(index.num_seqs, HV, DIM, DIM, device=DEVICE)
    ag, gcum = _ag(layout, chunk, BR)
    o, ht = ag_chunk_forward(q, k, v, ag, gcum, scale=DIM**-0.5, index=index, initial_state=h0)
    o_ref, ht_ref = kernels.reference(
        "gdn", q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    assert ht_ref is not None
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("final state", ht_ref, ht, TOL)


def test_bad_arguments_are_refused() -> None:
    _, k, v, g, beta, _, index = _case("dense", 64)
    bnd = torch.empty(index.num_chunks, HV, 2, device=DEVICE)
    with pytest.raises(ValueError, match="bnd needs v"):
        wy_gdn_ag(k, g, beta, index=index, bnd=bnd)
    with pytest.raises(ValueError, match="BR must be one of"):
        wy_gdn_ag(k, g, beta, index=index, launch=_plan(32))
    with pytest.raises(ValueError, match="unknown VARIANT bits 8"):
        wy_gdn_ag(k, g, beta, index=index, launch=_plan(16, 8))
    with pytest.raises(ValueError, match="HV a multiple"):
        wy_gdn_ag(k, g[:, :, :3], beta[:, :, :3], index=index)
    rev = (torch.empty(g.shape, device=DEVICE), bnd)
    with pytest.raises(ValueError, match="rev needs q"):
        wy_gdn_ag(k, g, beta, index=index, rev=rev)
    with pytest.raises(ValueError, match="rev needs q"):
        wy_gdn_ag(k, g, beta, index=index, rev=(rev[0][:, :-1], bnd), q=torch.empty_like(k))


@triton.jit
def _lower_blocks_kernel(x, y):
    """The 10 blocks of `_lower_blocks` of the 64x64 tile x, stored one after the other into y [10, 16, 16]."""
    o = tl.arange(0, 64)
    X00, X10, X11, X20, X21, X22, X30, X31, X32, X33 = _lower_blocks(tl.load(x + o[:, None] * 64 + o[None, :]))
    o16 = tl.arange(0, 16)
    p = y + o16[:, None] * 16 + o16[None, :]
    tl.store(p, X00)
    tl.store(p + 256, X10)
    tl.store(p + 512, X11)
    tl.store(p + 768, X20)
    tl.store(p + 1024, X21)
    tl.store(p + 1280, X22)
    tl.store(p + 1536, X30)
    tl.store(p + 1792, X31)
    tl.store(p + 2048, X32)
    tl.store(p + 2304, X33)


def test_the_64_row_tile_is_split_into_its_lower_blocks_exactly() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    y = torch.empty(10, 16, 16, device=DEVICE)
    _lower_blocks_kernel[(1,)](x, y)
    blocks = [(i, j) for i in range(4) for j in range(i + 1)]
    for n, (i, j) in enumerate(blocks):
        assert torch.equal(y[n], x[16 * i : 16 * i + 16, 16 * j : 16 * j + 16]), (i, j)
