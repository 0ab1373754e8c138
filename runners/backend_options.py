"""Our backends' own options (`mode_options: {triton: {keep: "wy+states"}}`): checked, per point, put in its launch plan.

Only `triton` has options: `kernels.vocabulary.BACKEND_OPTIONS` (`keep`: the recompute policy `LaunchPlan.keep` of
`kernels.plan`, default "auto": `kernels.vocabulary.AUTO_KEEP`'s per op). They travel like a peer's options (`params.backend_options`, in the point
key as `,opts=triton.keep=wy+states`), but a point carries only those that change what it measures:

    check(backend, options)             the spec's entry, or a one-line ValueError (unknown option, value not allowed)
    for_point(backend, options, mode, direction)
                                        what a point runs with: the values other than the default, and nothing
                                        unless the point trains (fwd+bwd) through `kernels.dispatch.ChunkFunction`
                                        (`kernels.vocabulary.AUTOGRAD_MODES`; the others recompute in any case)
    plan_fields(backend, options)       the fields of the point's launch plan they set: `{"keep": ...}` (runners.execute
                                        builds the plan the point's kernels calls get)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.vocabulary import AUTOGRAD_MODES, BACKEND_OPTIONS

__all__ = ["OPTIONS", "check", "for_point", "plan_fields"]

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


def plan_fields(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The `kernels.plan.LaunchPlan` fields a point's options set: triton's recompute policy `keep`, or none."""
    if backend == "triton" and "keep" in options:
        return {"keep": options["keep"]}
    return {}
