"""The state products of KDA's chunk backward on TileLang (`kernels.ops.kda.state_grads_hopper`, a lab kernel: the
first half of the planned chunk-parallel KDA backward).

On any machine: the refusal names its reason in one line. On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15
(K = V = 128, chunk 64): dW (= dV), dAqk, dAg, dqg, dke, dkd and dG_C's state term of five chunks and two value heads
against the fp64 mirror (`kernels.ops.kda.reverse_bwd_torch.state_products`) on the same bf16 inputs (states, kept
gated tensors from `gated_factors` on random q, k, g, beta; Aqk NaN above its diagonal, which the Triton Ag pass
leaves unwritten and the kernel clears), relative L2 2e-2; the dense build and (session 31) the varlen build, three
sequences whose partial chunks it reads past their end (the next chunk's rows, which it must clear) (W, U, dU, dW rounded to bf16 between
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


# (session 31) the varlen build's layout: three sequences of 100, 37 and 113 tokens, five chunks, three of them partial:
# each chunk's (first row, rows); the kernel reads 64 rows from the first, the rest another chunk's, which it must clear
SPANS = ((0, 64), (64, 36), (100, 37), (137, 64), (201, 49))
CU, CI = (0, 100, 137, 250), ((0, 0), (0, 1), (1, 0), (2, 0), (2, 1))


def lay(t: torch.Tensor, varlen: bool) -> torch.Tensor:
    """Chunk tensors [NT, HV, C, ..] -> the kernels' rows [N, HV, ..] on the GPU (varlen: each chunk's valid rows)."""
    if not varlen:
        return t.transpose(1, 2).reshape(NT * C, *t.shape[1:2], *t.shape[3:]).cuda()
    out = t.new_zeros(CU[-1], *t.shape[1:2], *t.shape[3:])
    for c, (t0, n) in enumerate(SPANS):
        out[t0 : t0 + n] = t[c].transpose(0, 1)[:n]
    return out.cuda()


def valid(NTr: int, varlen: bool) -> torch.Tensor:
    """[NT, 1, C, 1] 1 on a chunk's rows in its sequence, 0 past its end (every row without varlen)."""
    m = torch.ones(NTr, 1, C, 1, dtype=torch.float64)
    if varlen:
        for c, (_, n) in enumerate(SPANS):
            m[c, :, n:] = 0
    return m


@GPU
@pytest.mark.parametrize(("varlen", "grads_dtype"), [(False, torch.float32), (True, torch.float32),
                                                     (True, torch.bfloat16)],
                         ids=["dense", "varlen", "varlen-bf16"])  # fmt: skip
def test_kernel_matches_the_mirror(varlen: bool, grads_dtype: torch.dtype) -> None:
    """(grads_dtype, session 32: dqg, dke, dkd written in it)"""
    gen = torch.Generator().manual_seed(5)

    def r(*shape: int) -> torch.Tensor:  # bf16 values in fp64
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(torch.bfloat16).double()

    m = valid(NT, varlen)  # (varlen: the mirror's chunks zero past each sequence's end, as the kernel reads them)
    q, k = r(NT, HV, C, K) * m, torch.nn.functional.normalize(r(NT, HV, C, K), dim=-1) * m
    g = -0.1 * torch.rand(NT, HV, C, K, generator=gen, dtype=torch.float64) * m
    beta = torch.rand(NT, HV, C, generator=gen, dtype=torch.float64) * m[..., 0]
    f = gated_factors(q, k, g, beta, K**-0.5)
    kept = {n: (f[n].to(torch.bfloat16).double() if n != "GC" else f[n]) for n in ("Ag", "Aqk", "qg", "ke", "kd", "GC")}
    S, dS, v, do = r(NT, HV, K, V), 0.1 * r(NT, HV, K, V), r(NT, HV, C, V) * m, r(NT, HV, C, V) * m
    want = state_products(kept, v, S, do, dS)
    dgc = kept["GC"].exp() * (S * dS).sum(-1)

    # Aqk above the diagonal as the Triton Ag pass leaves it (unwritten): NaN here, which the kernel must clear
    dirty = kept["Aqk"].masked_fill(torch.ones(C, C, dtype=torch.bool).triu(1), float("nan"))
    bounds = (torch.tensor(CU, dtype=torch.int32).cuda(), torch.tensor(CI, dtype=torch.int32).cuda()) if varlen else None
    got = state_grads_hopper(S.cuda(), dS.cuda(), lay(v, varlen), lay(do, varlen), lay(kept["Ag"], varlen),
                             lay(dirty, varlen), lay(kept["ke"], varlen), lay(kept["kd"], varlen), kept["GC"].cuda(),
                             varlen=bounds, grads_dtype=grads_dtype)  # fmt: skip
    for name in ("dW", "dAqk", "dAg", "dqg", "dke", "dkd"):
        ref = lay(want[name], varlen).cpu()
        assert bool(torch.isfinite(got[name]).all()), name
        assert got[name].dtype == (grads_dtype if name in ("dqg", "dke", "dkd") else torch.float32
                                   if name != "dW" else torch.bfloat16), name  # fmt: skip
        assert_rel_close(name, ref, got[name].double().cpu(), 2e-2)
    assert_rel_close("dGC", dgc, got["dGC"].double().cpu(), 2e-2)
