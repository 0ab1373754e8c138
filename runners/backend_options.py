"""Our backends' own options (`mode_options: {triton: {keep: "wy+states"}}`): checked, per point, applied per step.

Only `triton` has options: `kernels.vocabulary.BACKEND_OPTIONS` (`keep`: the recompute policy
`kernels.autograd.KEEP`, default "inputs"). They travel like a peer's options (`params.backend_options`, in the point
key as `,opts=triton.keep=wy+states`), but a point carries only those that change what it measures:

    check(backend, options)             the spec's entry, or a one-line ValueError (unknown option, value not allowed)
    for_point(backend, options, mode, direction)
                                        what a point runs with: the values other than the default, and nothing
                                        unless the point trains (fwd+bwd) through `kernels.autograd.ChunkFunction`
                                        (`kernels.vocabulary.AUTOGRAD_MODES`; the others recompute in any case)
    step_context(backend, options)      entered around each step of the point: `kernels.autograd.keeping(keep)`
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from kernels.vocabulary import AUTOGRAD_MODES, BACKEND_OPTIONS

__all__ = ["OPTIONS", "check", "for_point", "step_context"]

OPTIONS = BACKEND_OPTIONS  # backend -> name -> values (default first)


def check(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as given, when every name is one of the backend's and every value an allowed one."""
    known = OPTIONS.get(backend, {})
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for backend '{backend}'; known: "
                         f"{', '.join(sorted(known)) or 'none'}")
    for name, value in options.items():
        if value not in known[name]:
            raise ValueError(f"backend '{backend}' option {name} must be one of {', '.join(known[name])}, got {value!r}")
    return dict(options)


def for_point(backend: str, options: Mapping[str, Any], mode: str, direction: str) -> dict[str, Any]:
    """The options a point of (`mode`, `direction`) runs with: those that differ from the default, where they have
    an effect (the training step of a mode that trains through ChunkFunction); else none."""
    if direction != "fwd+bwd" or mode not in AUTOGRAD_MODES:
        return {}
    known = OPTIONS.get(backend, {})
    return {k: v for k, v in options.items() if k in known and v != known[k][0]}


def step_context(backend: str, options: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """The context a step of the point runs in: the recompute policy `keep` set (restored after), or nothing."""
    if backend == "triton" and "keep" in options:
        from kernels import autograd

        return autograd.keeping(options["keep"])
    return contextlib.nullcontext()
