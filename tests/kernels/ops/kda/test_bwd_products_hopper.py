"""The products and finish of KDA's chunk backward on TileLang (`kernels.ops.kda.bwd_products_hopper`, a lab kernel:
the second half of the planned chunk-parallel KDA backward).

On any machine: the refusal and bad shapes name their reason in one line. On an H200 with CPBENCH_TEST_GPU=1 and
tilelang 0.1.15 (K = 128, chunk 64): dq, dk, dg and dbeta of five chunks and two value heads against the fp64 mirror
(`kernels.ops.kda.reverse_bwd_torch.products_finish`) on the same inputs: random q, k, g, beta, the forward's kept T,
qg, ke, kd from `gated_factors` and the state products from `state_products` on random states (bf16 where the kernel
reads bf16); relative L2 2e-2 (dA's two products take bf16 operands, as `wy_bwd`'s); weak gates (fast chunks) and a
key whose span across one block passes FAST_SPAN in one chunk (that chunk's elementwise diagonal blocks); grouped
heads (session 31: both value heads read one q, k head); the varlen build (session 31: three sequences, three partial
chunks, `test_state_grads_hopper`'s layout).
"""

from __future__ import annotations

import pytest
import torch

from kernels.ops.kda.bwd_products_hopper import (
    PRODUCTS_LAB_SWITCHES,
    build_key,
    bwd_products_hopper,
    bwd_products_refusal,
)
from kernels.ops.kda.reverse_bwd_torch import gated_factors, products_finish, state_products
from tests.kernels.ops.kda.test_state_grads_hopper import CI, CU, lay, valid
from tests.utils import TEST_DEVICE, assert_rel_close

