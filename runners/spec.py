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
`tuning: {strategy: random, budget: 8, samples: 10}` bounds that search (`TuneSpec`; default: halving over the
whole space).

Limits (`runners.settings`): points per sweep, tokens per point, CP size. Errors are `SpecError`s whose message
names the field (`axes.T.0: ...`) and the value received. `direction`: `fwd` (the forward step) or `fwd+bwd` (a
training step: forward, then backward with a fixed output gradient).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from runners.errors import SpecError
from runners.settings import get_worker_settings

__all__ = [
    "BACKENDS",
    "DIRECTIONS",
    "DTYPES",
    "LAYOUTS",
    "MODES",
    "OPS",
    "Axes",
    "CheckSpec",
    "SweepSpec",
    "TimingSpec",
    "TuneSpec",
    "WarmupCorrectSpec",
    "grid_size",
    "load_spec",
    "parse_spec",
]

OPS = ("gdn", "kda")
# every mode the suite knows (DESIGN §2); whether the installed kernels.cp implements one is the grid's business
MODES = ("none", "headwise", "all_gather", "ring", "true_cp", "warmup_correct", "tail_exchange")
# benchmarked backends; "reference" (per-token fp32) is the correctness yardstick, not a contender
BACKENDS = ("torch", "triton", "fla")
LAYOUTS = ("contiguous", "zigzag")
DIRECTIONS = ("fwd", "fwd+bwd")
DTYPES = ("float32", "bfloat16", "float16")
# modes that run on one device (W must be 1)
SINGLE_DEVICE_MODES = ("none", "warmup_correct")

PosInt = Annotated[int, Field(ge=1)]


def _listify(value: Any) -> Any:
    """Axis shorthand: a single value stands for a one-element list."""
    if value is None or isinstance(value, (list, tuple)):
        return value
    return [value]


def _no_duplicates(values: list[Any], what: str) -> list[Any]:
    seen: list[Any] = []
    dups: list[Any] = []
    for v in values:
        (dups if v in seen else seen).append(v)
    if dups:
        raise PydanticCustomError("duplicate", "{what} lists a value twice: {dups}", {"what": what, "dups": repr(dups)})
    if not values:
        raise PydanticCustomError("empty", "{what} must not be empty", {"what": what})
    return values


class Axes(BaseModel):
    """The grid axes. Each is a list (a single value is accepted for a one-element list)."""

    model_config = ConfigDict(extra="forbid")

    B: list[PosInt] = [1]
    T: list[PosInt] | None = None  # dense sequence lengths (B sequences of T tokens)
    lengths: list[list[PosInt]] | None = None  # varlen: each entry is one batch's sequence lengths (B = 1)
    H: list[PosInt] = [4]
    HV: list[PosInt] | None = None  # value heads (grouped: a multiple of H; q/k head h // (HV/H) serves value head h); default H
    K: list[PosInt] = [64]
    V: list[PosInt] = [64]
    lb: list[float] = [-1.0]  # decay lower bound: g = lb * sigmoid(x), so lb <= g <= 0
    W: list[PosInt] = [1]  # CP size (ranks)
    layout: list[Literal["contiguous", "zigzag"]] = ["contiguous"]
    direction: list[str] = ["fwd"]
    dtype: list[Literal["float32", "bfloat16", "float16"]] = ["bfloat16"]

    @field_validator("B", "T", "H", "HV", "K", "V", "lb", "W", "layout", "direction", "dtype", mode="before")
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

    @field_validator("B", "T", "H", "HV", "K", "V", "lb", "W", "layout", "dtype", "lengths")
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

    @field_validator("direction")
    @classmethod
    def _direction(cls, value: list[str]) -> list[str]:
        for d in value:
            if d not in DIRECTIONS:
                raise PydanticCustomError("direction", "unknown direction '{d}'; expected one of {ok}", {"d": d, "ok": ", ".join(DIRECTIONS)})
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
        for lens in value or []:
            if not lens:
                raise PydanticCustomError("empty", "a varlen length list must not be empty", {})
            if sum(lens) > m:
                raise PydanticCustomError(
                    "limit", "a length list sums to {s} tokens, more than the limit of {m} (CPBENCH_MAX_T)", {"s": sum(lens), "m": m}
                )
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
    """Stop rule and warmup of the timing loop (`runners.timing.StopRule`, same names and defaults)."""

    model_config = ConfigDict(extra="forbid")

    min_samples: int = Field(10, ge=1)
    max_samples: int = Field(200, ge=1)
    min_time_s: float = Field(0.5, ge=0)
    max_rel_iqr: float = Field(0.02, gt=0)
    timeout_s: float = Field(15.0, gt=0)
    warmup_s: float = Field(0.025, ge=0)
    warmup_min_iters: int = Field(2, ge=1)
    flush_l2: bool = True

    @model_validator(mode="after")
    def _order(self) -> TimingSpec:
        if self.max_samples < self.min_samples:
            raise PydanticCustomError(
                "order", "max_samples ({mx}) must be >= min_samples ({mn})", {"mx": self.max_samples, "mn": self.min_samples}
            )
        return self


