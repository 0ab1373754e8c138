"""TUNED-CONFIG LOADER: the versioned autotune JSON that training jobs load, and the launch-time resolver.

A training job points `CPBENCH_AUTOTUNE=path/to/autotune.json` at a file exported by `cpbench configs export`
(or calls `kernels.use_autotune(path)`): the default launch plan (`kernels.plan`) then holds the file's table, and
every Triton kernel of the suite launches with the tuned config for its shape key. A caller can also hand a table to
one call: `kernels.forward(..., plan=LaunchPlan(table=load_autotune(path)))`. This module imports only the standard
library and torch.

File format (schema_version 1; `SCHEMA` below says the same as a JSON-schema-like dict)::

    {
      "schema_version": 1,
      "device": {"name": "NVIDIA H200", "compute_capability": "9.0"},      # name as torch.cuda.get_device_name()
      "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0", "cpbench": "0.1.0"},
      "created_at": "2026-11-30T12:00:00+00:00",                              # ISO 8601
      "kernels": {
        "<kernel name>": {                                                    # a KernelSpec name (kernels.configs)
          "source_hash": "<sha256 hex of the source of the module defining the kernel>",
          "entries": [
            {"key": {"H": 16, "K": 128, "V": 128, "BT": 64, "IS_VARLEN": false, "dtype": "bfloat16"},
             "config": {"BV": 64, "num_warps": 4, "num_stages": 2},           # LaunchConfig fields
             "median_ms": 0.41, "default_ms": 0.47, "runner_up_ms": 0.42,    # default/runner-up may be null
             "sweep_id": 12, "measured_at": "2026-11-30T11:58:00+00:00"}      # sweep_id may be null
          ]
        }
      }
    }

Loading (`load_autotune`) refuses, with `AutotuneMismatchError` (a `ValueError`):
- a file for another device: `device.name` differs from `torch.cuda.get_device_name()` (or from "cpu" when no
  CUDA device is present; files for "cpu" only come from tests: CPU timings are never exported for real);
- a stale file: a kernel's `source_hash` differs from `source_hash(kernel)` of this build, or the file names a
  kernel this build does not register.
With `strict=False` these are logged as warnings and the offending part is ignored (the whole file for a device
mismatch, that kernel's entries for a stale hash). A malformed file (not JSON, wrong `schema_version`, a missing
or mistyped field) raises `AutotuneFormatError` naming the field, in both modes.

Resolution at launch (`AutotuneTable.resolve`, called by `LaunchPlan.config_for` for a kernel the plan does not pin):
1. the entry whose key equals the launch key (values compared after `normalize_key`);
2. else the nearest entry of the same kernel: its key must have the same field names and equal non-numeric
   values (strings, bools, and numbers <= 0), and its config must fit the launch (BV <= V, BK <= K where those
   fields exist); distance = sum over the positive numeric fields of |log2(a / b)|; ties go to the
   lexicographically smaller canonical key string;
3. else the kernel's default config.
Cases 2 and 3 warn once per (kernel, key) with `AutotuneFallbackWarning`. No file loaded → defaults, silently.

`CPBENCH_AUTOTUNE=path` is read at the first call that needs the default plan (`kernels.plan.default_plan`), not at
import; `CPBENCH_AUTOTUNE_STRICT=0` makes that load non-strict. The device check of that load is deferred to the
first kernel launch, so it never initialises CUDA.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.configs import KERNELS, KernelSpec, LaunchConfig, import_kernel_modules

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "AutotuneError",
    "AutotuneFallbackWarning",
    "AutotuneFormatError",
    "AutotuneMismatchError",
    "AutotuneTable",
    "Entry",
    "current_device",
    "key_distance",
    "key_str",
    "load_autotune",
    "normalize_key",
    "parse_autotune",
    "source_hash",
    "source_modules",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# the JSON-schema-like description of the file; `parse_autotune` enforces exactly this
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "device", "versions", "created_at", "kernels"],
    "properties": {
        "schema_version": {"type": "integer", "const": SCHEMA_VERSION},
        "device": {
            "type": "object",
            "required": ["name", "compute_capability"],
            "properties": {"name": {"type": "string"}, "compute_capability": {"type": ["string", "null"]}},
        },
        "versions": {
            "type": "object",
            "required": ["torch", "triton", "cpbench"],
            "properties": {
                "torch": {"type": "string"},
                "triton": {"type": ["string", "null"]},
                "cpbench": {"type": "string"},
            },
        },
        "created_at": {"type": "string", "format": "date-time"},
        "kernels": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["source_hash", "entries"],
                "properties": {
                    "source_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    # why a changed kernel was re-stamped without a re-tune (`benchmarks/autotune_restamp.py --accept`)
                    "accepted": {"type": "string"},
                    "entries": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["key", "config", "median_ms", "default_ms", "runner_up_ms", "sweep_id", "measured_at"],
                            "properties": {
                                "key": {"type": "object", "additionalProperties": {"type": ["integer", "number", "string", "boolean"]}},
                                "config": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
                                "median_ms": {"type": "number", "exclusiveMinimum": 0},
                                "default_ms": {"type": ["number", "null"]},
                                "runner_up_ms": {"type": ["number", "null"]},
                                "sweep_id": {"type": ["integer", "null"]},
                                "measured_at": {"type": "string", "format": "date-time"},
                            },
                        },
                    },
                },
            },
        },
    },
}

# modules whose import registers the suite's Triton kernels; imported (best effort) before source hashes are checked
class AutotuneError(ValueError):
    """Base of the loader's errors."""


