"""FLA's keyword arguments of `chunk_gated_delta_rule` / `chunk_kda` (FLA 0.6.0), checked into one `FlaArgs`.

    args = parse_fla_args("kda", kwargs)            # names, types, combinations: before any tensor is read
    check_fla_tensors("kda", args, k=k, v=v, bounds=bounds)   # A_log / dt_bias / chunk_indices against the inputs

The table of what each argument does here is part of `kernels.chunk_kda`'s and `kernels.chunk_gdn`'s docstrings
(kernels/ops/<op>/chunk.py). Every refusal is a one-line ValueError naming the argument, its value and why; FLA's defaults passed
explicitly are always accepted. A tensor FLA would silently ignore (A_log / dt_bias without use_gate_in_kernel,
lower_bound without a gate that reads it) is refused rather than ignored, so a caller never believes it applied.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FLA_CHUNK_SIZES",
    "FlaArgs",
    "check_fla_backend",
    "check_fla_tensors",
    "parse_fla_args",
]

# the chunk sizes FLA 0.6.0 accepts per op (all run on the torch, reference and fla backends), and those the triton
# backend's kernels run (a value of the first and not the second is refused there as not implemented)
FLA_CHUNK_SIZES: Mapping[str, tuple[int, ...]] = {"gdn": (16, 32, 64), "kda": (32, 64)}
SAFE_LOWER_BOUND = -5.0  # FLA's safe range of lower_bound with safe_gate and the in-kernel gate: [-5, 0)

_FLAGS = (
    "use_gate_in_kernel",
    "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval",
    "state_v_first",
    "safe_gate",
    "disable_recompute",
    "return_intermediate_states",
    "use_graph",
)
_BOTH = frozenset(
    {
        "chunk_size",
        "use_gate_in_kernel",
        "A_log",
        "dt_bias",
        "use_beta_sigmoid_in_kernel",
        "allow_neg_eigval",
        "state_v_first",
        "transpose_state_layout",
        "chunk_indices",
        "cp_context",
    }
)
# chunk_kda's own arguments; chunk_gated_delta_rule swallows them in **kwargs and ignores them
_KDA_ONLY = frozenset(
    {"safe_gate", "lower_bound", "disable_recompute", "return_intermediate_states", "use_graph", "max_num_seqs"}
)
# FlaArgs' fields taken from the call as they are
_FIELDS = (
    "use_gate_in_kernel",
    "A_log",
    "dt_bias",
    "safe_gate",
    "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval",
    "disable_recompute",
    "return_intermediate_states",
    "state_v_first",
    "chunk_indices",
)
_DEFAULTS: Mapping[str, Any] = {"chunk_size": 64, "lower_bound": None, "max_num_seqs": None, **dict.fromkeys(_FLAGS, False)}


@dataclass(frozen=True)
class FlaArgs:
    """The checked FLA options of one call (FLA's defaults when not given)."""

    use_gate_in_kernel: bool = False
    A_log: Tensor | None = None
    dt_bias: Tensor | None = None
    safe_gate: bool = False
    lower_bound: float | None = None
    use_beta_sigmoid_in_kernel: bool = False
    allow_neg_eigval: bool = False
    disable_recompute: bool = False
    return_intermediate_states: bool = False
    state_v_first: bool = False
    chunk_size: int = 64
    chunk_indices: Tensor | None = None
    given: Mapping[str, Any] = field(default_factory=dict)  # what the caller passed (FLA's names), for the fla backend

    @property
    def gate_bound(self) -> float | None:
        """The bound a precomputed safe gate promises (`g >= lower_bound`), checked on CPU tensors; else None."""
        return self.lower_bound if self.safe_gate and not self.use_gate_in_kernel else None


def parse_fla_args(op: str, kwargs: Mapping[str, Any]) -> FlaArgs:
    """FLA's keyword arguments of `chunk_{op}` checked for names, types and combinations (module docstring)."""
    kw = dict(kwargs)
    _rename_transpose_state_layout(op, kw)
    for name, value in kw.items():
        _check_name(op, name, value)
    for name in _FLAGS:
        if name in kw and not isinstance(kw[name], bool):
            raise ValueError(f"{name} must be a bool, got {name}={kw[name]!r}")
    _check_dispatch_args(op, kw)
    chunk_size = _check_chunk_size(op, kw.get("chunk_size", 64))
    lower_bound = _check_gate_args(op, kw)
    if kw.get("allow_neg_eigval", False) and not kw.get("use_beta_sigmoid_in_kernel", False):
        raise ValueError(
            "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (FLA's rule: it scales the "
            "in-kernel sigmoid of beta to (0, 2))"
        )
    if kw.get("return_intermediate_states", False):
        _check_intermediate_states(kw)
    known = {name: kw[name] for name in _FIELDS if name in kw}
    return FlaArgs(
        **known,
        lower_bound=lower_bound,
        chunk_size=chunk_size,
        given={n: x for n, x in kw.items() if n not in ("cp_context", "use_graph", "max_num_seqs")},
    )


def _check_gate_args(op: str, kw: Mapping[str, Any]) -> float | None:
    """The in-kernel gate's arguments (A_log, dt_bias, lower_bound, safe_gate): the checked lower_bound."""
    gate = kw.get("use_gate_in_kernel", False)
    lower_bound = _check_lower_bound(op, kw, gate)
    for name in ("A_log", "dt_bias"):
        if kw.get(name) is not None and not gate:
            raise ValueError(
                f"{name} is given but use_gate_in_kernel=False: FLA would ignore it (g is taken as the "
                f"precomputed log decay); pass use_gate_in_kernel=True or {name}=None"
            )
    if gate and kw.get("A_log") is None and lower_bound is None:
        raise ValueError(
            "A_log=None with use_gate_in_kernel=True: the gate -exp(A_log) * softplus(g + dt_bias) needs "
            "A_log (shape [HV])" + ("" if op == "gdn" else ", unless lower_bound is set")
        )
    return lower_bound


def _rename_transpose_state_layout(op: str, kw: dict[str, Any]) -> None:
    """FLA's deprecated alias `transpose_state_layout` of `state_v_first` (a DeprecationWarning, as FLA)."""
    if "transpose_state_layout" not in kw:
        return
    if kw.get("state_v_first", False):
        raise ValueError(
            f"chunk_{op} got both state_v_first=True and the deprecated transpose_state_layout="
            f"{kw['transpose_state_layout']!r}; pass state_v_first only"
        )
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning, stacklevel=5)
    kw["state_v_first"] = kw.pop("transpose_state_layout")


