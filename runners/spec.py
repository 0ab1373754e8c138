"""Sweep specs: what a user submits (YAML/JSON file, the REST API or code), validated with clear errors.

A spec names ops, CP modes, backends and axes; their cartesian product (`runners.grid.expand`) is the grid.
Every axis takes a list or a single value. Example (`runners/suites/demo.yaml` is a complete one):

    name: gdn-cp-scaling
    tags: [nightly]
    ops: [gdn]
    modes: [none, all_gather, true_cp, ring, headwise]
    backends: [triton]
    axes: {B: 1, T: [8192, 32768], H: 16, K: 128, V: 128, lb: [-1.0, -0.05], W: [1, 2], dtype: bfloat16}
    seeds: [0]
    timing: {min_samples: 10, max_samples: 200, max_rel_iqr: 0.02}

`tune: true` tunes the Triton launch configs of each point's kernels before timing it (triton backend only);
`tuning: {strategy: random, budget: 8, samples: 10}` bounds that search (`TuningSpec`; its defaults are
`runners.tuner.spec.TuneSpec`'s: halving over the whole space).

`mode_options` holds the knobs of the multi-device modes (`true_cp: {segment_len: 4096}`) and a backend's own
options: a peer's (`fla: {bypass_hopper_guard: true}`) or our triton backend's recompute policy (`triton: {keep:
wy+states}`, one of `kernels.vocabulary.KEEP_POLICIES`: auto (the default, per op), inputs, ag, ag+states, wy, wy+states),
which a point carries (and its key names) only where it
takes effect: fwd+bwd in the modes that train through the autograd op (`runners.backend_options`).

Limits (`runners.settings`): points per sweep, tokens per point, CP size. Errors are `SpecError`s whose message
names the field (`axes.T.0: ...`) and the value received. `direction`: `fwd` (the forward step) or `fwd+bwd` (a
training step: forward, then backward with a fixed output gradient).

The real models' call (axes too): `gate: precomputed | in_kernel | safe` (`precomputed`, the default: g drawn with
`lb`; `in_kernel`: g = -exp(A_log) softplus(g_raw + dt_bias), KDA's `use_gate_in_kernel`; `safe`: g = lower_bound *
sigmoid(exp(A_log) (g_raw + dt_bias)), KDA's `safe_gate`, at each `lower_bound` in [-5, 0), default -5; A_log, dt_bias
and g_raw drawn from the seed) and `l2norm_in_kernel: true | false` (q and k L2-normalised in the step, FLA's
`use_qk_l2norm_in_kernel`). A point carries them (and its key names them) only where they differ from their default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kernels.vocabulary import (
    BENCHMARKED_BACKENDS,
    MODE_OPTIONS,
    MODES,
    POINT_DIRECTIONS,
    SINGLE_DEVICE,
    tail_exchange_options,
)
from runners.errors import SpecError
from runners.point import DEFAULT_LOWER_BOUND
from runners.settings import get_worker_settings
from runners.timing import StopRule
from runners.tuner.spec import Strategy, TuneSpec

__all__ = [
    "MODES",
    "Axes",
    "CheckSpec",
    "SweepSpec",
    "TimingSpec",
    "TuningSpec",
    "WarmupCorrectSpec",
    "grid_size",
    "load_spec",
    "load_specs",
    "parse_spec",
]

# the names a spec may use (ops, modes, backends, layouts, directions, dtypes) are kernels.vocabulary's; the typed
# Literal fields below restate ops, layouts and dtypes for the type checker (tests/runners/test_spec.py pins them)

# Strict: a JSON `true` is not the number 1. Every integer is bounded to fit a 32-bit column on both stores.
INT32_MAX = 2**31 - 1
PosInt = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
Seed = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]
Number = Annotated[float, Strict()]  # an int or a float, never a bool; finiteness is the models' allow_inf_nan=False
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


def _listify(value: Any) -> Any:
    """Axis shorthand: a single value stands for a one-element list."""
    if value is None or isinstance(value, (list, tuple)):
        return value
    return [value]


_SCALARS = frozenset((int, bool, float, str, type(None)))
_FLAT = frozenset((int, bool, type(None)))  # values `_clean_values` need not look at one by one


def _hashable(value: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        return value
    if set(map(type, value)) <= _SCALARS:  # a flat list (a long varlen length list): one C-level pass
        return tuple(value)
    return tuple(_hashable(v) for v in value)


def _all_ints(values: Any) -> bool:
    """Every item of `values` (an iterable) is an int or a bool: their sum is an int (one C-level pass, about twice
    as fast as collecting the item types; a float, a string, None or a container makes it a float or a TypeError)."""
    try:
        return type(sum(values)) is int
    except TypeError:
        return False


def _clean_values(data: Any) -> bool:
    """No NUL in a string and no non-finite float anywhere in `data`: the fast pass of `_refuse_bad_values`, with
    no locations (a flat list of ints, e.g. a 1 MiB varlen length list, costs one C-level pass)."""
    stack = [data]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is str:
            if "\x00" in x:
                return False
        elif t is float:
            if not math.isfinite(x):
                return False
        elif t is list or t is tuple:
            if _all_ints(x):  # a long varlen length list
                continue
            types = set(map(type, x))
            if types <= _FLAT:
                continue
            if types == {list} and _all_ints(chain.from_iterable(x)):  # many varlen length lists: in C
                continue
            stack.extend(x)
        elif t is dict:
            stack.extend(x)
            stack.extend(x.values())
        elif t not in _SCALARS:  # subclasses and other containers: the careful walk decides
            return False
    return True


def _distinct_flat_lists(values: list[Any]) -> bool:
    """`values` are lists of scalars, none twice: the common case of `_no_duplicates` (10,000 varlen length lists),
    decided in C; False sends the values to the careful pass. Distinct hashes mean distinct lists (equal ones, a
    collision included, go to the careful pass); keeping the hashes, not the tuples, frees each tuple at once (10,000
    live tuples would also start collections)."""
    if not values or set(map(type, values)) != {list}:
        return False
    try:
        return len(set(map(hash, map(tuple, values)))) == len(values)
    except TypeError:  # a list inside a list: not flat
        return False


def _no_duplicates(values: list[Any], what: str) -> list[Any]:
    """O(n): a set of the values (lists as tuples), so a huge axis cannot stall the server while it is checked."""
    if _distinct_flat_lists(values):
        return values
    seen: set[Any] = set()
    dups: list[Any] = []
    for v in values:
        h = _hashable(v)
        if h in seen:
            if len(dups) < 10:
                dups.append(v)
        else:
            seen.add(h)
    if dups:
        raise PydanticCustomError("duplicate", "{what} lists a value twice: {dups}", {"what": what, "dups": repr(dups)})
    if not values:
        raise PydanticCustomError("empty", "{what} must not be empty", {"what": what})
    return values


def _at_most(name: str, value: float, limit: float, setting: str) -> None:
    if value > limit:
        raise PydanticCustomError("limit", "{name}={v} is more than the limit {m} ({s})", {"name": name, "v": value, "m": limit, "s": setting})


def _count(value: Any) -> int:
    return max(1, len(value)) if isinstance(value, (list, tuple)) else 1


def _refuse_oversized(data: Any) -> None:
    """The grid size from the raw lists' lengths alone (an upper bound of `grid_size`), so a body whose grid cannot
    fit the points limit is refused in O(number of axes), before its values are validated one by one."""
    if not isinstance(data, Mapping):
        return
    raw_axes = data.get("axes")
    axes: Mapping[str, Any] = raw_axes if isinstance(raw_axes, Mapping) else {}
    lengths = axes.get("lengths")
    varlen = (1 if lengths and all(not isinstance(v, (list, tuple)) for v in lengths) else _count(lengths)) if lengths else 0
    shapes = _count(axes.get("B", 1)) * (_count(axes.get("T")) if axes.get("T") is not None else 0) + varlen
    n = max(shapes, 1)
    for key in ("H", "K", "V", "lb", "W", "layout", "direction", "dtype", "l2norm_in_kernel"):
        n *= _count(axes.get(key, 1))
    n *= _count(axes.get("gate", 1)) * _count(axes.get("lower_bound", 1))  # at most: only `safe` takes lower_bound
    for key in ("ops", "modes", "backends", "seeds"):
        n *= _count(data.get(key, 1))
    reps = data.get("repetitions", 1)
    n *= reps if isinstance(reps, int) and not isinstance(reps, bool) and 1 <= reps <= 100 else 1
    limit = get_worker_settings().MAX_POINTS_PER_SWEEP
    if n > limit:
        raise PydanticCustomError(
            "limit",
            "the grid has {n} points, more than the limit {m} per sweep (CPBENCH_MAX_POINTS_PER_SWEEP); shrink the axes",
            {"n": n, "m": limit},
        )


def _refuse_many_mode_options(data: Any) -> None:
    """`mode_options` keys are CP modes or backends of the spec: more keys than those can be refused at once."""
    opts = data.get("mode_options") if isinstance(data, Mapping) else None
    backends = data.get("backends") if isinstance(data, Mapping) else None
    most = len(MODES) + (len(backends) if isinstance(backends, (list, tuple)) else 1)
    if isinstance(opts, Mapping) and len(opts) > most:
        raise PydanticCustomError("mode", "mode_options has {n} keys; its keys are CP modes ({ok}) or backends of the spec",
                                  {"n": len(opts), "ok": ", ".join(x for x in MODES if x not in SINGLE_DEVICE)})


def _refuse_bad_values(data: Any) -> None:
    """One walk over the raw input: a NUL in any string or a non-finite number anywhere (mode_options included)
    is refused, since neither JSON nor PostgreSQL can hold it. The walk that names the location runs only when the
    fast pass (`_clean_values`) finds something."""
    if _clean_values(data):
        return
    stack: list[tuple[str, Any]] = [("spec", data)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, str):
            if "\x00" in x:
                raise PydanticCustomError("nul", "{where}: text must not contain a NUL character", {"where": where})
        elif isinstance(x, float):
            if not math.isfinite(x):
                raise PydanticCustomError("finite_number", "{where}: numbers must be finite (no NaN or Infinity)", {"where": where})
        elif isinstance(x, Mapping):
            for k, v in x.items():
                stack.append((where, k))
                stack.append((f"{where}.{k}" if isinstance(k, str) and "\x00" not in k else where, v))
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{where}.{i}", v) for i, v in enumerate(x))


class Axes(BaseModel):
    """The grid axes. Each is a list (a single value is accepted for a one-element list)."""

    model_config = _STRICT

    B: list[PosInt] = [1]
    T: list[PosInt] | None = None  # dense sequence lengths (B sequences of T tokens)
    lengths: list[list[PosInt]] | None = None  # varlen: each entry is one batch's sequence lengths (B = 1)
    H: list[PosInt] = [4]
    HV: list[PosInt] | None = None  # value heads (grouped: a multiple of H; q/k head h // (HV/H) serves value head h); default H
    K: list[PosInt] = [64]
    V: list[PosInt] = [64]
    lb: list[Number] = [-1.0]  # decay lower bound: g = lb * sigmoid(x), so lb <= g <= 0
    W: list[PosInt] = [1]  # CP size (ranks)
    layout: list[Literal["contiguous", "zigzag"]] = ["contiguous"]
    direction: list[str] = ["fwd"]
    dtype: list[Literal["float32", "bfloat16", "float16"]] = ["bfloat16"]
    gate: list[Literal["precomputed", "in_kernel", "safe"]] = ["precomputed"]  # runners.point.GATES
    lower_bound: list[Number] = [DEFAULT_LOWER_BOUND]  # the safe gate's bound, in [-5, 0); only `gate: safe` takes it
    l2norm_in_kernel: list[Annotated[bool, Strict()]] = [False]

    @field_validator("B", "T", "H", "HV", "K", "V", "lb", "W", "layout", "direction", "dtype", "gate", "lower_bound",
                     "l2norm_in_kernel", mode="before")
    @classmethod
    def _wrap(cls, value: Any) -> Any:
        return _listify(value)

    @field_validator("lengths", mode="before")
    @classmethod
    def _wrap_lengths(cls, value: Any) -> Any:
        # `lengths: [100, 156]` is one varlen batch; `lengths: [[100, 156], [256]]` are two
        if isinstance(value, (list, tuple)) and value and all(not isinstance(v, (list, tuple)) for v in value):
            return [list(value)]
        return value

    @field_validator("B", "T", "H", "HV", "K", "V", "lb", "W", "layout", "dtype", "lengths", "gate", "lower_bound",
                     "l2norm_in_kernel")
    @classmethod
    def _unique(cls, value: Any, info: Any) -> Any:
        if value is None:
            return value
        return _no_duplicates(value, f"axis {info.field_name}")

    @field_validator("lb")
    @classmethod
    def _lb(cls, value: list[float]) -> list[float]:
        for x in value:
            if not math.isfinite(x) or x > 0:
                raise PydanticCustomError(
                    "lb", "the decay lower bound must be finite and <= 0 (g = lb * sigmoid(x)), got {x}", {"x": x}
                )
        return value

    @field_validator("lower_bound")
    @classmethod
    def _lower_bound(cls, value: list[float]) -> list[float]:
        for x in value:
            if not -5.0 <= x < 0.0:
                raise PydanticCustomError(
                    "lower_bound", "the safe gate's lower_bound must be in [-5, 0) (FLA's safe_gate), got {x}", {"x": x}
                )
        return value

    def gates(self) -> list[tuple[str, float]]:
        """(gate, lower_bound) pairs of the grid: every lower_bound for `safe`, the default for the others."""
        return [(g, lb) for g in self.gate for lb in (self.lower_bound if g == "safe" else [DEFAULT_LOWER_BOUND])]

    @field_validator("direction")
    @classmethod
    def _direction(cls, value: list[str]) -> list[str]:
        for d in value:
            if d not in POINT_DIRECTIONS:
                raise PydanticCustomError("direction", "unknown direction '{d}'; expected one of {ok}", {"d": d, "ok": ", ".join(POINT_DIRECTIONS)})
        return _no_duplicates(value, "axis direction")

    @field_validator("T")
    @classmethod
    def _t_limit(cls, value: list[int] | None) -> list[int] | None:
        m = get_worker_settings().MAX_T
        for t in value or []:
            if t > m:
                raise PydanticCustomError("limit", "T={t} is more than the limit of {m} tokens (CPBENCH_MAX_T)", {"t": t, "m": m})
        return value

    @field_validator("lengths")
    @classmethod
    def _lengths_limit(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        m = get_worker_settings().MAX_T
        if not value or (all(value) and max(map(sum, value)) <= m):  # the common case, in C
            return value
        for lens in value:
            if not lens:
                raise PydanticCustomError("empty", "a varlen length list must not be empty", {})
            if sum(lens) > m:
                raise PydanticCustomError(
                    "limit", "a length list sums to {s} tokens, more than the limit of {m} (CPBENCH_MAX_T)", {"s": sum(lens), "m": m}
                )
        return value

    @field_validator("B", "H", "K", "V")
    @classmethod
    def _dim_limit(cls, value: list[int], info: Any) -> list[int]:
        m = getattr(get_worker_settings(), f"MAX_{info.field_name}")
        for x in value:
            _at_most(info.field_name, x, m, f"CPBENCH_MAX_{info.field_name}")
        return value

    @field_validator("W")
    @classmethod
    def _w_limit(cls, value: list[int]) -> list[int]:
        m = get_worker_settings().MAX_W
        for w in value:
            if w > m:
                raise PydanticCustomError("limit", "W={w} is more than the limit {m} (CPBENCH_MAX_W)", {"w": w, "m": m})
        return value

    @model_validator(mode="after")
    def _shapes(self) -> Axes:
        if self.T is None and self.lengths is None:
            raise PydanticCustomError("missing_T", "give T (dense lengths) or lengths (varlen length lists)", {})
        return self


class TimingSpec(BaseModel):
    """Stop rule and warmup of the timing loop: `runners.timing.StopRule`'s fields, whose defaults are the only
    definition (this adds the bounds a spec is checked against)."""

    model_config = _STRICT

    min_samples: PosInt = StopRule.min_samples
    max_samples: PosInt = StopRule.max_samples
    min_time_s: Number = Field(StopRule.min_time_s, ge=0)
    max_rel_iqr: Number = Field(StopRule.max_rel_iqr, gt=0)
    timeout_s: Number = Field(StopRule.timeout_s, gt=0)
    warmup_s: Number = Field(StopRule.warmup_s, ge=0)
    warmup_min_iters: PosInt = StopRule.warmup_min_iters
    flush_l2: bool = StopRule.flush_l2

    @model_validator(mode="after")
    def _bounds(self) -> TimingSpec:
        s = get_worker_settings()
        _at_most("max_samples", self.max_samples, s.MAX_SAMPLES, "CPBENCH_MAX_SAMPLES")
        for name in ("min_time_s", "timeout_s", "warmup_s"):
            _at_most(name, getattr(self, name), s.MAX_POINT_S, "CPBENCH_MAX_POINT_S")
        return self

    @model_validator(mode="after")
    def _order(self) -> TimingSpec:
        if self.max_samples < self.min_samples:
            raise PydanticCustomError(
                "order", "max_samples ({mx}) must be >= min_samples ({mn})", {"mx": self.max_samples, "mn": self.min_samples}
            )
        return self


class CheckSpec(BaseModel):
    """The correctness gate before timing. A tolerance of None takes the dtype's default (`runners.correctness`)."""

    model_config = _STRICT

    tol_none: Number | None = Field(None, gt=0)  # relative L2 error vs `none` on the same inputs
    tol_reference: Number | None = Field(None, gt=0)  # relative L2 error vs the fp32 reference, reduced shape
    reference_tokens: Annotated[int, Strict()] = Field(256, ge=16, le=1 << 16)  # tokens of the reduced shape (at most; kept divisible for the layout)
    reference: bool = True  # run the reference check at all