class AutotuneFormatError(AutotuneError):
    """The file is not a valid autotune file (not JSON, wrong schema version, missing or mistyped field)."""


class AutotuneMismatchError(AutotuneError):
    """The file is valid but was made for another device or another version of a kernel's source."""


class AutotuneFallbackWarning(UserWarning):
    """A launch did not find its exact key in the loaded file and used the nearest key or the default."""


# keys and hashes


def _norm_value(v: Any) -> Any:
    if isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else v
    # torch.dtype and the like: "torch.bfloat16" -> "bfloat16"
    s = str(v)
    return s[len("torch."):] if s.startswith("torch.") else s


def normalize_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """A launch key as stored in files and the DB: sorted names; dtypes as strings ("bfloat16"); whole floats as ints."""
    return {str(k): _norm_value(key[k]) for k in sorted(key)}


def key_str(key: Mapping[str, Any]) -> str:
    """The canonical string of a key, e.g. "BT=64,H=16,IS_VARLEN=False,K=128,V=128,dtype=bfloat16" (sorted by name)."""
    return ",".join(f"{k}={v}" for k, v in normalize_key(key).items())


def _is_numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def key_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Distance between two launch keys; `math.inf` when they are not comparable.

    Comparable: same field names, equal non-numeric values (strings, bools, numbers <= 0). Distance: the sum of
    |log2(a_f / b_f)| over the positive numeric fields f (so H=16 vs H=32 is 1, T-like fields scale-free).
    """
    a, b = normalize_key(a), normalize_key(b)
    if a.keys() != b.keys():
        return math.inf
    d = 0.0
    for k, va in a.items():
        vb = b[k]
        if _is_numeric(va) and _is_numeric(vb):
            d += abs(math.log2(va / vb))
        elif va != vb:
            return math.inf
    return d


def _config_fits(cfg: LaunchConfig, key: Mapping[str, Any]) -> bool:
    """A borrowed config must not tile wider than the launch's head dims (BV <= V, BK <= K where both are known)."""
    for blk, dim in (("BV", "V"), ("BK", "K")):
        b, n = getattr(cfg, blk), key.get(dim)
        if b is not None and _is_numeric(n) and b > n:
            return False
    return True


def _spec_module(name: str) -> Any:
    """The module that defines the registered KernelSpec `name` (the module holding that very spec object)."""
    if name not in KERNELS:
        import_kernel_modules()  # its module may not be imported yet
    spec = KERNELS.get(name)
    if spec is None:
        raise AutotuneMismatchError(f"kernel {name!r} is not registered in this build; registered: {sorted(KERNELS)}")
    candidates = []
    for mod_name, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if not d or mod_name == "kernels.configs":
            continue
        if any(obj is spec for obj in list(d.values())):
            candidates.append((not mod_name.startswith("kernels."), mod_name, mod))
    if not candidates:
        raise AutotuneError(f"cannot find the module that defines kernel {name!r} (its KernelSpec is not a module attribute)")
    # prefer the suite's own module when a spec is re-exported elsewhere
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