K = V = 128
C, NT, HV = 64, 5, 2
WHY = bwd_products_refusal(K, V, C, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def test_refusals_name_their_reason() -> None:
    assert "KDA backward products takes K = V = 128 and chunk 64, got K=64" in str(
        bwd_products_refusal(64, 128, 64, torch.device("cpu"))
    )
    x = torch.zeros(C, 1, K)
    with pytest.raises(ValueError, match="the TileLang KDA backward products runs on CUDA only"):
        bwd_products_hopper(x, x, x, torch.zeros(C, 1), torch.zeros(C, 1, C), {}, {}, scale=1.0)


def test_the_build_follows_the_inputs_dtypes() -> None:
    """(session 33) The build a launch takes (`build_key`, which the lab's prebuild uses too): dqg, dke, dkd read in
    bf16 only where all three are; g read and dg written in bf16 where g is; dq, dk as out_dtype; grouped heads."""
    k = torch.randn(C, 1, K).to(torch.bfloat16)
    g32 = torch.randn(C, HV, K)
    grads = {n: torch.randn(C, HV, K).to(torch.bfloat16) for n in ("dqg", "dke", "dkd")}
    key = build_key(k, g32.to(torch.bfloat16), grads, scale=0.5, varlen=True, lab=frozenset({"wg1"}),
                    out_dtype=torch.bfloat16)  # fmt: skip
    assert key == (HV, 1, 0.5, True, frozenset({"wg1"}), True, True, True)
    mixed = grads | {"dkd": grads["dkd"].float()}
    assert build_key(k, g32, mixed, scale=0.5, varlen=False) == (HV, 1, 0.5, False, frozenset(), False, False, False)


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


@GPU
@pytest.mark.parametrize(("strong", "grouped", "varlen", "variant"),
                         [(False, False, False, ""), (True, False, False, ""), (False, True, False, ""),
                          (True, True, True, ""), (True, False, False, "wg1"), (True, True, True, "wg1"),
                          (True, True, True, "wg4"), (True, False, True, "bf16")],
                         ids=["fast", "edges", "grouped", "varlen", "edges-wg1", "varlen-wg1", "varlen-wg4",
                              "varlen-bf16"])  # fmt: skip
def test_kernel_matches_the_mirror(strong: bool, grouped: bool, varlen: bool, variant: str) -> None:
    """(variant, session 32: an exact lab build, `PRODUCTS_LAB_SWITCHES`' wg1 or wg4 (one or four warpgroups), joined
    by +; or bf16:
    dqg, dke, dkd in bf16 (`state_grads_hopper`'s grads_dtype), the mirror on the same rounded values, and dq, dk out
    in bf16; since session 33 g in bf16 too (the model's gate dtype), read as it is, and dg out in bf16)"""
    gen = torch.Generator().manual_seed(7)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    m = valid(NT, varlen)  # (varlen, session 31: the mirror's chunks zero past each sequence's end, as the kernel reads)
    Hk = 1 if grouped else HV  # grouped: both value heads read one q, k head (session 31: no expanded copy)
    q0, k0 = _bf(r(NT, Hk, C, K) * m), _bf(torch.nn.functional.normalize(r(NT, Hk, C, K), dim=-1) * m)
    q, k = (x.repeat_interleave(HV // Hk, dim=1) for x in (q0, k0))  # the mirror's, per value head
    g = -0.1 * torch.rand(NT, HV, C, K, generator=gen, dtype=torch.float64)
    if strong:
        g[2, 1, 20:24, 5] = -40.0  # a span of 160 in block 1 of chunk 2: past FAST_SPAN there only
        g[1, 0, 5:9, 3] = -150.0  # (session 32) below the gate's floor: dg 0 there, G floored
    g = _bf(g * m) if variant == "bf16" else g * m  # (bf16: the kernel reads g so, the mirror the same values)
    beta = torch.rand(NT, HV, C, generator=gen, dtype=torch.float64) * m[..., 0]
    scale = K**-0.5
    f = gated_factors(q, k, g, beta, scale)
    kept = {n: _bf(f[n]) for n in ("Ag", "Aqk", "T", "qg", "ke", "kd")} | {"GC": f["GC"]}
    kept["T"] = kept["T"] * m  # (the forward's T past a sequence's end is the next one's rows: the kernel clears it)
    S, dS = _bf(r(NT, HV, K, V)), _bf(0.1 * r(NT, HV, K, V))
    v, do = _bf(r(NT, HV, C, V) * m), _bf(r(NT, HV, C, V) * m)
    grads = state_products(kept, v, S, do, dS) | {"dGC": kept["GC"].exp() * (S * dS).sum(-1)}
    if variant == "bf16":
        grads |= {n: _bf(grads[n]) for n in ("dqg", "dke", "dkd")}
    want = products_finish(q, k, g, beta, kept, grads, scale=scale)

    bounds = (torch.tensor(CU, dtype=torch.int32).cuda(), torch.tensor(CI, dtype=torch.int32).cuda()) if varlen else None
    got = bwd_products_hopper(
        lay(q0, varlen), lay(k0, varlen), lay(g, varlen).to(torch.bfloat16 if variant == "bf16" else torch.float32),
        lay(beta, varlen), lay(kept["T"], varlen),
        {n: lay(kept[n], varlen) for n in ("qg", "ke", "kd")},
        {**{n: lay(grads[n], varlen) for n in ("dAqk", "dAg")}, "dGC": grads["dGC"].cuda(),
         **{n: lay(grads[n], varlen).to(torch.bfloat16 if variant == "bf16" else torch.float32)
            for n in ("dqg", "dke", "dkd")}},
        scale=scale, varlen=bounds, lab=frozenset(x for x in variant.split("+") if x in PRODUCTS_LAB_SWITCHES),
        out_dtype=torch.bfloat16 if variant == "bf16" else torch.float32,
    )  # fmt: skip
    assert got[2].dtype == (torch.bfloat16 if variant == "bf16" else torch.float32)  # dg in g's dtype
    for name, w, a in zip(("dq", "dk", "dg", "dbeta"), want, got, strict=True):
        assert bool(torch.isfinite(a).all()), name
        assert_rel_close(name, lay(w, varlen).cpu(), a.double().cpu(), 2e-2)
