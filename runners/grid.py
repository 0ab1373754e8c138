"""Deterministic grid expansion: a `SweepSpec` -> the list of point rows the store queues (`db.models.Point`).

The order is fixed (outermost first): op, backend, dtype, direction, layout, shape (dense B x T, then each
varlen length list), H, HV (when given), K, V, lb, gate (with each lower_bound for `safe`), l2norm_in_kernel, W, mode,
seed, repetition; values keep the order the spec gives. So the
same spec always yields the same points with the same `idx` and `key`, and the modes of one shape sit next
to each other in the queue (compared within minutes of each other).

A point that cannot run is kept, with `status="skipped"` and the reason (nvbench's `state.skip`), never
dropped. The rules, first match wins:

- the mode is not available here (only when the caller says what is available);
- a peer backend (`fla`, `fla_dispatch`, `flash_qla`, `flash_kda`, a plugin: `runners.plugins`) does not implement the mode or direction, or its own rule
  says why not (`runners.peers.peer_skip_reason`: FLA's reasons, with or without FLA installed here); a peer takes
  no real-model gate and no `l2norm_in_kernel` (the engine hands it the stored inputs as they are);
- `none` and `warmup_correct` run on one device: W must be 1;
- W is more than the devices present (only when the caller passes `max_W`; workers also claim by W);
- `headwise` needs H % W == 0;
- the token count (B*T, or the sum of a varlen list) must split evenly: by W (contiguous) or 2W (zigzag);
- the backend is not available here (only when the caller says what is available).

The key names a benchmark across sweeps: every axis value except the repetition index, in a fixed order,
e.g. `gdn/ring/torch/B=1,T=256,H=2,K=32,V=32,lb=-1,W=2,layout=contiguous,dir=fwd,dtype=float32,seed=0`; a real-model
gate and `l2norm_in_kernel` add `,gate=safe,lower_bound=-3,l2norm_in_kernel=True` (each only when not its default).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from kernels.vocabulary import SINGLE_DEVICE
from runners import backend_options
from runners.peers import peer_skip_reason
from runners.plugins import is_ours, load_peer, peer_of_point, unavailable
from runners.point import PointSpec
from runners.spec import SweepSpec, WarmupCorrectSpec

__all__ = ["available_backends", "available_modes", "expand", "mode_options", "point_key", "points", "skip_reason", "tokens"]

logger = logging.getLogger(__name__)

_WC_DEFAULTS = WarmupCorrectSpec().model_dump(mode="json")


def available_modes() -> tuple[str, ...] | None:
    """The CP modes the installed `kernels.cp` implements, or None when it cannot be imported."""
    try:
        from kernels import cp
    except ImportError as err:
        logger.warning("kernels.cp is not importable (%s); modes are not checked", err)
        return None
    return tuple(cp.MODES)


def available_backends() -> tuple[str, ...]:
    """Benchmark backends usable in this process: torch always, fla when installed, triton when installed and a CUDA
    device is present or the interpreter is on (TRITON_INTERPRET=1; `cpbench` sets it for CPU runs)."""
    out = ["torch"]
    if importlib.util.find_spec("triton") is not None and (os.environ.get("TRITON_INTERPRET") == "1" or _cuda()):
        out.append("triton")
    if importlib.util.find_spec("fla") is not None:
        out.append("fla")
    return tuple(out)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def tokens(point: PointSpec) -> int:
    """Total tokens of a point: B*T dense, or the sum of its varlen lengths."""
    return point.tokens


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


# a varlen length list longer than this (as written in the key) is named by its count, total and digest instead: the
# store's key column holds 512 characters (PostgreSQL refuses more; a 340,000-length list was a 680 kB key)
LENGTHS_IN_KEY = 128


def _lengths_key(lengths: Iterable[int]) -> str:
    text = "-".join(str(n) for n in lengths)
    if len(text) <= LENGTHS_IN_KEY:
        return f"lengths={text}"
    ns = [int(n) for n in text.split("-")]
    return f"lengths=n{len(ns)}:sum{sum(ns)}:sha256-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def point_key(point: PointSpec) -> str:
    """Canonical key of a point: the same benchmark in any sweep has the same key (repetition excluded).

    A varlen batch is `lengths=a-b-c`, or for a long list (over LENGTHS_IN_KEY characters) `lengths=n<count>:sum<tokens>:
    sha256-<16 hex>`. Mode options that differ from the defaults (`mode_options`; for warmup_correct its segments, tol, window,
    fallback) are appended as `,opts=name=value;...` so that differently configured runs never share a key; so are
    the point's backend options, named by the backend (`fla.bypass_hopper_guard=True`, `triton.keep=wy+states`)."""
    p = point
    shape = _lengths_key(p.lengths) if p.lengths else f"T={p.T}"
    key = (
        f"{p.op}/{p.mode}/{p.backend}/"
        f"B={p.B},{shape},H={p.H},{_hv(p)}K={p.K},V={p.V},lb={_fmt(p.lb)},"
        f"W={p.W},layout={p.layout},dir={p.direction},dtype={p.dtype},seed={p.seed}"
    )
    key += "".join(f",{k}={_fmt(v)}" for k, v in p.new_fields().items())
    opts = dict(p.mode_options)
    if p.mode == "warmup_correct":
        opts = {k: v for k, v in opts.items() if _WC_DEFAULTS.get(k) != v}
    # a peer's own options (`mode_options: {fla: {...}}`) name the backend: `,opts=fla.bypass_hopper_guard=True`
    opts.update({f"{p.backend}.{k}": v for k, v in p.backend_options.items()})
    if opts:
        key += ",opts=" + ";".join(f"{k}={_fmt(opts[k])}" for k in sorted(opts))
    return key


