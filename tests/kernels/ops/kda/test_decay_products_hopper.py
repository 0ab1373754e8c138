"""KDA's per-key decayed products on TileLang (`kernels.ops.kda.decay_products_hopper`, a lab kernel: the building
block of the planned chunk-parallel KDA backward).

On any machine: the refusal names its reason in one line, bad shapes are refused in one line. On an H200 with
CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (K = 128, chunk 64): R and Cc of six chunks and two heads against the fp64
mirror (`kernels.ops.kda.reverse_bwd_torch.decayed_products_blocks`, itself equal to the elementwise products) on
the same inputs (a in bf16, as the backward's k and q), relative L2 1e-4 (the kernel's products take X and the scaled
operand in bf16 hi and lo parts: fp32 accuracy, which KDA's dg needs); weak gates (the fast chunk: midpoint references) and a key whose span across one block
passes FAST_SPAN in one chunk (that chunk's edges references and elementwise diagonal blocks).
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.decay import floor_gate
from kernels.ops.kda.decay_products_hopper import decay_products_hopper, decay_products_refusal
from kernels.ops.kda.reverse_bwd_torch import decayed_products_blocks
from tests.utils import TEST_DEVICE, assert_rel_close

K, C, NT, H = 128, 64, 6, 2
WHY = decay_products_refusal(K, C, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def test_refusals_name_their_reason() -> None:
    assert "KDA decayed products takes K = V = 128 and chunk 64, got K=64" in str(
        decay_products_refusal(64, 64, torch.device("cpu"))
    )
    X = torch.zeros(1, 1, C, C)
    with pytest.raises(ValueError, match="the TileLang KDA decayed products runs on CUDA only"):
        decay_products_hopper(X, torch.zeros(C, 1, K), torch.zeros(C, 1, K))


def _inputs(strong: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(NT, H, C, C, generator=gen, dtype=torch.float64).tril()
    a = torch.randn(NT * C, H, K, generator=gen, dtype=torch.float64).to(torch.bfloat16).double()
    g = -0.05 * torch.rand(NT, C, H, K, generator=gen, dtype=torch.float64)
    if strong:
        g[2, 20:24, 1, 5] = -40.0  # a span of 160 in block 1 of chunk 2: past FAST_SPAN there only
    G = floor_gate(g).cumsum(1).reshape(NT * C, H, K)
    return X, a, G


@GPU
@pytest.mark.parametrize("strong", [False, True], ids=["fast", "edges"])
def test_kernel_matches_the_mirror(strong: bool) -> None:
    X, a, G = _inputs(strong)
    # the mirror per chunk: [NT, H, C, K] views
    ac, Gc = (t.view(NT, C, H, K).transpose(1, 2) for t in (a, G))
    want = [t.transpose(1, 2).reshape(NT * C, H, K) for t in decayed_products_blocks(X, ac, Gc)]
    got = decay_products_hopper(X.cuda(), a.cuda(), G.cuda())
    for name, w, r in zip(("R", "Cc"), want, got, strict=True):
        assert bool(torch.isfinite(r).all()), name
        assert_rel_close(name, w, r.double().cpu(), 1e-4)
