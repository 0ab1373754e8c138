"""A grid point as a typed value: `PointSpec`, every field a point has with every default filled in here, once.

`runners.grid.expand` builds the points of a sweep; the store keeps `point.to_json()` in `Point.params` (the same
JSON as before the type existed: optional fields appear only when set, so keys and stored sweeps are unchanged);
the worker rebuilds the point with `PointSpec.from_json(row.params)` and sends it to its gang inside a `PointJob`.
`from_json` fills the default of every field an older row lacks and ignores keys it does not know. Past that
boundary the engine reads attributes (`point.direction`), never string keys of a dict.

    point = PointSpec.from_json({"op": "gdn", "mode": "ring", "backend": "torch", "B": 1, "T": 256, ...})
    point.value_heads, point.tokens, replace(point, mode="none")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["DEFAULT_LOWER_BOUND", "GATES", "PointJob", "PointSpec"]

_INTS = ("B", "T", "H", "K", "V", "W", "seed", "rep")
_OPTIONAL = ("HV", "mode_options", "backend_ref", "backend_options")  # in the JSON only when set (as `expand` wrote them)
GATES = ("precomputed", "in_kernel", "safe")  # how the step gets its gate (`runners.workload.Activation`)
DEFAULT_LOWER_BOUND = -5.0  # the safe gate's lower bound when a spec names none (FLA's range is [-5, 0))
# fields added after points were stored: in the JSON (and the key) only where they differ from their default, so every
# stored point of an older spec keeps its params and key byte for byte
_NEW_DEFAULTS: dict[str, Any] = {"gate": "precomputed", "lower_bound": DEFAULT_LOWER_BOUND, "l2norm_in_kernel": False}


@dataclass(frozen=True)
class PointSpec:
    """One benchmark point: op, mode and backend, heads and head dims, the shape (dense B x T, or varlen `lengths`
    with B = 1 and T their sum), decay bound, ranks, layout, direction, dtype, seed, repetition, grouped value heads
    (HV, None = H), the mode's options, a plugin's spec string (`backend_ref`) and the backend's options; the real
    models' call: `gate` (`precomputed`: g given; `in_kernel`: -exp(A_log) softplus(g + dt_bias); `safe`:
    lower_bound * sigmoid(exp(A_log) (g + dt_bias)), `kernels.common.gate`), the safe gate's `lower_bound` and
    `l2norm_in_kernel` (q, k L2-normalised in the step). Every field past T has its default here, the one place
    defaults of a point live."""

    op: str
    mode: str
    backend: str
    H: int
    K: int
    V: int
    B: int
    T: int
    lb: float = -1.0
    W: int = 1
    layout: str = "contiguous"
    direction: str = "fwd"
    dtype: str = "float32"
    seed: int = 0
    rep: int = 0
    lengths: tuple[int, ...] | None = None
    HV: int | None = None
    mode_options: dict[str, Any] = field(default_factory=dict)
    backend_ref: str | None = None
    backend_options: dict[str, Any] = field(default_factory=dict)
    gate: str = "precomputed"
    lower_bound: float = DEFAULT_LOWER_BOUND
    l2norm_in_kernel: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PointSpec:
        """The point of a stored `params` object (missing fields take their defaults; unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in data.items() if k in names}
        for k in _INTS:
            if kw.get(k) is not None:
                kw[k] = int(kw[k])
        for k in ("lb", "lower_bound"):
            if kw.get(k) is not None:
                kw[k] = float(kw[k])
        if "l2norm_in_kernel" in kw:
            kw["l2norm_in_kernel"] = bool(kw["l2norm_in_kernel"])
        for k in ("HV", "lengths", "backend_ref", "mode_options", "backend_options"):
            if not kw.get(k):
                kw.pop(k, None)
        if "HV" in kw:
            kw["HV"] = int(kw["HV"])
        if "lengths" in kw:
            kw["lengths"] = tuple(int(n) for n in kw["lengths"])
        for k in ("mode_options", "backend_options"):
            if k in kw:
                kw[k] = dict(kw[k])
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        """The stored `params`: every field, the optional ones only when set, in the order `expand` always wrote."""
        out: dict[str, Any] = {"op": self.op, "mode": self.mode, "backend": self.backend, "B": self.B, "T": self.T}
        if self.lengths:
            out["lengths"] = list(self.lengths)
        out.update(H=self.H, K=self.K, V=self.V, lb=self.lb, W=self.W, layout=self.layout, direction=self.direction,
                   dtype=self.dtype, seed=self.seed, rep=self.rep)
        for k in _OPTIONAL:
            value = getattr(self, k)
            if value:
                out[k] = dict(value) if isinstance(value, dict) else value
        out.update(self.new_fields())
        return out

    def new_fields(self) -> dict[str, Any]:
        """The fields added since points were first stored that differ from their default (`gate`, `lower_bound`,
        `l2norm_in_kernel`), in that order: the JSON and the key carry only these."""
        return {k: getattr(self, k) for k, d in _NEW_DEFAULTS.items() if getattr(self, k) != d}

    @property
    def value_heads(self) -> int:
        """HV: the heads of v, g and beta (H unless the point groups value heads)."""
        return self.HV if self.HV is not None else self.H

    @property
    def tokens(self) -> int:
        """Total tokens: B*T dense, or the sum of the varlen lengths."""
        return sum(self.lengths) if self.lengths else self.B * self.T

    # read access by name, for peers written against the former `params` dict (`params["B"]`, `params.get("HV")`)
    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self.__dataclass_fields__ else default


@dataclass(frozen=True)
class PointJob:
    """What the worker sends to every rank of a gang for one point (`runners.execute.run_point_job`): the point,
    the sweep spec's `options` (timing, check, profile, tune), rank 0's Chrome trace target (None: no file) and the
    tuned configs to launch with (`autotune`, from `runners.execute.tune_job`; None: the process's own)."""

    point: PointSpec
    options: dict[str, Any]
    trace_path: str | None = None
    autotune: Any = None
