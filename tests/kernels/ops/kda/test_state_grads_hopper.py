"""The state products of KDA's chunk backward on TileLang (`kernels.ops.kda.state_grads_hopper`, a lab kernel: the
first half of the planned chunk-parallel KDA backward).

On any machine: the refusal names its reason in one line. On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15
(K = V = 128, chunk 64): dW (= dV), dAqk, dAg, dqg, dke, dkd and dG_C's state term of five chunks and two value heads
against the fp64 mirror (`kernels.ops.kda.reverse_bwd_torch.state_products`) on the same bf16 inputs (states, kept
gated tensors from `gated_factors` on random q, k, g, beta; Aqk NaN above its diagonal, which the Triton Ag pass
leaves unwritten and the kernel clears), relative L2 2e-2 (W, U, dU, dW rounded to bf16 between
the products, as the Triton backward's v_new and dv_new).
"""

from __future__ import annotations

import pytest
import torch

from kernels.ops.kda.reverse_bwd_torch import gated_factors, state_products
from kernels.ops.kda.state_grads_hopper import state_grads_hopper, state_grads_refusal
from tests.utils import TEST_DEVICE, assert_rel_close

K = V = 128
C, NT, HV = 64, 5, 2
WHY = state_grads_refusal(K, V, C, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def test_refusals_name_their_reason() -> None:
    assert "KDA state products takes K = V = 128 and chunk 64, got K=64" in str(
        state_grads_refusal(64, 128, 64, torch.device("cpu"))
    )
    z = torch.zeros(1, 1, K, V)
    with pytest.raises(ValueError, match="the TileLang KDA state products runs on CUDA only"):
        state_grads_hopper(z, z, *(torch.zeros(C, 1, n) for n in (V, V, C, C, K, K)), torch.zeros(1, 1, K))


@GPU
def test_kernel_matches_the_mirror() -> None:
    gen = torch.Generator().manual_seed(5)

    def r(*shape: int) -> torch.Tensor:  # bf16 values in fp64
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(torch.bfloat16).double()

    q, k = r(NT, HV, C, K), torch.nn.functional.normalize(r(NT, HV, C, K), dim=-1)
    g = -0.1 * torch.rand(NT, HV, C, K, generator=gen, dtype=torch.float64)
    beta = torch.rand(NT, HV, C, generator=gen, dtype=torch.float64)
    f = gated_factors(q, k, g, beta, K**-0.5)
    kept = {n: (f[n].to(torch.bfloat16).double() if n != "GC" else f[n]) for n in ("Ag", "Aqk", "qg", "ke", "kd", "GC")}
    S, dS, v, do = r(NT, HV, K, V), 0.1 * r(NT, HV, K, V), r(NT, HV, C, V), r(NT, HV, C, V)
    want = state_products(kept, v, S, do, dS)
    dgc = kept["GC"].exp() * (S * dS).sum(-1)

    def rows(t: torch.Tensor) -> torch.Tensor:  # [NT, HV, C, n] -> the kernel's [NT * C, HV, n], on the GPU
        return t.transpose(1, 2).reshape(NT * C, HV, -1).cuda()

    # Aqk above the diagonal as the Triton Ag pass leaves it (unwritten): NaN here, which the kernel must clear
    dirty = kept["Aqk"].masked_fill(torch.ones(C, C, dtype=torch.bool).triu(1), float("nan"))
    got = state_grads_hopper(S.cuda(), dS.cuda(), rows(v), rows(do), rows(kept["Ag"]), rows(dirty),
                             rows(kept["ke"]), rows(kept["kd"]), kept["GC"].cuda())  # fmt: skip
    for name in ("dW", "dAqk", "dAg", "dqg", "dke", "dkd"):
        ref = want[name].transpose(1, 2).reshape(NT * C, HV, -1)
        assert bool(torch.isfinite(got[name]).all()), name
        assert_rel_close(name, ref, got[name].double().cpu(), 2e-2)
    assert_rel_close("dGC", dgc, got["dGC"].double().cpu(), 2e-2)