def _check_name(op: str, name: str, value: Any) -> None:
    if name == "head_first":
        raise ValueError(
            f"head_first={value!r} is not accepted: FLA removed head_first (it raises for any value); "
            "inputs are [B, T, H, ...]"
        )
    if name in _BOTH or (op == "kda" and name in _KDA_ONLY):
        return
    if op == "gdn" and name in _KDA_ONLY:
        default = _DEFAULTS[name]
        if value is default or (type(value) is type(default) and value == default):
            return  # FLA's chunk_gated_delta_rule ignores it; its default is harmless
        raise ValueError(
            f"{name}={value!r} is a chunk_kda option: FLA's chunk_gated_delta_rule ignores it, so "
            f"chunk_gdn refuses it (only the default {name}={default!r})"
        )
    raise ValueError(f"chunk_{op} got an unexpected argument {name}={value!r}")


def _check_dispatch_args(op: str, kw: Mapping[str, Any]) -> None:
    """FLA's dispatch knobs: cp_context (refused: our CP is kernels.cp), use_graph (refused), max_num_seqs (unused)."""
    if kw.get("cp_context") is not None:
        raise ValueError(
            f"cp_context={kw['cp_context']!r} is not supported by chunk_{op}: cpbench's context "
            "parallelism lives in kernels.cp; use kernels.cp.forward (cp_context=None here)"
        )
    if kw.get("use_graph", False):
        raise ValueError(
            f"use_graph=True is not supported by chunk_{op}: cpbench builds its varlen chunk index on the "
            "host from cu_seqlens, which a CUDA graph replay cannot refresh; use use_graph=False"
        )
    value = kw.get("max_num_seqs")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"max_num_seqs must be None or a positive int, got max_num_seqs={value!r}")