def source_hash(kernel_name: str) -> str:
    """sha256 (hex) of the Python source of the module that defines the kernel, followed by the source of every
    module its Triton device helpers come from (e.g. `kernels.common.chunk_program`), line endings normalised to LF.

    Identical wherever the same source tree is imported, so the tuner (at tuning time) and this loader agree.
    Note: the module also holds the kernel's declared space, so editing the space makes tuned entries stale too.
    """
    parts = []
    for m in source_modules(kernel_name):
        try:
            parts.append(inspect.getsource(m))
        except (OSError, TypeError) as e:
            raise AutotuneError(f"cannot read the source of module {m.__name__!r} used by kernel {kernel_name!r}: {e}") from e
    return hashlib.sha256("\n".join(parts).replace("\r\n", "\n").encode()).hexdigest()


def source_modules(kernel_name: str) -> list[Any]:
    """The modules whose source keys `kernel_name`'s tuned entries (`source_hash`): its spec's module, then the
    modules of its Triton helpers."""
    mod = _spec_module(kernel_name)
    return [mod, *_helper_modules(mod)]


def _helper_modules(mod: Any) -> list[Any]:
    """Other `kernels` modules whose `@triton.jit` helpers `mod` calls (a jitted or interpreted function's `.fn`)."""
    names = {
        fn.__module__ for obj in vars(mod).values()
        if inspect.isfunction(fn := getattr(obj, "fn", None)) and fn.__module__ != mod.__name__
        and fn.__module__.startswith("kernels.")
    }
    return [sys.modules[n] for n in sorted(names)]


