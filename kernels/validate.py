"""Input checks shared by the public entries (kernels.api) and the CP schemes (kernels.cp), run before any launch.

Every failure is a `ValueError` that names the argument, what was expected and what was received.
Checks read tensor metadata only, with two exceptions that read values:

- `cu_seqlens` values are read on the host through `kernels.common.index.cu_seqlens_host`: free for a CPU
  tensor or a given `cu_seqlens_cpu`; for a GPU tensor one device-to-host copy at its first use, cached by
  tensor identity afterwards (so a training step that reuses the tensor never syncs).
- the gate sign `g <= 0` is checked only for CPU tensors (one reduction, read through numpy: for a CPU tensor
  that is a host memory read, not a device sync, and it keeps `aten::item` out of the profile, where the
  engine counts it as the marker of a device-to-host sync). On CUDA it is skipped on purpose:
  a host-side check would sync every step, and `torch._assert_async` turns a bad gate into a device-side
  assert that poisons the CUDA context of a long-lived benchmark worker. Gates from `runners.workload`
  satisfy `lb <= g <= 0` by construction; a positive gate on CUDA is the caller's bug, as NaN/Inf are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from kernels.common.index import cu_seqlens_host
from kernels.configs import LaunchConfig
from kernels.vocabulary import BACKENDS, OPS

__all__ = [
    "BACKENDS",
    "FLOAT_DTYPES",
    "OPS",
    "check_backend",
    "check_config",
    "check_cu_seqlens",
    "check_gate_sign",
    "check_grad_outputs",
    "check_inputs",
    "check_kernel_dims",
    "check_op",
]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
# largest head dim the Triton state kernels hold (a [K, BV] fp32 state tile in registers; FLA's limit too)
MAX_TRITON_HEAD_DIM = 256
MIN_TRITON_HEAD_DIM = 1    # any smaller dim runs in a masked power-of-two tile (`kernels.configs.head_block`)


def check_op(op: Any) -> str:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got op={op!r}")
    return op


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got backend={backend!r}")
    return backend


def _check_tensor(name: str, x: Any, *, ndim: int, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES, dims: str = "") -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {dims}, got {name}.shape={tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name}.dtype must be one of {[str(d) for d in dtypes]}, got {x.dtype}")
    return x


def _same_dims(name: str, x: Tensor, ref_name: str, ref: Tensor, dims: Sequence[tuple[int, str]]) -> None:
    for i, label in dims:
        if x.shape[i] != ref.shape[i]:
            raise ValueError(
                f"{name}.shape[{i}] ({label}) must equal {ref_name}.shape[{i}]={ref.shape[i]}, "
                f"got {name}.shape={tuple(x.shape)}, {ref_name}.shape={tuple(ref.shape)}"
            )


def check_cu_seqlens(
    cu_seqlens: Any, *, batch: int, seq_len: int, device: torch.device, cu_seqlens_cpu: Tensor | Sequence[int] | None = None
) -> list[int]:
    """Check varlen bounds and return them as a host list (see the module docstring on host reads)."""
    if not isinstance(cu_seqlens, Tensor):
        raise ValueError(f"cu_seqlens must be a 1-D int32/int64 torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens.dtype must be torch.int32 or torch.int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with N+1 >= 2 entries, got cu_seqlens.shape={tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens must be on the CPU or on the inputs' device {device}, got {cu_seqlens.device}")
    if batch != 1:
        raise ValueError(f"cu_seqlens needs flattened input with B == 1, got B={batch} (q/k.shape[0])")
    bounds = cu_seqlens_host(cu_seqlens, cu_seqlens_cpu)
    if len(bounds) != cu_seqlens.numel():
        raise ValueError(f"cu_seqlens_cpu has {len(bounds)} entries but cu_seqlens has {cu_seqlens.numel()}")
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0]={bounds[0]}")
    for i in range(len(bounds) - 1):
        if bounds[i + 1] < bounds[i]:
            raise ValueError(f"cu_seqlens must be non-decreasing, got cu_seqlens[{i}]={bounds[i]} > cu_seqlens[{i + 1}]={bounds[i + 1]}")
        if bounds[i + 1] == bounds[i]:
            raise ValueError(f"cu_seqlens holds an empty sequence {i} (cu_seqlens[{i}] == cu_seqlens[{i + 1}] == {bounds[i]}); "
                             "every sequence needs >= 1 token")
    if bounds[-1] != seq_len:
        raise ValueError(f"cu_seqlens must end at T={seq_len} (the token dim of q/k), got cu_seqlens[-1]={bounds[-1]}")
    return bounds


def check_kernel_dims(backend: str, K: int, V: int) -> None:
    """The Triton kernels hold a [K, V] state tile: both dims in [1, 256] (any value: the tiles are masked)."""
    if backend != "triton":
        return
    for name, d in (("K", K), ("V", V)):
        if d > MAX_TRITON_HEAD_DIM or d < MIN_TRITON_HEAD_DIM:
            raise ValueError(
                f"head dim {name}={d} is not supported by the triton backend (a state larger than the kernels hold): "
                f"expected {MIN_TRITON_HEAD_DIM} <= {name} <= {MAX_TRITON_HEAD_DIM}; use backend='torch'"
            )


def check_gate_sign(g: Tensor, lower_bound: float | None = None) -> None:
    """g must be a log decay (<= 0), and >= lower_bound when a safe gate promises one (`safe_gate`). CPU tensors
    only: see the module docstring for why CUDA is skipped."""
    if g.device.type != "cpu" or g.numel() == 0:
        return
    gmax = float(g.detach().max().float().numpy())  # numpy has no bfloat16
    if gmax > 0:
        raise ValueError(f"g must be a log decay, g <= 0 everywhere, got max(g)={gmax:.4g}")
    if lower_bound is not None:
        gmin = float(g.detach().min().float().numpy())
        if not gmin >= lower_bound:
            raise ValueError(f"g must be >= lower_bound={lower_bound} everywhere (safe_gate=True promises it), "
                             f"got min(g)={gmin:.4g}")


def check_inputs(
    op: str,
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    backend: str,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
    grouped: bool = False,
    raw_gate: bool = False,
    gate_bound: float | None = None,
    state_v_first: bool = False,
) -> list[int] | None:
    """All checks of a forward (q given) or a transition (q None). `backend` is the resolved one.

    grouped: v, g, beta and the state may have HV heads, a multiple of q/k's H (grouped value heads); else HV == H.
    raw_gate: g is the raw input of the in-kernel gate (any sign; its shape is checked). gate_bound: a safe gate's
    promise `g >= gate_bound` (CPU tensors). state_v_first: initial_state in FLA's transposed layout `[N, HV, V, K]`.
    fp64 inputs are accepted by the reference and torch backends (tests, gradcheck). Returns the host list of
    `cu_seqlens` (None for dense input).
    """
    check_op(op)
    check_backend(backend)
    dtypes = FLOAT_DTYPES + (torch.float64,) if backend in ("reference", "torch") else FLOAT_DTYPES
    _check_tensor("k", k, ndim=4, dtypes=dtypes, dims="[B, T, H, K]")
    if q is not None:
        _check_tensor("q", q, ndim=4, dtypes=dtypes, dims="[B, T, H, K]")
        if q.shape != k.shape:
            raise ValueError(f"q and k must have the same shape [B, T, H, K], got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
        if k.dtype != q.dtype:
            raise ValueError(f"k.dtype must equal q.dtype={q.dtype}, got {k.dtype}")
    _check_tensor("v", v, ndim=4, dtypes=dtypes, dims="[B, T, H, V]")
    _same_dims("v", v, "k", k, ((0, "batch B"), (1, "length T")) if grouped else ((0, "batch B"), (1, "length T"), (2, "heads H")))
    if v.dtype != k.dtype:
        raise ValueError(f"v.dtype must equal k.dtype={k.dtype}, got {v.dtype}")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if grouped and (HV < 1 or HV % max(H, 1)):
        raise ValueError(f"v.shape[2] (value heads HV={HV}) must be a positive multiple of k.shape[2] (key heads H={H}): "
                         f"query/key head h // (HV/H) serves value head h, got v.shape={tuple(v.shape)}, k.shape={tuple(k.shape)}")
    hv = "HV" if HV != H else "H"   # the value-head count's name in messages
    _check_tensor("beta", beta, ndim=3, dtypes=dtypes, dims=f"[B, T, {hv}]")
    _same_dims("beta", beta, "v", v, ((0, "batch B"), (1, "length T"), (2, f"heads {hv}")))
    if op == "gdn":
        _check_tensor("g", g, ndim=3, dtypes=dtypes, dims=f"[B, T, {hv}] for op='gdn' (one gate per head)")
        _same_dims("g", g, "v", v, ((0, "batch B"), (1, "length T"), (2, f"heads {hv}")))
    else:
        _check_tensor("g", g, ndim=4, dtypes=dtypes, dims=f"[B, T, {hv}, K] for op='kda' (one gate per key dim)")
        _same_dims("g", g, "v", v, ((0, "batch B"), (1, "length T"), (2, f"heads {hv}")))
        _same_dims("g", g, "k", k, ((3, "key dim K"),))
    for name, d in (("B", B), ("T", T), ("H", H), ("K", K), ("V", V)):
        if d < 1:
            raise ValueError(f"{name} must be >= 1, got k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}")
    device = k.device
    for name, x in (("q", q), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if x is not None and isinstance(x, Tensor) and x.device != device:
            raise ValueError(f"{name} is on {x.device} but k is on {device}; all inputs must be on one device")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float or None, got scale={scale!r}")
    bounds = None
    if cu_seqlens is not None:
        bounds = check_cu_seqlens(cu_seqlens, batch=B, seq_len=T, device=device, cu_seqlens_cpu=cu_seqlens_cpu)
    N = len(bounds) - 1 if bounds is not None else B
    if initial_state is not None:
        dims, want = (f"[N, {hv}, V, K]", (N, HV, V, K)) if state_v_first else (f"[N, {hv}, K, V]", (N, HV, K, V))
        _check_tensor("initial_state", initial_state, ndim=4, dtypes=dtypes, dims=dims)
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must have shape {dims} = {want} "
                             f"(N = number of sequences), got initial_state.shape={tuple(initial_state.shape)}")
    check_kernel_dims(backend, K, V)
    if not raw_gate:
        check_gate_sign(g, gate_bound)
    return bounds


def check_grad_outputs(do: Any, dht: Any, *, q: Tensor, v: Tensor, num_seqs: int) -> None:
    """The incoming gradients of a backward: `do` like o (`[B, T, HV, V]`, q's dtype and device), `dht` like the
    final state (`[N, HV, K, V]`, fp32, fp64 for fp64 inputs) or None. A ValueError naming the argument otherwise."""
    B, T, HV, V = v.shape
    K = q.shape[-1]
    if not isinstance(do, Tensor):
        raise ValueError(f"do must be a torch.Tensor (the gradient of o), got {type(do).__name__}")
    if tuple(do.shape) != (B, T, HV, V):
        raise ValueError(f"do must have the shape of o [B, T, HV, V] = {(B, T, HV, V)}, got do.shape={tuple(do.shape)}")
    if do.dtype != q.dtype:
        raise ValueError(f"do.dtype must equal o's dtype (q.dtype={q.dtype}), got {do.dtype}")
    if do.device != q.device:
        raise ValueError(f"do is on {do.device} but q is on {q.device}")
    if dht is None:
        return
    state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if not isinstance(dht, Tensor):
        raise ValueError(f"dht must be a torch.Tensor (the gradient of the final state) or None, got {type(dht).__name__}")
    if tuple(dht.shape) != (num_seqs, HV, K, V):
        raise ValueError(f"dht must have the shape of the final state [N, H, K, V] = {(num_seqs, HV, K, V)}, "
                         f"got dht.shape={tuple(dht.shape)}")
    if dht.dtype != state_dtype:
        raise ValueError(f"dht.dtype must be {state_dtype} (the final state's dtype), got {dht.dtype}")
    if dht.device != q.device:
        raise ValueError(f"dht is on {dht.device} but q is on {q.device}")


def check_config(config: Any) -> dict[str, LaunchConfig]:
    """Normalise `config` to {kernel name: LaunchConfig}; a bare LaunchConfig applies to the chunk-state kernel."""
    if config is None:
        return {}
    if isinstance(config, LaunchConfig):
        return {"chunk_state_fwd": config}
    if isinstance(config, Mapping):
        out: dict[str, LaunchConfig] = {}
        for name, cfg in config.items():
            if not isinstance(name, str) or not isinstance(cfg, LaunchConfig):
                raise ValueError(f"config must map kernel names (str) to LaunchConfig, got {name!r}: {type(cfg).__name__}")
            out[name] = cfg
        return out
    raise ValueError(f"config must be None, a LaunchConfig or a Mapping[str, LaunchConfig], got {type(config).__name__}")
