"""The real models' gate and beta activations (kernels.common.gate) against FLA 0.6.0's formulas, written out here
on random inputs in fp64, with their gradients (A_log and dt_bias included) checked by finite differences."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.common.gate import activate_beta, activate_gate

B, T, HV, K = 2, 5, 3, 4


def _inputs(op: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (B, T, HV) if op == "gdn" else (B, T, HV, K)
    g_raw = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    A_log = torch.randn(HV, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(HV if op == "gdn" else HV * K, generator=gen, dtype=torch.float64)
    return g_raw, A_log, dt_bias


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_in_kernel_gate_is_minus_exp_a_times_softplus(op: str) -> None:
    g_raw, A_log, dt_bias = _inputs(op)
    a = A_log.exp().view(HV) if op == "gdn" else A_log.exp().view(HV, 1)
    want = -a * F.softplus(g_raw + dt_bias.view(g_raw.shape[2:]))
    got = activate_gate(op, g_raw, A_log=A_log, dt_bias=dt_bias)
    assert got.dtype == torch.float32 and bool((got <= 0).all())
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)  # fp32 result


@pytest.mark.parametrize("with_a", [True, False])
def test_safe_gate_is_lower_bound_times_sigmoid(with_a: bool) -> None:
    g_raw, A_log, dt_bias = _inputs("kda", seed=1)
    x = g_raw + dt_bias.view(HV, K)
    want = -5.0 * torch.sigmoid(A_log.exp().view(HV, 1) * x if with_a else x)
    got = activate_gate("kda", g_raw, A_log=A_log if with_a else None, dt_bias=dt_bias, lower_bound=-5.0)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert bool((got >= -5.0).all()) and bool((got <= 0).all())


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_gate_gradients_reach_a_log_and_dt_bias(op: str, lower_bound: float | None) -> None:
    g_raw, A_log, dt_bias = (x.requires_grad_() for x in _inputs(op, seed=2))

    def f(g: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        x = g + d.view(g.shape[2:])
        a = a.view(HV) if op == "gdn" else a.view(HV, 1)
        return -a.exp() * F.softplus(x) if lower_bound is None else lower_bound * torch.sigmoid(a.exp() * x)

    got = torch.autograd.grad(
        activate_gate(op, g_raw, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound).sum(), (g_raw, A_log, dt_bias)
    )
    want = torch.autograd.grad(f(g_raw, A_log, dt_bias).sum(), (g_raw, A_log, dt_bias))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # fp32 compute, dA_log summed over B*T*K, vs fp64
    assert torch.autograd.gradcheck(lambda g, a, d: f(g, a, d), (g_raw, A_log, dt_bias))  # the formula's own grads


def test_beta_activation_and_the_missing_a_log_error() -> None:
    raw = torch.randn(B, T, HV, dtype=torch.bfloat16)
    torch.testing.assert_close(activate_beta(raw), torch.sigmoid(raw.float()).bfloat16())
    torch.testing.assert_close(activate_beta(raw, allow_neg_eigval=True), (2 * torch.sigmoid(raw.float())).bfloat16())
    with pytest.raises(ValueError, match=r"^use_gate_in_kernel=True needs A_log"):
        activate_gate("kda", torch.randn(B, T, HV, K), A_log=None, dt_bias=None)