def current_device() -> str:
    """The device name files are matched against: `torch.cuda.get_device_name()`, or "cpu" without CUDA."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


# parsing


def _fail(path: str, what: str) -> AutotuneFormatError:
    return AutotuneFormatError(f"autotune file: field {path!r} {what}")


def _get(obj: Mapping[str, Any], name: str, path: str, types: tuple[type, ...], *, nullable: bool = False) -> Any:
    where = f"{path}.{name}" if path else name
    if name not in obj:
        raise _fail(where, "is missing")
    v = obj[name]
    if v is None and nullable:
        return None
    bad_bool = isinstance(v, bool) and bool not in types
    if not isinstance(v, types) or bad_bool:
        want = " or ".join(t.__name__ for t in types) + (" or null" if nullable else "")
        raise _fail(where, f"must be {want}, got {type(v).__name__} {v!r}"[:300])
    return v


@dataclass(frozen=True)
class Entry:
    """One tuned (key, config) with its provenance."""

    key: dict[str, Any]
    config: LaunchConfig
    median_ms: float
    default_ms: float | None
    runner_up_ms: float | None
    sweep_id: int | None
    measured_at: str


def _parse_entry(e: Any, path: str) -> Entry:
    if not isinstance(e, dict):
        raise _fail(path, f"must be an object, got {type(e).__name__}")
    key = _get(e, "key", path, (dict,))
    for k, v in key.items():
        if not isinstance(v, (bool, int, float, str)):
            raise _fail(f"{path}.key.{k}", f"must be a number, string or bool, got {type(v).__name__}")
    cfg_d = _get(e, "config", path, (dict,))
    try:
        cfg = LaunchConfig.from_dict(cfg_d)
    except (TypeError, ValueError) as err:
        raise _fail(f"{path}.config", f"is not a launch config: {err}") from None
    median = _get(e, "median_ms", path, (int, float))
    if not median > 0:
        raise _fail(f"{path}.median_ms", f"must be > 0, got {median!r}")
    return Entry(
        key=normalize_key(key),
        config=cfg,
        median_ms=float(median),
        default_ms=_get(e, "default_ms", path, (int, float), nullable=True),
        runner_up_ms=_get(e, "runner_up_ms", path, (int, float), nullable=True),
        sweep_id=_get(e, "sweep_id", path, (int,), nullable=True),
        measured_at=_get(e, "measured_at", path, (str,)),
    )


_MISS = object()  # not yet resolved (AutotuneTable._memo)


@dataclass
class AutotuneTable:
    """A parsed autotune file: per kernel, its source hash and entries; resolves launch keys to configs."""

    device_name: str
    compute_capability: str | None
    versions: dict[str, Any]
    created_at: str
    source_hashes: dict[str, str]
    entries: dict[str, dict[str, Entry]]  # kernel -> key_str -> entry
    path: str | None = None
    # the device the file must match, checked at the first resolve (deferred loads); None = checked or not required
    pending_device_check: bool = False
    strict: bool = True
    disabled: bool = False
    _warned: set[tuple[str, str]] = field(default_factory=set)
    # (kernel, the launcher's key items as given) -> resolve's answer: a step asks the same ~15 keys every call, and
    # normalizing a key and scanning for the nearest one took ~15 us a launch on a loaded host (session 20; 0.6 with this)
    _memo: dict[tuple[str, tuple[tuple[str, Any], ...]], LaunchConfig | None] = field(default_factory=dict)

    def kernels(self) -> list[str]:
        return sorted(self.entries)

    def lookup(self, kernel: str, key: Mapping[str, Any]) -> tuple[LaunchConfig | None, str]:
        """(config, how) for a launch key, how in {"exact", "nearest", "default"}; config None means the default."""
        table = self.entries.get(kernel)
        if not table:
            return None, "default"
        nk = normalize_key(key)
        hit = table.get(key_str(nk))
        if hit is not None:
            return hit.config, "exact"
        best: tuple[float, str, Entry] | None = None
        for ks, e in table.items():
            d = key_distance(nk, e.key)
            if math.isinf(d) or not _config_fits(e.config, nk):
                continue
            if best is None or (d, ks) < best[:2]:
                best = (d, ks, e)
        return (best[2].config, "nearest") if best else (None, "default")

    def resolve(self, spec: KernelSpec, key: Mapping[str, Any]) -> LaunchConfig | None:
        """The tuned config of a launch: exact key, else nearest, else None (the default); remembered per kernel and
        key (the entries do not change after parsing), the fallback warned of once."""
        if self.pending_device_check:
            self.pending_device_check = False
            self._check_device(current_device())
        if self.disabled:
            return None
        try:
            memo_key: tuple[str, tuple[tuple[str, Any], ...]] | None = (spec.name, tuple(key.items()))
            cfg = self._memo.get(memo_key, _MISS)  # type: ignore[arg-type]
        except TypeError:  # an unhashable key value: resolved every time
            memo_key, cfg = None, _MISS
        if cfg is not _MISS:
            return cfg  # type: ignore[return-value]
        cfg, how = self.lookup(spec.name, key)
        if memo_key is not None:
            self._memo[memo_key] = cfg
        if how != "exact":
            ks = key_str(key)
            if (spec.name, ks) not in self._warned:
                self._warned.add((spec.name, ks))
                if how == "nearest":
                    msg = f"autotune: no tuned entry for {spec.name} at {ks}; using the nearest key's config {cfg.as_dict()}"
                else:
                    msg = f"autotune: no tuned entry for {spec.name} at {ks} (none comparable); using the default {spec.default.as_dict()}"
                logger.warning("%s", msg)
                warnings.warn(msg, AutotuneFallbackWarning, stacklevel=3)
        return cfg

    def _check_device(self, device: str) -> None:
        if device == self.device_name:
            return
        msg = (f"autotune file {self.path or '<dict>'} was tuned on device {self.device_name!r}, "
               f"but this process runs on {device!r}")
        if self.strict:
            raise AutotuneMismatchError(msg + "; export a file for this device or load with strict=False")
        logger.warning("%s; ignoring the file (strict=False), kernels use their defaults", msg)
        warnings.warn(msg + "; ignored (strict=False)", AutotuneFallbackWarning, stacklevel=3)
        self.disabled = True


def parse_autotune(data: Any, *, strict: bool = True, device_name: str | None = None, path: str | None = None,
                   defer_device_check: bool = False, check_sources: bool = True) -> AutotuneTable:
    """Validate a decoded autotune file and build its table (see the module docstring for the checks).

    device_name: the device to match (default: `current_device()`); with `defer_device_check` the check waits
    for the first resolve. check_sources=False skips the source-hash check (format validation by the exporter).
    """
    if not isinstance(data, dict):
        raise AutotuneFormatError(f"autotune file: top level must be a JSON object, got {type(data).__name__}")
    ver = _get(data, "schema_version", "", (int,))
    if ver != SCHEMA_VERSION:
        raise _fail("schema_version", f"is {ver!r}; this build reads schema_version {SCHEMA_VERSION}")
    dev = _get(data, "device", "", (dict,))
    dev_name = _get(dev, "name", "device", (str,))
    cc = _get(dev, "compute_capability", "device", (str,), nullable=True)
    vers = _get(data, "versions", "", (dict,))
    for v in ("torch", "cpbench"):
        _get(vers, v, "versions", (str,))
    _get(vers, "triton", "versions", (str,), nullable=True)
    created = _get(data, "created_at", "", (str,))
    kern = _get(data, "kernels", "", (dict,))
    hashes: dict[str, str] = {}
    entries: dict[str, dict[str, Entry]] = {}
    for name, block in kern.items():
        p = f"kernels.{name}"
        if not isinstance(block, dict):
            raise _fail(p, f"must be an object, got {type(block).__name__}")
        h = _get(block, "source_hash", p, (str,))
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise _fail(f"{p}.source_hash", f"must be 64 lowercase hex digits (sha256), got {h!r}"[:200])
        ents = _get(block, "entries", p, (list,))
        parsed = {}
        for i, e in enumerate(ents):
            ent = _parse_entry(e, f"{p}.entries[{i}]")
            parsed[key_str(ent.key)] = ent
        hashes[name] = h
        entries[name] = parsed

    table = AutotuneTable(device_name=dev_name, compute_capability=cc, versions=dict(vers), created_at=created,
                          source_hashes=hashes, entries=entries, path=path, strict=strict)
    if defer_device_check and device_name is None:
        table.pending_device_check = True
    else:
        table._check_device(device_name if device_name is not None else current_device())
    if table.disabled or not check_sources:
        return table

    # stale or unknown kernels
    if any(n not in KERNELS for n in entries):
        import_kernel_modules()  # a kernel of the file may live in a module not imported yet
    for name in list(entries):
        if name not in KERNELS:
            problem = f"autotune file {path or '<dict>'} has entries for kernel {name!r}, which this build does not register"
        else:
            have = source_hash(name)
            if have == hashes[name]:
                continue
            problem = (f"autotune file {path or '<dict>'}: kernel {name!r} was tuned with source hash {hashes[name][:12]}…, "
                       f"this build's source hash is {have[:12]}… (the kernel changed since it was tuned; re-tune and re-export)")
        if strict:
            raise AutotuneMismatchError(problem)
        logger.warning("%s; ignoring its entries (strict=False)", problem)
        warnings.warn(problem + "; ignored (strict=False)", AutotuneFallbackWarning, stacklevel=2)
        del entries[name]
    return table


def load_autotune(path: str | os.PathLike[str], *, strict: bool = True, device_name: str | None = None,
                  defer_device_check: bool = False) -> AutotuneTable:
    """Read and validate an autotune file. Raises AutotuneFormatError / AutotuneMismatchError (see module docstring).

    Args:
        path (str | PathLike):
            the exported JSON file.
        strict (bool):
            refuse (raise) a file for another device or with stale kernels; with False, warn and ignore them.
            Default: `True`.
        device_name (str, Optional):
            the device to match; default `torch.cuda.get_device_name()` or "cpu" without CUDA.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"autotune file not found: path={str(p)!r}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AutotuneFormatError(f"autotune file {str(p)!r} is not valid JSON: {e}") from None
    return parse_autotune(data, strict=strict, device_name=device_name, path=str(p), defer_device_check=defer_device_check)