_TUNE = TuneSpec()  # the tuner's defaults


class TuningSpec(BaseModel):
    """How a sweep with `tune: true` searches each kernel's space (fields and defaults of `runners.tuner.spec.TuneSpec`)."""

    model_config = _STRICT

    strategy: Strategy = Field(_TUNE.strategy)
    budget: Annotated[int, Strict()] | None = Field(_TUNE.budget, ge=1, le=100_000)  # configs measured per kernel and key (random; halving's first rung); None = all
    samples: Annotated[int, Strict()] = Field(_TUNE.samples, ge=1, le=100_000)  # samples per config (exhaustive, random)
    min_samples: Annotated[int, Strict()] = Field(_TUNE.min_samples, ge=1, le=100_000)  # halving: samples per config on the first rung
    max_samples: Annotated[int, Strict()] = Field(_TUNE.max_samples, ge=1, le=100_000)  # halving: cap on the samples per config of later rungs

    @model_validator(mode="after")
    def _order(self) -> TuningSpec:
        if self.max_samples < self.min_samples:
            raise PydanticCustomError(
                "order", "max_samples ({mx}) must be >= min_samples ({mn})", {"mx": self.max_samples, "mn": self.min_samples}
            )
        return self


class WarmupCorrectSpec(BaseModel):
    """Options of the `warmup_correct` mode (FlashKDA's one-device scheme; `kernels.cp.warmup_correct`)."""

    model_config = _STRICT

    segments: PosInt | Literal["auto"] = "auto"  # segments of the longest sequence ("auto": from SMs and H; CPU: 4)
    tol: Number = Field(MODE_OPTIONS["warmup_correct"]["tol"], gt=0, lt=1)  # bound on the relative error of each warmup-built entering state
    window: PosInt | Literal["auto"] = "auto"  # warmup chunks (64 tokens) per segment
    # auto: exact maps only for the segments whose per-channel decay bound fails (decided on the device);
    # exact: exact maps for every segment; none: warmup windows only (error reported, not bounded)
    fallback: Literal["auto", "exact", "none"] = "auto"

    @field_validator("segments", "window")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise PydanticCustomError("positive", "must be 'auto' or an int >= 1, got {v}", {"v": value})
        return value


