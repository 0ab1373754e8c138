"""`kernels.common.bwd_tiles.group_sum`: the per-value-head dq, dk summed over each key head's group, on random
inputs: unchanged without groups; groups of two (one elementwise add) and of four (torch's sum) equal to the fp32 sum
of the group rounded once to the input's dtype, bitwise, in bf16 and fp32; contiguous `[B, T, Hk, K]`."""

from __future__ import annotations

import pytest
import torch

from kernels.common.bwd_tiles import group_sum
from tests.utils import TEST_DEVICE


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("G", [1, 2, 4])
def test_group_sum_is_the_groups_fp32_sum_rounded_once(G: int, dtype: torch.dtype) -> None:
    Hk, K = 3, 32
    x = torch.randn(2, 37, Hk * G, K, generator=torch.Generator().manual_seed(G)).to(TEST_DEVICE, dtype)
    got = group_sum(x, Hk)
    if G == 1:
        assert got is x
        return
    want = x.view(2, 37, Hk, G, K).float().sum(3).to(dtype)
    assert got.shape == (2, 37, Hk, K) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(got, want)