def _hv(point: PointSpec) -> str:
    """`HV=n,` in the key only for grouped value heads (HV != H), so the keys of HV == H points never change."""
    return f"HV={point.HV}," if point.HV is not None and point.HV != point.H else ""


def mode_options(spec: SweepSpec, mode: str) -> dict[str, Any]:
    """The options a point of `mode` runs with: the spec's warmup_correct block, or its `mode_options[mode]`."""
    if mode == "warmup_correct":
        return spec.warmup_correct.model_dump(mode="json")
    return dict(spec.mode_options.get(mode) or {})


def skip_reason(
    point: PointSpec,
    *,
    max_W: int | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
) -> str | None:
    """Why the point cannot run, or None. `modes`/`backends`: what is available (None: not checked)."""
    mode, W, H, HV = point.mode, point.W, point.H, point.value_heads
    if modes is not None and mode not in tuple(modes):
        return f"mode '{mode}' is not implemented by the installed kernels.cp (has {', '.join(modes)})"
    if not is_ours(point.backend):
        try:
            why = peer_skip_reason(peer_of_point(point), point)
        except ValueError as err:
            return str(err)
        if why:
            return why
        if point.new_fields():
            what = ", ".join(f"{k}={v}" for k, v in point.new_fields().items())
            return f"backend '{point.backend}' takes the stored inputs as they are: no {what}"
    if mode in SINGLE_DEVICE and W != 1:
        return f"mode '{mode}' runs on one device: needs W == 1, got W={W}"
    if max_W is not None and max_W < W:
        return f"W={W} is more than the {max_W} device(s) present"
    if HV % H != 0:
        return f"grouped value heads need HV % H == 0, got H={H}, HV={HV}"
    if mode == "headwise" and (H % W != 0 or HV % W != 0):
        return f"headwise needs H % W == 0 and HV % W == 0, got H={H}, HV={HV}, W={W}"
    if W > 1:
        n = point.tokens
        parts = 2 * W if point.layout == "zigzag" else W
        if n % parts != 0:
            what = "lengths sum" if point.lengths else "B*T"
            return f"layout '{point.layout}' splits the tokens into {parts} equal parts: needs {what}={n} divisible by {parts}"
    if backends is not None:
        return unavailable(point, tuple(backends))
    return None


def _shapes(spec: SweepSpec) -> Iterator[dict[str, Any]]:
    a = spec.axes
    for B in a.B:
        for T in a.T or []:
            yield {"B": B, "T": T}
    for lens in a.lengths or []:
        yield {"B": 1, "T": sum(lens), "lengths": tuple(lens)}