class SweepSpec(BaseModel):
    """A sweep as submitted. `model_dump(mode="json")` is what the store keeps in `sweeps.spec`."""

    model_config = _STRICT

    name: str = Field(min_length=1, max_length=255)
    tags: list[Annotated[str, Field(max_length=64)]] = Field([], max_length=32)
    ops: list[Literal["gdn", "kda"]]
    modes: list[str]
    backends: list[str] = ["torch"]
    axes: Axes
    seeds: list[Seed] = [0]
    repetitions: Annotated[int, Strict()] = Field(1, ge=1, le=100)  # independent runs (points) per grid cell, same key
    timing: TimingSpec = Field(default_factory=TimingSpec)  # a factory: its limits are read when a spec is parsed
    check: CheckSpec = CheckSpec()
    warmup_correct: WarmupCorrectSpec = WarmupCorrectSpec()
    mode_options: dict[str, dict[str, Any]] = {}  # per-mode knobs passed to kernels.cp.forward (e.g. segment_len)
    profile: bool = True  # profile one step per point (collectives, syncs, launches, trace file)
    tune: bool = False  # tune the Triton launch configs of the point's kernels first (runners.tuner)
    tuning: TuningSpec = TuningSpec()  # the search `tune: true` runs (strategy, budget, samples)
    device: Literal["any", "cuda", "cpu"] = "any"  # which workers may claim the points
    max_attempts: Annotated[int, Strict()] = Field(3, ge=1, le=20)  # tries per point before it stays failed

    @model_validator(mode="before")
    @classmethod
    def _clean(cls, data: Any) -> Any:
        _refuse_oversized(data)  # first: a huge body is refused before any per-value work
        _refuse_many_mode_options(data)
        _refuse_bad_values(data)
        return data

    @field_validator("ops", "modes", "backends", "seeds", "tags", mode="before")
    @classmethod
    def _wrap(cls, value: Any) -> Any:
        return _listify(value)

    @field_validator("ops", "modes", "backends", "seeds")
    @classmethod
    def _unique(cls, value: list[Any], info: Any) -> list[Any]:
        return _no_duplicates(value, info.field_name)

    @field_validator("modes")
    @classmethod
    def _modes(cls, value: list[str]) -> list[str]:
        for m in value:
            if m not in MODES:
                raise PydanticCustomError("mode", "unknown mode '{m}'; expected one of {ok}", {"m": m, "ok": ", ".join(MODES)})
        return value

    @field_validator("mode_options")
    @classmethod
    def _mode_options(cls, value: dict[str, dict[str, Any]], info: Any) -> dict[str, dict[str, Any]]:
        value = dict(value)
        # `fla: {...}` / `triton: {keep: ...}`: a backend's own options
        peers = _peer_options(info.data.get("backends") or [], value)
        for m in peers:
            value.pop(m)
        for m in value:
            if m not in MODES or m in SINGLE_DEVICE:
                raise PydanticCustomError(
                    "mode", "mode_options keys are CP modes ({ok}) or a peer backend of the spec (fla) or triton "
                    "(when the spec has it); got '{m}'",
                    {"m": m, "ok": ", ".join(x for x in MODES if x not in SINGLE_DEVICE)},
                )
        for m, opts in value.items():
            known = MODE_OPTIONS[m]
            unknown = sorted(set(opts) - set(known))
            if unknown:
                raise PydanticCustomError(
                    "mode_option", "unknown option(s) {u} for mode '{m}'; known: {ok}",
                    {"u": ", ".join(unknown), "m": m, "ok": ", ".join(sorted(known)) or "none"},
                )
            if m == "tail_exchange":
                try:
                    tail_exchange_options({**known, **opts})
                except ValueError as err:
                    raise PydanticCustomError("mode_option", "tail_exchange: {e}", {"e": str(err)}) from None
        return {**value, **peers}

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str]) -> list[str]:
        # torch, triton, fla, or a peer plugin (an entry point name or `package.module:object`; runners.plugins)
        from runners.plugins import is_ours, load_peer

        names: dict[str, str] = {}
        for b in value:
            if is_ours(b):
                continue
            try:
                name = load_peer(b).name
            except ValueError as err:
                raise PydanticCustomError("backend", "{e} (backends are {ok}, or a plugin)",
                                          {"e": str(err), "ok": ", ".join(BENCHMARKED_BACKENDS)}) from None
            if name in names.values() or name in BENCHMARKED_BACKENDS and b != name:
                raise PydanticCustomError("backend", "backend {b} is named '{n}', like another backend", {"b": b, "n": name})
            names[b] = name
        return value

    @model_validator(mode="after")
    def _limit(self) -> SweepSpec:
        n, limit = grid_size(self), get_worker_settings().MAX_POINTS_PER_SWEEP
        if n > limit:
            raise PydanticCustomError(
                "limit",
                "the grid has {n} points, more than the limit {m} per sweep (CPBENCH_MAX_POINTS_PER_SWEEP); shrink the axes",
                {"n": n, "m": limit},
            )
        return self


