"""Backend resolution: our backends (torch, triton), FLA's (`fla`), and peer backends from outside the project.

A sweep's `backends` entry is one of:

- `torch` / `triton`: our kernels (not peers);
- `fla`: FLA's implementation of each mode on its Triton path (`runners.peers.fla`); `fla_dispatch`: FLA as
  installed, its backend dispatch on (`runners.peers.fla_dispatch`); `flash_qla`: FlashQLA (`runners.peers.flash_qla`);
  `flash_kda`: FlashKDA (`runners.peers.flash_kda`);
- a name registered under the entry point group `cpbench.backends` by an installed package
  (`[project.entry-points."cpbench.backends"] mine = "my_pkg.cpbench:BACKEND"`);
- `package.module:object`: an importable object (a class is instantiated with no arguments), only from a module
  allowed by the setting `CPBENCH_PLUGIN_MODULES` (comma-separated module names, or prefixes ending in '.':
  `my_pkg.` allows `my_pkg.bench`) or the value of an installed `cpbench.backends` entry point. A spec comes over
  REST too: no other module is ever imported, not when the spec is submitted (`cpbench serve`, `cpbench run`) and
  not by a worker that finds such a point in the store (its point fails with the reason).

A peer must satisfy `runners.peers`' protocol (checked when loaded). Its `name` becomes the points' backend;
for a plugin the spec's string travels with each point (`PointSpec.backend_ref`) so a worker loads the same object.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from typing import Any

from kernels.vocabulary import OUR_BACKENDS
from runners.peers import check_peer
from runners.point import PointSpec
from runners.settings import get_worker_settings

__all__ = ["ENTRY_POINT_GROUP", "OURS", "PLUGIN_MODULES_SETTING", "allowed_modules", "clear_cache", "is_ours", "load_peer",
           "module_allowed", "peer_of_point", "refusal", "unavailable"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "cpbench.backends"
OURS = OUR_BACKENDS  # kernels.vocabulary
# the built-in peers (kernels.vocabulary.PEER_BACKENDS): name -> (module, object)
_BUILT_IN = {
    "fla": ("runners.peers.fla", "FLA"),
    "fla_dispatch": ("runners.peers.fla_dispatch", "FLA_DISPATCH"),
    "flash_qla": ("runners.peers.flash_qla", "FLASH_QLA"),
    "flash_kda": ("runners.peers.flash_kda", "FLASH_KDA"),
}
PLUGIN_MODULES_SETTING = "CPBENCH_PLUGIN_MODULES"  # = runners.settings.WorkerSettings.PLUGIN_MODULES


def is_ours(ref: str) -> bool:
    """True for our own backends (torch, triton), which are not peers."""
    return ref in OURS


def _entry_point(name: str) -> Any:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    return None


def allowed_modules() -> tuple[str, ...]:
    """The module names and prefixes (ending in '.') of the setting CPBENCH_PLUGIN_MODULES, as read by this process."""
    return tuple(m.strip() for m in get_worker_settings().PLUGIN_MODULES.split(",") if m.strip())


def module_allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """`module` is one of `allowed`, or starts with one of its prefixes (an entry ending in '.')."""
    return any(module == a or (a.endswith(".") and module.startswith(a)) for a in allowed)


def _registered(module: str, attr: str) -> bool:
    """`module:attr` is the value of an installed `cpbench.backends` entry point."""
    return any(ep.module == module and ep.attr == attr for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def refusal(ref: str) -> str | None:
    """Why the `module:object` reference `ref` may not be imported here (one line), or None: its module is allowed
    by CPBENCH_PLUGIN_MODULES or it is an installed entry point's value. Other references are never refused."""
    if ":" not in ref:
        return None
    module, _, attr = ref.partition(":")
    if module_allowed(module, allowed_modules()) or _registered(module, attr):
        return None
    return (f"backend {ref!r} is refused: module {module!r} is not allowed by the setting {PLUGIN_MODULES_SETTING} "
            f"(comma-separated module names or prefixes ending in '.') nor an installed '{ENTRY_POINT_GROUP}' entry point")


def _import(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_peer(ref: str) -> Any:
    """The peer object of a backend reference (`fla`, an entry point name, or an allowed `module:object`).

    Raises ValueError with one line naming the reference when it is refused (`refusal`; checked on every call, before
    any import), cannot be loaded or breaks the protocol.
    """
    why = refusal(ref)
    if why:
        raise ValueError(why)
    return _load(ref)


def clear_cache() -> None:
    """Forget the loaded peers (tests that change the installed entry points)."""
    _load.cache_clear()


@functools.lru_cache(maxsize=64)
def _load(ref: str) -> Any:
    if is_ours(ref):
        raise ValueError(f"backend {ref!r} is one of ours, not a peer")
    if ref in _BUILT_IN:
        module, attr = _BUILT_IN[ref]
        return getattr(importlib.import_module(module), attr)
    try:
        obj = _import(ref) if ":" in ref else _entry_point(ref)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot load backend plugin {ref!r}: {type(err).__name__}: {err}") from None
    if obj is None:
        raise ValueError(f"unknown backend {ref!r}: not torch, triton or a built-in peer ({', '.join(_BUILT_IN)}), not 'package.module:object', and no "
                         f"installed package registers it under the entry point group '{ENTRY_POINT_GROUP}'")
    if isinstance(obj, type):
        obj = obj()
    check_peer(obj, repr(ref))
    if ":" not in ref and ref != obj.name:
        raise ValueError(f"backend plugin {ref!r}: the entry point name must equal the backend's name {obj.name!r}")
    return obj


def peer_of_point(point: PointSpec) -> Any | None:
    """The peer that runs a point, or None for our own backends."""
    if is_ours(point.backend):
        return None
    return load_peer(point.backend_ref or point.backend)


def unavailable(point: PointSpec, ours: tuple[str, ...], where: str = "here") -> str | None:
    """Why this process cannot run the point's backend (None: it can). `ours`: our backends installed here."""
    backend = point.backend
    if is_ours(backend):
        return None if backend in ours else f"backend {backend!r} is not available {where} (have {', '.join(ours)})"
    try:
        peer = peer_of_point(point)
    except ValueError as err:
        return str(err)
    check = getattr(peer, "available", None)
    why = check() if callable(check) else None
    return f"backend {backend!r} is not available {where}: {why}" if why else None
