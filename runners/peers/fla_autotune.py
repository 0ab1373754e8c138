"""FLA's autotuned kernels from the outside: which ones a call touches (with the keys FLA keys them by), their
config spaces, pinning one config, and the config-cache file format FLA reads (`fla/ops/utils/cache.py`).

FLA's kernels are `triton.runtime.autotuner.Autotuner`s (most of them FLA's `CachedAutotuner`, which reads
`FLA_CONFIG_DIR/<kernel_name>.json` when `FLA_CACHE_MODE` is set). Their key is Triton's: the values of the
`key=` arguments in order, then `str(dtype)` of every tensor argument in signature order; FLA files an entry
under the md5 of that list serialized with sorted keys and no spaces. `pin(tuner, key, config)` writes the
config into the tuner's own cache (what FLA's loader does), so no benchmarking runs for that key.

    touched = record_touched(lambda: fla_chunk(q, k, v, g, beta))   # [Touched(name, key, tuner), ...] in call order
    t = touched[0]; pin(t.tuner, t.key, t.tuner.configs[3])

Kernel names repeat across FLA's modules (`recompute_w_u_fwd_kernel` and `prepare_wy_repr_bwd_kernel` are four
Autotuners each in 0.6.0: GDN's, KDA's, ...), so a touched call carries the Autotuner that ran it; `autotuners()`
(one per name) is for listing, not for pinning what a call touched.

Imports FLA and Triton only inside the functions (kernels/ imports FLA only when asked for the fla backend).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "autotuner_of",
    "autotuners",
    "cache_file",
    "config_dict",
    "config_of",
    "entry_hash",
    "pin",
    "record_touched",
    "tuning_key",
    "Touched",
    "unpin",
]


class Touched(NamedTuple):
    """One autotuned kernel call: FLA's kernel name (its config-cache file), the key, and the Autotuner that ran."""

    name: str
    key: tuple[Any, ...]
    tuner: Any


def autotuner_of(obj: Any) -> Any:
    """The Autotuner under `obj` (a kernel may be wrapped in `triton.heuristics`), or None."""
    from triton.runtime.autotuner import Autotuner

    for _ in range(6):
        if isinstance(obj, Autotuner):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def autotuners() -> dict[str, Any]:
    """{kernel name: Autotuner} of the FLA modules imported so far (import the op first); where a name repeats
    across modules, the first found (pin what `record_touched` returns instead)."""
    out: dict[str, Any] = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "fla" or mod_name.startswith("fla.")):
            continue
        for value in list(vars(mod).values()):
            tuner = autotuner_of(value)
            if tuner is not None:
                out.setdefault(_name(tuner), tuner)
    return out


def _name(tuner: Any) -> str:
    fn = tuner.fn
    return str(getattr(tuner, "kernel_name", None) or getattr(getattr(fn, "fn", fn), "__name__", str(fn)))


def tuning_key(tuner: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The key Triton's Autotuner caches this call under (and FLA files its config-cache entry under)."""
    named = {**dict(zip(tuner.arg_names, args, strict=False)), **kwargs}
    tracked = {k: v for k, v in named.items() if k in tuner.arg_names}
    key: list[Any] = [tracked[k] for k in tuner.keys if k in tracked]
    key += [str(v.dtype) for v in tracked.values() if hasattr(v, "dtype")]
    return tuple(key)


@contextlib.contextmanager
def _recording(calls: list[Touched]) -> Iterator[None]:
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.configs) > 1:
            item = Touched(_name(self), tuning_key(self, args, kwargs), self)
            if not any(c.tuner is self and c.key == item.key for c in calls):
                calls.append(item)
        return original(self, *args, **kwargs)

    Autotuner.run = run
    try:
        yield
    finally:
        Autotuner.run = original


def record_touched(fn: Callable[[], Any]) -> list[Touched]:
    """Run `fn` once and return every autotuned kernel call (more than one config) as (name, key, the Autotuner),
    first call first, each Autotuner and key once."""
    calls: list[Touched] = []
    with _recording(calls):
        fn()
    return calls


def config_dict(cfg: Any) -> dict[str, Any]:
    """A `triton.Config` in FLA's config-cache form (`kwargs`, `num_warps`, `num_stages`, `num_ctas`, `maxnreg`,
    `ir_override`: FLA reads the last three on Triton >= 3.5.1)."""
    return {"kwargs": dict(cfg.kwargs), "num_warps": int(cfg.num_warps), "num_stages": int(cfg.num_stages),
            "num_ctas": int(getattr(cfg, "num_ctas", 1) or 1), "maxnreg": getattr(cfg, "maxnreg", None),
            "ir_override": getattr(cfg, "ir_override", None)}


def config_of(d: Mapping[str, Any]) -> Any:
    """The `triton.Config` of a config-cache dict."""
    import triton

    return triton.Config(dict(d["kwargs"]), num_warps=d["num_warps"], num_stages=d["num_stages"],
                         num_ctas=d.get("num_ctas", 1), maxnreg=d.get("maxnreg"), ir_override=d.get("ir_override"))


def pin(tuner: Any, key: Sequence[Any], cfg: Any) -> None:
    """Make `tuner` launch `cfg` for `key` without benchmarking (its cache, as FLA's loader fills it)."""
    tuner.cache[tuple(key)] = cfg


def unpin(tuner: Any, key: Sequence[Any]) -> None:
    tuner.cache.pop(tuple(key), None)


def entry_hash(key: Sequence[Any]) -> str:
    """FLA's `AutotuneKey.key_hash`: md5 of the key list as JSON, sorted keys, no spaces."""
    text = json.dumps(_listify(key), separators=(",", ":"), sort_keys=True)
    return hashlib.md5(text.encode()).hexdigest()


def _listify(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_listify(v) for v in x]
    if isinstance(x, dict):
        return {k: _listify(v) for k, v in x.items()}
    return x


def cache_file(kernel_name: str, entries: Sequence[tuple[Sequence[Any], Mapping[str, Any], float | None]],
               *, triton_version: str | None, default_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `<kernel_name>.json` FLA's config cache reads: entries are (autotune key, config dict, best ms)."""
    return {
        "kernel_name": kernel_name,
        "triton_version": triton_version,
        "autotune_entries": {
            entry_hash(key): {"autotune_key": _listify(key), "config": dict(cfg), "best_timing": ms}
            for key, cfg, ms in entries
        },
        "default_config": dict(default_config) if default_config is not None else None,
    }