class CheckSpec(BaseModel):
    """The correctness gate before timing. A tolerance of None takes the dtype's default (`runners.correctness`)."""

    model_config = ConfigDict(extra="forbid")

    tol_none: float | None = Field(None, gt=0)  # relative L2 error vs `none` on the same inputs
    tol_reference: float | None = Field(None, gt=0)  # relative L2 error vs the fp32 reference, reduced shape
    reference_tokens: int = Field(256, ge=16)  # tokens of the reduced shape (at most; kept divisible for the layout)
    reference: bool = True  # run the reference check at all


class TuneSpec(BaseModel):
    """How a sweep with `tune: true` searches each kernel's space (`runners.tuner.tune_case`: same names and defaults)."""

    model_config = ConfigDict(extra="forbid")

    strategy: Literal["exhaustive", "random", "halving"] = "halving"
    budget: int | None = Field(None, ge=1)  # configs measured per kernel and key (random; halving's first rung); None = all
    samples: int = Field(20, ge=1)  # samples per config (exhaustive, random)
    min_samples: int = Field(5, ge=1)  # halving: samples per config on the first rung
    max_samples: int = Field(60, ge=1)  # halving: cap on the samples per config of later rungs

    @model_validator(mode="after")
    def _order(self) -> TuneSpec:
        if self.max_samples < self.min_samples:
            raise PydanticCustomError(
                "order", "max_samples ({mx}) must be >= min_samples ({mn})", {"mx": self.max_samples, "mn": self.min_samples}
            )
        return self


class WarmupCorrectSpec(BaseModel):
    """Options of the `warmup_correct` mode (FlashKDA's one-device scheme; `kernels.cp.warmup_correct`)."""

    model_config = ConfigDict(extra="forbid")

    segments: int | Literal["auto"] = "auto"  # segments of the longest sequence ("auto": from SMs and H; CPU: 4)
    tol: float = Field(1e-3, gt=0, lt=1)  # bound on the relative error of each warmup-built entering state
    window: int | Literal["auto"] = "auto"  # warmup chunks (64 tokens) per segment
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

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    tags: list[str] = []
    ops: list[Literal["gdn", "kda"]]
    modes: list[str]
    backends: list[str] = ["torch"]
    axes: Axes
    seeds: list[int] = [0]
    repetitions: int = Field(1, ge=1, le=100)  # independent runs (points) per grid cell, same key
    timing: TimingSpec = TimingSpec()
    check: CheckSpec = CheckSpec()
    warmup_correct: WarmupCorrectSpec = WarmupCorrectSpec()
    mode_options: dict[str, dict[str, Any]] = {}  # per-mode knobs passed to kernels.cp.forward (e.g. segment_len)
    profile: bool = True  # profile one step per point (collectives, syncs, launches, trace file)
    tune: bool = False  # tune the Triton launch configs of the point's kernels first (runners.tuner)
    tuning: TuneSpec = TuneSpec()  # the search `tune: true` runs (strategy, budget, samples)
    device: Literal["any", "cuda", "cpu"] = "any"  # which workers may claim the points
    max_attempts: int = Field(3, ge=1, le=20)  # tries per point before it stays failed

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
    def _mode_options(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for m in value:
            if m not in MODES or m in SINGLE_DEVICE_MODES:
                raise PydanticCustomError(
                    "mode", "mode_options keys are CP modes ({ok}); got '{m}'",
                    {"m": m, "ok": ", ".join(x for x in MODES if x not in SINGLE_DEVICE_MODES)},
                )
        from kernels import cp
        from kernels.cp import tail_exchange

        for m, opts in value.items():
            known = cp.MODES[m].OPTIONS
            unknown = sorted(set(opts) - set(known))
            if unknown:
                raise PydanticCustomError(
                    "mode_option", "unknown option(s) {u} for mode '{m}'; known: {ok}",
                    {"u": ", ".join(unknown), "m": m, "ok": ", ".join(sorted(known)) or "none"},
                )
            if m == "tail_exchange":
                try:
                    tail_exchange.resolve_options({**known, **opts})
                except ValueError as err:
                    raise PydanticCustomError("mode_option", "tail_exchange: {e}", {"e": str(err)}) from None
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str]) -> list[str]:
        for b in value:
            if b not in BACKENDS:
                raise PydanticCustomError(
                    "backend", "unknown backend '{b}'; expected one of {ok}", {"b": b, "ok": ", ".join(BACKENDS)}
                )
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


def grid_size(spec: SweepSpec) -> int:
    """Number of points the spec expands to (skipped ones included), computed without expanding."""
    a = spec.axes
    shapes = len(a.B) * len(a.T or []) + len(a.lengths or [])
    return (
        len(spec.ops) * len(spec.backends) * len(a.dtype) * len(a.direction) * len(a.layout) * shapes
        * len(a.H) * len(a.HV or [0]) * len(a.K) * len(a.V) * len(a.lb) * len(a.W) * len(spec.modes) * len(spec.seeds) * spec.repetitions
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


def load_spec(path: str | Path) -> SweepSpec:
    """Read a sweep spec from a YAML or JSON file (by suffix; YAML otherwise) and validate it."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(f"spec file {p} not found") from None
    except OSError as err:
        raise SpecError(f"cannot read spec file {p}: {err.strerror}") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"malformed JSON in {p}: line {err.lineno} column {err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"malformed YAML in {p}: {where}{problem}") from None
    return parse_spec(data, source=str(p))
