"""`benchmarks/decay_products_lab.py` on any machine: its Triton kernel (the backward's `_rows_vec` / `_cols_vec`
tiles alone, interpreted on the CPU) gives the mirror's
decayed products (`decayed_products_blocks`) on the lab's inputs at 1e-5 relative L2 (fp32 products), at both of the
lab's key blocks, on the fast path and where a chunk's span passes FAST_SPAN: every side of the comparison computes
the same thing."""

from __future__ import annotations

import pytest
import torch

from kernels.ops.kda.reverse_bwd_torch import decayed_products_blocks
from tests.utils import TEST_DEVICE, assert_rel_close
from tests.utils.scripts import load_script

lab = load_script("decay_products_lab")


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the CPU plumbing test (the GPU runs the lab itself)")
@pytest.mark.parametrize("strong", [False, True], ids=["fast", "edges"])
@pytest.mark.parametrize("bk", [32, 64])
def test_the_triton_tiles_give_the_mirrors_products(bk: int, strong: bool) -> None:
    NT, H, C, K = 2, 1, lab.C, lab.K
    X, a, G = lab.inputs(NT, H, device="cpu")
    if strong:  # chunk 1, key 3: a span of 160 across block 1 (past FAST_SPAN: that chunk's edges and diagonal)
        G[C:, 0, 3] += torch.cat([torch.zeros(20), -40.0 * torch.arange(1, 5), -160.0 * torch.ones(C - 24)])
    got = lab.triton_products(X, a, G, bk)
    ac, Gc = (t.view(NT, C, H, K).transpose(1, 2).double() for t in (a, G))
    want = [t.transpose(1, 2).reshape(NT * C, H, K) for t in decayed_products_blocks(X.double(), ac, Gc)]
    for name, g, w in zip(("R", "Cc"), got, want, strict=True):
        assert float(w.abs().amax()) > 1.0  # random inputs, not zeros
        assert_rel_close(name, w, g.double(), 1e-5)