def _check_chunk_size(op: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in FLA_CHUNK_SIZES[op]:
        raise ValueError(f"chunk_size must be one of {FLA_CHUNK_SIZES[op]} for chunk_{op} (FLA's), got chunk_size={value!r}")
    return value


def _check_lower_bound(op: str, kw: Mapping[str, Any], gate: bool) -> float | None:
    """lower_bound (kda): a finite float <= 0, read by the in-kernel gate or promised by a precomputed safe gate."""
    value, safe = kw.get("lower_bound"), kw.get("safe_gate", False)
    if value is None:
        if safe and gate:
            raise ValueError(
                "safe_gate=True with use_gate_in_kernel=True needs lower_bound (FLA's rule), got "
                "lower_bound=None; e.g. lower_bound=-5.0"
            )
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 0:
        raise ValueError(f"lower_bound must be a finite float <= 0 (a log decay), got lower_bound={value!r}")
    if not gate and not safe:
        raise ValueError(
            f"lower_bound={value!r} has no effect without use_gate_in_kernel=True or safe_gate=True "
            "(FLA would ignore it); pass one of them or lower_bound=None"
        )
    if safe and gate and not SAFE_LOWER_BOUND <= value < 0:
        raise ValueError(
            f"lower_bound must be in FLA's safe range [-5, 0) with safe_gate=True and "
            f"use_gate_in_kernel=True, got lower_bound={value!r}"
        )
    return float(value)


def _check_intermediate_states(kw: Mapping[str, Any]) -> None:
    """FLA's rule: intermediate states bypass autograd, so inference mode only, and not with disable_recompute."""
    if not torch.is_inference_mode_enabled():
        raise ValueError(
            "return_intermediate_states=True is allowed only under torch.inference_mode() (FLA's rule: "
            "the chunk states bypass autograd)"
        )
    if kw.get("disable_recompute", False):
        raise ValueError("return_intermediate_states=True cannot be combined with disable_recompute=True (FLA's rule)")


def check_fla_backend(op: str, args: FlaArgs, backend: str) -> None:
    """What a resolved backend cannot run: intermediate states on the reference (the per-token recurrence keeps no
    chunk states). Every chunk size FLA takes runs on every backend."""
    if args.return_intermediate_states and backend == "reference":
        raise ValueError(
            "return_intermediate_states=True needs backend 'torch', 'triton' or 'fla', got backend='reference' "
            "(the per-token recurrence keeps no chunk states)"
        )


def check_fla_tensors(op: str, args: FlaArgs, *, k: Tensor, v: Tensor, bounds: Sequence[int] | None) -> None:
    """A_log `[HV]` and dt_bias (gdn `[HV]`, kda `[HV * K]`, any shape with that many elements, as FLA reads them
    flat) on k's device in a float dtype; chunk_indices FLA's `[NT, 2]` (sequence, chunk) pairs of `cu_seqlens`
    (its shape always, its values when it is a CPU tensor: no device read)."""
    HV, K = v.shape[2], k.shape[-1]
    sizes = {"A_log": (HV, "[HV]"), "dt_bias": (HV, "[HV]") if op == "gdn" else (HV * K, "[HV * K]")}
    for name, (numel, dims) in sizes.items():
        x = getattr(args, name)
        if x is None:
            continue
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise ValueError(f"{name} must be a float torch.Tensor of shape {dims}, got {name}={_describe(x)}")
        if x.numel() != numel:
            raise ValueError(f"{name} must hold {dims} = {numel} elements (HV={HV}, K={K}), got {name}.shape={tuple(x.shape)}")
        if x.device != k.device:
            raise ValueError(f"{name} is on {x.device} but k is on {k.device}")
    if args.chunk_indices is not None:
        _check_chunk_indices(args.chunk_indices, bounds, args.chunk_size)


def _check_chunk_indices(ci: Any, bounds: Sequence[int] | None, chunk_size: int) -> None:
    if bounds is None:
        raise ValueError(
            "chunk_indices is given without cu_seqlens: it indexes the chunks of a varlen batch; pass "
            "cu_seqlens or chunk_indices=None"
        )
    pairs = [(n, j) for n in range(len(bounds) - 1) for j in range(-(-(bounds[n + 1] - bounds[n]) // chunk_size))]
    if not isinstance(ci, Tensor) or ci.dtype not in (torch.int32, torch.int64) or tuple(ci.shape) != (len(pairs), 2):
        raise ValueError(
            f"chunk_indices must be an int32/int64 tensor [NT, 2] = {(len(pairs), 2)} (the chunks of "
            f"cu_seqlens at chunk_size={chunk_size}), got {_describe(ci)}"
        )
    if ci.device.type == "cpu" and ci.tolist() != [list(p) for p in pairs]:
        raise ValueError(
            f"chunk_indices does not match cu_seqlens (its (sequence, chunk) pairs at chunk_size="
            f"{chunk_size}); pass chunk_indices=None or FLA's prepare_chunk_indices(cu_seqlens, {chunk_size})"
        )


def _describe(x: Any) -> str:
    return f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else repr(x)
