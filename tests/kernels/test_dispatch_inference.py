"""Inference (issue 25): kernels.chunk_gdn / chunk_kda and kernels.forward under `torch.inference_mode()` and
`torch.no_grad()`, forward only: outputs against the fp32 per-token reference (relative L2 1e-5), no autograd node on
the outputs and nothing saved for a backward (a saved-tensors hook counts what autograd would pack). Inputs: random,
varlen with an initial state, grouped value heads HV = 2H; under inference_mode every input, cu_seqlens included, is
an inference tensor (made inside the mode), as in a serving path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import Tensor

import kernels
from tests.utils import assert_rel_close, make_inputs, make_state

TOL = 1e-5
H, HV, K, V = 1, 2, 16, 16
LENGTHS = (30, 70)
MODES = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}
# Kimi Linear's options (the serving call)
KIMI = {
    "use_gate_in_kernel": True,
    "safe_gate": True,
    "lower_bound": -5.0,
    "use_beta_sigmoid_in_kernel": True,
    "use_qk_l2norm_in_kernel": True,
    "state_v_first": True,
}


def _entry(op: str):  # noqa: ANN202
    return kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda


def _inputs(op: str) -> dict[str, Any]:
    _, _, v, g, beta, cu = make_inputs(op, LENGTHS, H=HV, K=K, V=V, seed=31)
    q, k, *_ = make_inputs(op, LENGTHS, H=H, K=K, V=V, seed=32)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": make_state(2, HV, K, V), "cu_seqlens": cu}


@contextmanager
def _count_saved() -> Iterator[list[int]]:
    """How many tensors autograd packs for a backward inside the block (the count is the list's one entry)."""
    count = [0]

    def pack(t: Tensor) -> Tensor:
        count[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield count


def _in_mode(mode: str, xs: dict[str, Any]) -> dict[str, Any]:
    """Inputs for a call under `mode`: fresh inference tensors under inference_mode, leaves requiring grad (that the
    mode must ignore) under no_grad."""
    if mode == "inference_mode":
        return {n: x.clone() for n, x in xs.items()}  # called inside the mode: inference tensors
    return {n: (x.clone().requires_grad_() if x.is_floating_point() else x) for n, x in xs.items()}


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
@pytest.mark.parametrize("mode", list(MODES))
def test_chunk_forward_only(op: str, backend: str, mode: str) -> None:
    xs = _inputs(op)
    o_ref, ht_ref = kernels.reference(op, **xs, output_final_state=True)
    with MODES[mode](), _count_saved() as saved:
        args = _in_mode(mode, xs)
        o, ht = _entry(op)(**args, output_final_state=True, backend=backend)
    assert saved[0] == 0 and o.grad_fn is None and ht.grad_fn is None and not o.requires_grad
    assert o.is_inference() == (mode == "inference_mode")
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def test_saved_tensor_count_sees_a_training_call() -> None:
    """The detector of the tests above: with grad on, the same call saves its inputs for the backward."""
    xs = _in_mode("no_grad", _inputs("kda"))
    with _count_saved() as saved:
        o, _ = kernels.chunk_kda(**xs, backend="torch")
    assert saved[0] > 0 and o.grad_fn is not None


@pytest.mark.parametrize("mode", list(MODES))
def test_real_model_call_in_inference(mode: str) -> None:
    """Kimi Linear's serving call: raw gate, A_log, dt_bias, the safe gate, in-kernel beta sigmoid and l2norm, the
    `[N, HV, V, K]` state; the expected side writes FLA's formulas out."""
    xs = _inputs("kda")
    gen = torch.Generator().manual_seed(33)
    g_raw, A_log, dt_bias = torch.randn(xs["g"].shape, generator=gen), torch.randn(HV), torch.randn(HV * K)
    b_raw = torch.randn(xs["beta"].shape, generator=gen)
    g = -5.0 * torch.sigmoid(A_log.exp().view(HV, 1) * (g_raw + dt_bias.view(HV, K)))
    q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (xs["q"], xs["k"]))
    o_ref, ht_ref = kernels.reference(
        "kda",
        q,
        k,
        xs["v"],
        g,
        torch.sigmoid(b_raw),
        initial_state=xs["initial_state"],
        output_final_state=True,
        cu_seqlens=xs["cu_seqlens"],
    )
    call = {**xs, "g": g_raw, "beta": b_raw, "initial_state": xs["initial_state"].transpose(-1, -2).contiguous()}
    with MODES[mode](), _count_saved() as saved:
        o, ht = kernels.chunk_kda(
            **_in_mode(mode, call), A_log=A_log, dt_bias=dt_bias, **KIMI, output_final_state=True, backend="torch"
        )
    assert saved[0] == 0 and o.grad_fn is None
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref.transpose(-1, -2), ht, TOL)
    assert ht.is_contiguous()  # FLA's [N, HV, V, K] tensor, not a transposed view


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_kernels_forward_in_inference_mode(op: str) -> None:
    """kernels.forward (grouped heads through the differentiable op, and one head count through the direct path)."""
    xs = _inputs(op)
    o_ref, _ = kernels.reference(op, **xs)
    q2 = xs["q"].repeat_interleave(2, dim=2)
    k2 = xs["k"].repeat_interleave(2, dim=2)
    with torch.inference_mode(), _count_saved() as saved:
        args = _in_mode("inference_mode", xs)
        o_grouped, _ = kernels.forward(op, **args, backend="torch")
        o_same, _ = kernels.forward(op, **{**args, "q": q2.clone(), "k": k2.clone()}, backend="torch")
    assert saved[0] == 0
    assert_rel_close("o grouped", o_ref, o_grouped, TOL)
    assert_rel_close("o", o_ref, o_same, TOL)