def points(spec: SweepSpec) -> list[PointSpec]:
    """The points of `spec`, in grid order (see the module docstring)."""
    a = spec.axes
    out: list[PointSpec] = []
    outer = itertools.product(spec.ops, spec.backends, a.dtype, a.direction, a.layout, list(_shapes(spec)))
    for op, ref, dtype, direction, layout, shape in outer:
        backend = _backend_name(ref)
        value_heads: list[int | None] = list(a.HV) if a.HV else [None]
        calls = [(gate, bound, l2) for gate, bound in a.gates() for l2 in a.l2norm_in_kernel]  # the real models' call
        inner = itertools.product(a.H, value_heads, a.K, a.V, a.lb, calls, a.W, spec.modes, spec.seeds,
                                  range(spec.repetitions))
        for H, HV, K, V, lb, (gate, lower_bound, l2norm), W, mode, seed, rep in inner:
            # HV only when the spec has the axis (params of older specs stay as they were)
            out.append(PointSpec(
                op=op, mode=mode, backend=backend, **shape, H=H, HV=HV, K=K, V=V, lb=float(lb), W=W, layout=layout,
                direction=direction, dtype=dtype, seed=seed, rep=rep, mode_options=mode_options(spec, mode),
                gate=gate, lower_bound=float(lower_bound), l2norm_in_kernel=l2norm,
                **_backend_fields(spec, ref, backend, mode, direction),
            ))
    return out


def expand(
    spec: SweepSpec,
    *,
    max_W: int | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """The point rows of `spec`, in grid order, as dicts of `db.models.Point` columns.

    Each row: idx, key, params (the point's JSON, `PointSpec.to_json`: every axis value, `lengths` for varlen,
    `rep`, `mode_options` when the mode has any (see `mode_options`), the backend's fields), the indexed columns
    (op, mode, backend, B, T, H, K, V, lb, W, layout, direction, dtype, seed), status (`queued` or `skipped`),
    reason and max_attempts. `max_W`, `modes`, `backends`: what this machine has (see `skip_reason`); None = not
    checked.
    """
    modes = tuple(modes) if modes is not None else None
    backends = tuple(backends) if backends is not None else None
    return [_row(idx, point, spec, max_W, modes, backends) for idx, point in enumerate(points(spec))]


def _backend_name(ref: str) -> str:
    """The points' `backend` of a spec's backends entry: ours as given, a peer's `name` (a broken plugin: its ref,
    shortened; its points are skipped with the load error)."""
    if is_ours(ref):
        return ref
    try:
        return str(load_peer(ref).name)
    except ValueError:
        return ref.rsplit(":", 1)[-1].rsplit(".", 1)[-1][:16]


def _backend_fields(spec: SweepSpec, ref: str, backend: str, mode: str, direction: str) -> dict[str, Any]:
    """`backend_ref` (a plugin's spec string, so the worker loads the same object) and `backend_options` (a peer's
    as the spec gives them; ours only where they take effect, `runners.backend_options.for_point`)."""
    opts = dict(spec.mode_options.get(backend) or {})
    if is_ours(backend):
        opts = backend_options.for_point(backend, opts, mode, direction)
    elif callable(only := getattr(_loaded(ref), "options_for", None)):  # a peer's options that apply to the mode
        opts = only(opts, mode, direction)
    return {"backend_ref": ref if ref != backend else None, "backend_options": opts}


def _loaded(ref: str) -> Any:
    try:
        return load_peer(ref)
    except ValueError:
        return None


_COLUMNS = ("op", "mode", "backend", "B", "T", "H", "K", "V", "lb", "W", "layout", "direction", "dtype", "seed")


def _row(
    idx: int,
    point: PointSpec,
    spec: SweepSpec,
    max_W: int | None,
    modes: tuple[str, ...] | None,
    backends: tuple[str, ...] | None,
) -> dict[str, Any]:
    reason = skip_reason(point, max_W=max_W, modes=modes, backends=backends)
    return {
        "idx": idx,
        "key": point_key(point),
        "params": point.to_json(),
        **{c: getattr(point, c) for c in _COLUMNS},
        "status": "skipped" if reason else "queued",
        "reason": reason,
        "max_attempts": spec.max_attempts,
    }
