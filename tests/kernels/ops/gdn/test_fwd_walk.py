"""GDN's warp-specialised TileLang forward walk (`kernels.ops.gdn.fwd_walk`).

On any machine: the refusals name their reason in one line; `LaunchPlan.fwd_pass` picks the pass (auto: Triton where
the walk is refused); the one-wave split fills the SMs once.
On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (bf16, K = V = 128, chunk 64): the kernel against its torch
mirror (`kernels.common.fwd_walk_torch.fwd_walk`, which CI checks against the per-token reference) on identical
inputs: three varlen sequences (37, 300, 5 tokens: partial and sub-chunk last chunks, whose loads run into the next
range) in two-chunk ranges and as whole sequences, grouped heads (Hk = 1, HV = 2), the programs in reverse order
through the program map, entering states per range; o, the final states and every chunk's entering state at value
blocks 64 and 128, relative L2 2e-2 (the kernel rounds its products' operands to bf16, the mirror does not).
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.chunk_state import SeqLayout
from kernels.common.fwd_walk_torch import fwd_walk
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.ops.gdn.fwd_walk import fwd_walk_refusal, fwd_walk_tilelang, fwd_walk_wanted, wave_seg_chunks
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state
from tests.utils.reverse_walk import forward_ranges, kept_for_walk

DIM, BT = 128, 64
WHY = fwd_walk_refusal(DIM, DIM, BT, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def test_refusals_name_their_reason() -> None:
    assert "forward walk takes K = V = 128 and chunk 64, got K=64" in str(fwd_walk_refusal(64, 128, 64, torch.device("cpu")))
    assert "got K=128 V=128 chunk=32" in str(fwd_walk_refusal(128, 128, 32, torch.device("cpu")))
    assert "runs on CUDA only, got cpu" in str(fwd_walk_refusal(128, 128, 64, torch.device("cpu")))
    k = torch.zeros(1, 64, 1, 64)
    with pytest.raises(ValueError, match="takes K = V = 128"):
        fwd_walk_tilelang(None, k, torch.zeros(1, 64, 1, 64), torch.zeros(1, 64, 1, 64), torch.zeros(1, 64, 1),
                          layout=SeqLayout(1))  # fmt: skip


def test_one_wave_split_fills_the_sms_once() -> None:
    def idx(B: int, T: int) -> ChunkIndex:
        return prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=BT, device=torch.device("cpu"))

    assert wave_seg_chunks(idx(1, 65536), H=16, sms=132) == 128  # 8 segments x 16 heads: 128 programs, one wave
    assert wave_seg_chunks(idx(1, 65536), H=32, sms=132) == 256  # 4 x 32
    assert wave_seg_chunks(idx(2, 32768), H=16, sms=132) == 128  # 2 sequences x 4 segments x 16 heads
    assert wave_seg_chunks(idx(1, 8192), H=16, sms=132) == 16
    assert wave_seg_chunks(idx(8, 8192), H=16, sms=132) is None  # 128 programs already
    assert wave_seg_chunks(idx(1, 512), H=16, sms=132) is None  # 8 chunks: segments of at least 8


def test_the_plan_picks_the_pass() -> None:
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    assert not fwd_walk_wanted(k, k, BT, LaunchPlan())  # auto: refused on the CPU, Triton runs
    assert not fwd_walk_wanted(k, k, BT, LaunchPlan(fwd_pass="triton"))
    with pytest.raises(ValueError, match=r"fwd_pass='tilelang'\): the TileLang forward walk runs on CUDA only"):
        fwd_walk_wanted(k, k, BT, LaunchPlan(fwd_pass="tilelang"))
    with pytest.raises(ValueError, match="LaunchPlan.fwd_pass must be one of auto, triton, tilelang, got 'cuda'"):
        LaunchPlan(fwd_pass="cuda")


@GPU
@pytest.mark.parametrize("BV", [64, 128])
@pytest.mark.parametrize("span", [2 * BT, 10**9], ids=["two-chunk-ranges", "whole-sequences"])
def test_kernel_matches_its_torch_mirror(span: int, BV: int) -> None:
    lengths, cu = (37, 300, 5), [0, 37, 337, 342]
    q, k, _, _, _, _ = make_inputs("gdn", lengths, H=1, K=DIM, V=DIM, dtype=torch.bfloat16, device="cuda")
    _, _, v, g, beta, _ = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-1.0, seed=3, dtype=torch.bfloat16,
                                      device="cuda")  # fmt: skip
    scale = DIM**-0.5
    h0 = make_state(3, 2, DIM, DIM, device="cuda")
    ag, gs, h, first = kept_for_walk(*(x.float() for x in (q, k, v, g, beta, h0)), cu, BT, scale)
    r = forward_ranges(cu, first, h, span, BT)
    ag, gs = ag.bfloat16(), gs.float()
    layout = SeqLayout(r["pmap"].numel(), r["cu"], r["co"], r["pmap"], r["fin"])
    got = fwd_walk_tilelang(q, k, v, ag, gs, layout=layout, scale=scale, h0=r["h0"], num_states=3,
                            output_final_state=True, num_chunks=h.shape[0], BV=BV)  # fmt: skip
    flat = [x[0].cpu() for x in (q, k, v, ag, gs)]
    cpu = {name: x.cpu() for name, x in r.items()}
    want = fwd_walk(*flat, scale=scale, num_states=3, num_chunks=h.shape[0], **cpu)
    for name, a, b in zip(("o", "ht", "h"), got, want, strict=True):
        assert a is not None and b is not None
        a = a[0] if name == "o" else a
        assert torch.isfinite(a).all(), name
        assert_rel_close(name, b.float().cpu(), a.float().cpu(), 2e-2)
