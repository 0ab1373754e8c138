"""Bad input gets a ValueError naming the argument and the expected/received value, before any launch.

Each case starts from valid inputs (gdn or kda, dense or varlen), breaks one thing, and checks the message.
Triton-only limits (head dims above 256; any smaller one runs) are checked on CPU tensors with backend="triton": validation runs before
Triton is imported, so the ValueError comes first on any machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernels
from kernels.configs import LaunchConfig
from tests.utils import make_inputs, make_state


def _gdn(**over: Any) -> dict[str, Any]:
    q, k, v, g, beta, _ = make_inputs("gdn", B=2, T=20, H=2, K=16, V=16)
    args = {"op": "gdn", "q": q, "k": k, "v": v, "g": g, "beta": beta}
    args.update(over)
    return args


def _varlen(**over: Any) -> dict[str, Any]:
    q, k, v, g, beta, cu = make_inputs("kda", (5, 15), H=2, K=16, V=16)
    args = {"op": "kda", "q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu}
    args.update(over)
    return args


def _run(args: dict[str, Any]) -> None:
    a = dict(args)
    kernels.forward(a.pop("op"), a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), **a)


BAD: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("op", lambda: _gdn(op="gla"), r"op must be one of \('gdn', 'kda'\), got op='gla'"),
    ("backend", lambda: _gdn(backend="cuda"), r"backend must be one of .*got backend='cuda'"),
    ("q_rank", lambda: _gdn(q=torch.randn(2, 20, 16)), r"q must be 4-D \[B, T, H, K\], got q.shape=\(2, 20, 16\)"),
    ("q_not_tensor", lambda: _gdn(q=[1.0]), r"q must be a torch.Tensor, got list"),
    ("qk_shape", lambda: _gdn(q=torch.randn(2, 20, 2, 32)), r"q and k must have the same shape .*q.shape=\(2, 20, 2, 32\)"),
    ("v_heads", lambda: _gdn(v=torch.randn(2, 20, 3, 16)), r"v.shape\[2\] \(value heads HV=3\) must be a positive multiple of k.shape\[2\] \(key heads H=2\)"),
    ("v_length", lambda: _gdn(v=torch.randn(2, 19, 2, 16)), r"v.shape\[1\] \(length T\) must equal k.shape\[1\]=20"),
    ("v_batch", lambda: _gdn(v=torch.randn(1, 20, 2, 16)), r"v.shape\[0\] \(batch B\) must equal k.shape\[0\]=2"),
    ("beta_shape", lambda: _gdn(beta=torch.rand(2, 20, 2, 1)), r"beta must be 3-D \[B, T, H\], got beta.shape=\(2, 20, 2, 1\)"),
    ("beta_heads", lambda: _gdn(beta=torch.rand(2, 20, 4)), r"beta.shape\[2\] \(heads H\) must equal v.shape\[2\]=2"),
    ("gdn_gate_per_key", lambda: _gdn(g=-torch.rand(2, 20, 2, 16)), r"g must be 3-D \[B, T, H\] for op='gdn'.*got g.shape=\(2, 20, 2, 16\)"),
    ("kda_gate_scalar", lambda: _varlen(g=-torch.rand(1, 20, 2)), r"g must be 4-D \[B, T, H, K\] for op='kda'.*got g.shape=\(1, 20, 2\)"),
    ("kda_gate_keys", lambda: _varlen(g=-torch.rand(1, 20, 2, 8)), r"g.shape\[3\] \(key dim K\) must equal k.shape\[3\]=16"),
    ("int_dtype", lambda: _gdn(q=torch.ones(2, 20, 2, 16, dtype=torch.int32)), r"q.dtype must be one of .*got torch.int32"),
    ("k_dtype", lambda: _gdn(k=torch.randn(2, 20, 2, 16, dtype=torch.float16)), r"k.dtype must equal q.dtype=torch.float32, got torch.float16"),
    ("g_positive", lambda: _gdn(g=torch.full((2, 20, 2), 0.5)), r"g must be a log decay, g <= 0 everywhere, got max\(g\)=0.5"),
    ("device_mix", lambda: _gdn(v=torch.randn(2, 20, 2, 16, device="meta")), r"v is on meta but k is on cpu"),
    ("scale", lambda: _gdn(scale=float("nan")), r"scale must be a finite float or None, got scale=nan"),
    ("h0_shape", lambda: _gdn(initial_state=make_state(1, 2, 16, 16)), r"initial_state must have shape \[N, H, K, V\] = \(2, 2, 16, 16\).*\(1, 2, 16, 16\)"),
    ("h0_rank", lambda: _gdn(initial_state=torch.zeros(2, 16, 16)), r"initial_state must be 4-D"),
    ("h0_varlen_N", lambda: _varlen(initial_state=make_state(1, 2, 16, 16)), r"\(N = number of sequences\), got initial_state.shape=\(1, 2, 16, 16\)"),
    ("cu_dtype", lambda: _varlen(cu_seqlens=torch.tensor([0.0, 5.0, 20.0])), r"cu_seqlens.dtype must be torch.int32 or torch.int64, got torch.float32"),
    ("cu_rank", lambda: _varlen(cu_seqlens=torch.tensor([[0, 5, 20]])), r"cu_seqlens must be 1-D with N\+1 >= 2 entries, got cu_seqlens.shape=\(1, 3\)"),
    ("cu_short", lambda: _varlen(cu_seqlens=torch.tensor([20])), r"cu_seqlens must be 1-D with N\+1 >= 2 entries"),
    ("cu_start", lambda: _varlen(cu_seqlens=torch.tensor([1, 5, 20])), r"cu_seqlens must start at 0, got cu_seqlens\[0\]=1"),
    ("cu_decreasing", lambda: _varlen(cu_seqlens=torch.tensor([0, 12, 5, 20])), r"non-decreasing, got cu_seqlens\[1\]=12 > cu_seqlens\[2\]=5"),
    ("cu_empty_seq", lambda: _varlen(cu_seqlens=torch.tensor([0, 5, 5, 20])), r"empty sequence 1 \(cu_seqlens\[1\] == cu_seqlens\[2\] == 5\)"),
    ("cu_end", lambda: _varlen(cu_seqlens=torch.tensor([0, 5, 19])), r"cu_seqlens must end at T=20 .*got cu_seqlens\[-1\]=19"),
    ("cu_batch", lambda: _gdn(cu_seqlens=torch.tensor([0, 5, 20])), r"cu_seqlens needs flattened input with B == 1, got B=2"),
    ("cu_device", lambda: _varlen(cu_seqlens=torch.tensor([0, 5, 20], device="meta")), r"cu_seqlens must be on the CPU or on the inputs' device"),
    ("cu_cpu_len", lambda: _varlen(cu_seqlens_cpu=[0, 20]), r"cu_seqlens_cpu has 2 entries but cu_seqlens has 3"),
    ("triton_K_big", lambda: _varlen(backend="triton", q=torch.randn(1, 20, 2, 300), k=torch.randn(1, 20, 2, 300),
                                     g=-torch.rand(1, 20, 2, 300)), r"head dim K=300 is not supported by the triton backend.*1 <= K <= 256"),
    ("triton_V_big", lambda: _gdn(backend="triton", v=torch.randn(2, 20, 2, 512)), r"head dim V=512 is not supported by the triton backend.*1 <= V <= 256"),
    ("config_type", lambda: _gdn(config={"BV": 32}), r"config must map kernel names \(str\) to LaunchConfig, got 'BV': int"),
    ("config_obj", lambda: _gdn(config=32), r"config must be None, a LaunchConfig or a Mapping\[str, LaunchConfig\], got int"),
]


@pytest.mark.parametrize("make,match", [pytest.param(m, r, id=name) for name, m, r in BAD])
def test_forward_invalid(make: Callable[[], dict[str, Any]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _run(make())


def test_reference_and_transition_validate_too() -> None:
    q, k, v, g, beta, _ = make_inputs("gdn", B=2, T=20, H=2, K=16, V=16)
    with pytest.raises(ValueError, match=r"cu_seqlens needs flattened input with B == 1"):
        kernels.reference("gdn", q, k, v, g, beta, cu_seqlens=torch.tensor([0, 20]))
    with pytest.raises(ValueError, match=r"g must be a log decay"):
        kernels.transition("gdn", k, v, g.abs(), beta, backend="torch")
    with pytest.raises(ValueError, match=r"v.shape\[2\] \(heads H\)"):
        kernels.transition("gdn", k, v[:, :, :1], g, beta, backend="torch")


def test_valid_inputs_pass_all_backends_checks() -> None:
    # a valid torch call with a LaunchConfig (ignored off-triton) and an explicit host copy of cu_seqlens
    args = _varlen(backend="torch", config=LaunchConfig(BV=32), cu_seqlens_cpu=[0, 5, 20], scale=0.5)
    _run(args)


def test_chain_invalid() -> None:
    with pytest.raises(ValueError, match=r"chain expects M \[P,H,K,K\] and S_ext \[P,H,K,V\] with the same P"):
        kernels.chain(torch.zeros(2, 1, 4, 4), torch.zeros(3, 1, 4, 8))


def test_fla_missing_names_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if FLA were not installed (CI installs fla-core)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    with pytest.raises(ImportError, match=r"backend 'fla' needs the flash-linear-attention package \(pip install flash-linear-attention\)"):
        _run(_gdn(backend="fla"))


def test_use_autotune_without_loader_names_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as if kernels/plan.py were missing
    monkeypatch.setitem(sys.modules, "kernels.plan", None)
    with pytest.raises(ImportError, match=r"needs the module kernels.plan"):
        kernels.use_autotune(tmp_path / "autotune.json")


def test_gate_sign_check_takes_bf16_gates() -> None:
    # numpy has no bf16: the CPU gate check must widen before reading, for valid and invalid gates alike
    q, k, v, g, beta, _ = make_inputs("gdn", B=1, T=20, H=2, K=16, V=16)
    o, _ = kernels.forward("gdn", q, k, v, g.to(torch.bfloat16), beta, backend="torch")
    assert torch.isfinite(o).all()
    with pytest.raises(ValueError, match=r"g must be a log decay, g <= 0 everywhere, got max\(g\)=0.5"):
        kernels.forward("gdn", q, k, v, torch.full_like(g, 0.5, dtype=torch.bfloat16), beta, backend="torch")