def _peer_options(backends: list[str], value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The entries of `mode_options` that name a backend of the spec with options: a peer (`fla:
    {bypass_hopper_guard: true}`, checked against its declared `options`) or ours (`triton: {keep: wy+states}`,
    runners.backend_options)."""
    from runners import backend_options
    from runners.plugins import is_ours, load_peer

    out: dict[str, dict[str, Any]] = {}
    for ref in backends:
        if is_ours(ref):
            if ref in value:
                try:
                    out[ref] = backend_options.check(ref, value[ref])
                except ValueError as err:
                    raise PydanticCustomError("mode_option", "{e}", {"e": str(err)}) from None
            continue
        peer = load_peer(ref)
        if peer.name in value:
            known = dict(getattr(peer, "options", {}) or {})
            unknown = sorted(set(value[peer.name]) - set(known))
            if unknown:
                raise PydanticCustomError(
                    "mode_option", "unknown option(s) {u} for backend '{m}'; known: {ok}",
                    {"u": ", ".join(unknown), "m": peer.name, "ok": ", ".join(sorted(known)) or "none"},
                )
            out[peer.name] = dict(value[peer.name])
    return out


def grid_size(spec: SweepSpec) -> int:
    """Number of points the spec expands to (skipped ones included), computed without expanding."""
    a = spec.axes
    shapes = len(a.B) * len(a.T or []) + len(a.lengths or [])
    return (
        len(spec.ops) * len(spec.backends) * len(a.dtype) * len(a.direction) * len(a.layout) * shapes
        * len(a.H) * len(a.HV or [0]) * len(a.K) * len(a.V) * len(a.lb) * len(a.W) * len(spec.modes) * len(spec.seeds) * spec.repetitions
        * len(a.gates()) * len(a.l2norm_in_kernel)
    )


def _format_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "spec"
        msg = e["msg"]
        if e["type"] in ("missing",):
            parts.append(f"{loc}: field required")
            continue
        got = e.get("input")
        shown = ""
        if got is not None and not isinstance(got, (dict, BaseModel)) and repr(got) not in msg and str(got) not in msg:
            shown = f" (got {got!r})"
        if len(shown) > 120:
            shown = shown[:117] + "...)"
        parts.append(f"{loc}: {msg}{shown}")
    return "; ".join(parts)


def parse_spec(data: Any, *, source: str | None = None) -> SweepSpec:
    """Validate a mapping (parsed YAML/JSON or an API body) into a `SweepSpec`; `SpecError` names each bad field."""
    if isinstance(data, SweepSpec):
        return data
    where = f"invalid sweep spec {source}" if source else "invalid sweep spec"
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return SweepSpec.model_validate(dict(data))
    except ValidationError as err:
        raise SpecError(f"{where}: {_format_errors(err)}") from None


def _documents(path: str | Path) -> tuple[Path, list[Any]]:
    """The parsed documents of a spec file: JSON (one), or YAML (one or several, separated by `---`)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(f"spec file {p} not found") from None
    except OSError as err:
        raise SpecError(f"cannot read spec file {p}: {err.strerror}") from None
    try:
        if p.suffix.lower() == ".json":
            return p, [json.loads(text)]
        return p, [d for d in yaml.safe_load_all(text) if d is not None] or [None]
    except json.JSONDecodeError as err:
        raise SpecError(f"malformed JSON in {p}: line {err.lineno} column {err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"malformed YAML in {p}: {where}{problem}") from None


def load_spec(path: str | Path) -> SweepSpec:
    """Read a sweep spec from a YAML or JSON file (by suffix; YAML otherwise) and validate it."""
    p, docs = _documents(path)
    if len(docs) > 1:
        raise SpecError(f"spec file {p} holds {len(docs)} sweeps (YAML documents); load it with runners.spec.load_specs "
                        f"or queue them with `cpbench submit`")
    return parse_spec(docs[0], source=str(p))


def load_specs(path: str | Path) -> list[SweepSpec]:
    """Every sweep spec of a file: one per YAML document (`---` between them; a suite such as
    runners/suites/models.yaml holds one sweep per model), each validated; a JSON file holds one."""
    p, docs = _documents(path)
    return [parse_spec(d, source=str(p) if len(docs) == 1 else f"{p} (document {i + 1})") for i, d in enumerate(docs)]
