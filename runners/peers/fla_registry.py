"""FLA's backend registry read and held: which implementation FLA's dispatch ran, and FLA pinned to its Triton path.

FLA 0.6.0 routes its public ops through a backend registry (`fla.backends`): every `@dispatch`ed function asks the
registered backends in priority order (`is_available()`, `is_enabled()` from its `FLA_<NAME>` switch, then its
verifier on the call's arguments) and runs the first that accepts, else its own Triton function. On Hopper with the
peers installed, GDN's `chunk_gated_delta_rule` goes to FlashQLA (priority 3), KDA's `chunk_kda` to FlashKDA (under
no_grad), parts of the backward to the TileLang backend.

- `pinned_to_triton()`: FLA's Triton path for the duration of a step. `FLA_DISABLE_BACKEND_DISPATCH=1` does that,
  but FLA reads it once, when `fla.backends` is imported (the wrappers are then not built at all); in a process where
  it was not set, the registries are emptied for the step but for FLA's own Triton backends (`KEPT_BY_PIN`: its
  intra-card CP, off unless FLA_INTRACARD_CP=1), which leaves each wrapper nothing else to try but FLA's own
  function. `pin_note()` says which of the two pinned a run (stored in the point's report). The variable at import
  also turns FLA's intra-card CP off (`dispatch_disabled_at_import`).
- `recording(record)`: which implementation each dispatched call actually ran: every registered backend's
  implementation is wrapped while inside, so a call that reaches one records `function -> backend_type`; a function
  with no record ran FLA's own (Triton) function. A backend's verifier that declines a call is recorded with its
  reason (FlashQLA's "requires K=128, got 64"), so a point that fell back to Triton says why.
- `config_cache_note()`: whether FLA took its autotuned configs from a config cache (`FLA_CONFIG_DIR` with
  `FLA_CACHE_MODE`, e.g. `cpbench configs export --format fla`) instead of autotuning, as FLA itself reads them.

FLA is imported only when one of these is entered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "DISABLE_ENV",
    "KEPT_BY_PIN",
    "TRITON",
    "DispatchRecord",
    "config_cache_note",
    "dispatch_disabled_at_import",
    "op_function",
    "pin_note",
    "pinned_to_triton",
    "recording",
]

DISABLE_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
# FLA's own Triton implementations that FLA registers as dispatch backends: its intra-card CP (switched by
# FLA_INTRACARD_CP, under inference mode) is `backend: fla`'s warmup_correct, so the pin keeps it
KEPT_BY_PIN = ("intracard_cp",)
TRITON = "triton"  # what a dispatched function runs when no backend takes the call: FLA's own Triton function
_OP_FUNCTIONS = {"gdn": "chunk_gated_delta_rule", "kda": "chunk_kda"}


def op_function(op: str) -> str:
    """The name of FLA's public chunk function of `op` (the key of its dispatch record)."""
    return _OP_FUNCTIONS[op]


def _registries() -> list[Any]:
    """Every backend registry FLA has built in this process (per operation and per dispatched function)."""
    import fla.backends as fb

    return [*fb._operation_registries.values(), *fb._function_registries.values()]


def dispatch_disabled_at_import() -> bool:
    """FLA was imported with FLA_DISABLE_BACKEND_DISPATCH=1: its dispatch is off for the whole process."""
    import fla.backends as fb

    return bool(fb._DISPATCH_DISABLED)


def pin_note() -> str:
    """How `backend: fla` is held on FLA's Triton path in this process (stored with its points)."""
    if dispatch_disabled_at_import():
        return f"triton ({DISABLE_ENV}=1 when FLA was imported)"
    return (
        f"triton (FLA's backend registries emptied for the step but for its own Triton intra-card CP: the effect of "
        f"{DISABLE_ENV}=1, which FLA reads only when it is imported)"
    )


def config_cache_note() -> dict[str, Any] | None:
    """FLA's config cache as FLA reads it in this process (its `FLA_CACHE_MODE`, fixed when FLA was imported, and
    its config directory with the kernel files there), or None when FLA autotunes on its own (mode `disabled`)."""
    from fla.ops.utils import cache

    if cache.FLA_CACHE_MODE is cache.FlaCacheMode.DISABLED:
        return None
    folder = cache.get_fla_config_dir()
    kernels = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    return {"mode": cache.FLA_CACHE_MODE.value, "dir": str(folder), "kernels": len(kernels)}


@contextlib.contextmanager
def pinned_to_triton() -> Iterator[None]:
    """FLA's dispatched functions run FLA's own Triton functions while inside (re-entrant)."""
    if dispatch_disabled_at_import():
        yield
        return
    saved = [(registry, registry._backends) for registry in _registries()]
    for registry, backends in saved:
        registry._backends = {name: b for name, b in backends.items() if name in KEPT_BY_PIN}
    try:
        yield
    finally:
        for registry, backends in saved:
            registry._backends = backends


class DispatchRecord:
    """What FLA's dispatch ran: function name -> backend type, for the calls that a registered backend took; and why
    the backends that were asked declined (function -> backend type -> the verifier's reason)."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}
        self.declined: dict[str, dict[str, str]] = {}

    def ran(self, function: str) -> str:
        """The implementation `function` ran: a backend type, or `triton` (FLA's own function)."""
        return self.calls.get(function, TRITON)

    def as_dict(self, op: str) -> dict[str, Any]:
        fn = op_function(op)
        out: dict[str, Any] = {"op": self.ran(fn), "calls": dict(sorted(self.calls.items()))}
        if self.declined.get(fn):
            out["declined"] = dict(sorted(self.declined[fn].items()))
        return out


def _recorded(backend: Any, record: DispatchRecord) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`backend`'s get_implementation and verify, recording into `record` what ran and what was declined."""
    get_impl, verify = backend.get_implementation, backend.verify

    def get_implementation(function_name: str) -> Any:
        impl = get_impl(function_name)
        if impl is None:
            return None

        def run(*args: Any, **kwargs: Any) -> Any:
            record.calls[function_name] = backend.backend_type
            return impl(*args, **kwargs)

        return run

    def verified(function_name: str, *args: Any, **kwargs: Any) -> tuple[bool, str | None]:
        accepted, reason = verify(function_name, *args, **kwargs)
        if not accepted:
            record.declined.setdefault(function_name, {})[backend.backend_type] = str(reason)
        return accepted, reason

    return get_implementation, verified


@contextlib.contextmanager
def recording(record: DispatchRecord) -> Iterator[DispatchRecord]:
    """Record into `record` which backend each dispatched call runs while inside (FLA's registries, as they are)."""
    patched = []
    for registry in _registries():
        for backend in registry._backends.values():
            if "get_implementation" in vars(backend):
                continue  # already recording (nested)
            backend.get_implementation, backend.verify = _recorded(backend, record)
            patched.append(backend)
    try:
        yield record
    finally:
        for backend in patched:
            del backend.get_implementation, backend.verify
