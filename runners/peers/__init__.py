"""PEERS: implementations of the CP modes that are not ours (FLA's Triton path `fla`, FLA as dispatched
`fla_dispatch`, FlashQLA `flash_qla`, FlashKDA `flash_kda`, or a team's own kernel as a plugin).

The engine's side of the protocol (`runners.plugins` loads a peer, `runners.grid` asks why a point cannot run,
`runners.execute` runs it); a point reaches a peer as a `runners.point.PointSpec` (attributes: `point.K`,
`point.direction`, `point.mode_options`; `point["K"]` still reads for peers written against the former params dict).
A peer backend is any object (an instance or a class) with these attributes; `Peer` is a base with the defaults:

    name: str                                 # the point's `backend` column: [a-z][a-z0-9_]{0,15}, not torch, triton, reference, auto or all
    modes: Mapping[str, Sequence[str]]        # mode -> directions it implements, e.g. {"none": ("fwd",)}
    unsupported: Mapping[str, str]            # (optional) mode -> why it is not implemented (shown as the reason)
    direction_reasons: Mapping[str, str]      # (optional) mode -> why a direction it lacks is missing
    options: Mapping[str, Any]                # (optional) knobs of `mode_options: {<name>: {...}}`, with defaults
    options_for(options, mode, direction) -> dict  # (optional) those of them that apply to a mode (the rest
                                              # stay out of that mode's points and keys)
    skip_reason(point) -> str | None          # (optional) why a point (a PointSpec) cannot run; evaluated when
                                              # the sweep is expanded
    available() -> str | None                 # (optional) why it cannot run in this process (None: it can)
    forward(mode, op, q, k, v, g, beta, *, group, ctx, scale, options) -> Tensor
                                              # this rank's output `[1, ctx.local_len, H, V]`, inputs as
                                              # `kernels.cp.forward` takes them (flattened, B = 1; for `none` and
                                              # `warmup_correct` the whole batch with a world_size=1 context)
    expected_collectives(mode, ctx, options) -> dict  # (optional) what one step issues on this rank, like
                                              # `kernels.cp.expected_collectives` (stored beside the profile)
    first_call_s: float                       # (optional) seconds its first call may spend compiling/autotuning,
                                              # added to the point's time limit (default 0)
    begin_point(point) -> None                # (optional) called when a point's mode is built on this rank
    point_report(point) -> dict               # (optional) the peer's facts about the point it just ran (host
                                              # values, read after timing): stored in the point's report, e.g.
                                              # the split FlashQLA chose, the implementation FLA dispatched to
    step_context(options) -> context manager  # (optional) entered around each timed step; for direction
                                              # "fwd+bwd" the step is forward + `o.backward(do)` (the output must
                                              # carry autograd: a differentiable forward is the backward)
    transition(...) (optional; `kernels.transition`'s contract, for the modes that chain maps)

`peer_skip_reason(peer, point)` is the one rule the grid applies to every peer point: the mode and direction
must be declared, then the peer's own `skip_reason`; `peer_options(peer, point)` are the options a point runs
with. Nothing here imports a peer's package.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from typing import Any

from runners.point import PointSpec

__all__ = ["NAME_RE", "Peer", "check_peer", "peer_options", "peer_skip_reason"]

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
_RESERVED = ("torch", "triton", "reference", "auto", "all")  # "all": the dashboards' every-backend choice


class Peer:
    """Defaults of the peer protocol (subclass it, or give the same attributes on any object)."""

    name: str = ""
    modes: Mapping[str, tuple[str, ...]] = {}
    options: Mapping[str, Any] = {}
    first_call_s: float = 0.0

    def skip_reason(self, point: PointSpec) -> str | None:
        return None

    def available(self) -> str | None:
        return None

    def step_context(self, options: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def forward(self, mode: str, op: str, q: Any, k: Any, v: Any, g: Any, beta: Any, *, group: Any, ctx: Any,
                scale: float | None, options: Mapping[str, Any]) -> Any:
        raise NotImplementedError


def check_peer(obj: Any, where: str) -> Any:
    """`obj` if it satisfies the protocol, else a ValueError naming `where` and what is missing."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not NAME_RE.match(name) or name in _RESERVED:
        raise ValueError(f"backend {where}: `name` must match [a-z][a-z0-9_]{{0,15}} and not be one of "
                         f"{', '.join(_RESERVED)}, got {name!r}")
    modes = getattr(obj, "modes", None)
    if not isinstance(modes, Mapping) or not modes:
        raise ValueError(f"backend {where}: `modes` must be a non-empty mapping mode -> directions, got {modes!r}")
    for mode, dirs in modes.items():
        if isinstance(dirs, str) or not all(isinstance(d, str) for d in dirs):
            raise ValueError(f"backend {where}: modes[{mode!r}] must be a list of directions, got {dirs!r}")
    if not callable(getattr(obj, "forward", None)):
        raise ValueError(f"backend {where}: no callable `forward`")
    first = getattr(obj, "first_call_s", 0.0)
    if isinstance(first, bool) or not isinstance(first, (int, float)) or not math.isfinite(first) or first < 0:
        raise ValueError(f"backend {where}: `first_call_s` must be a finite number of seconds >= 0, got {first!r}")
    return obj


def peer_options(peer: Any, point: PointSpec) -> dict[str, Any]:
    """The peer's options for a point: its defaults, overridden by the point's `backend_options`."""
    return {**dict(getattr(peer, "options", {}) or {}), **point.backend_options}


def peer_skip_reason(peer: Any, point: PointSpec) -> str | None:
    """Why the peer cannot run the point (mode, direction, then its own rule), or None."""
    name, mode, direction = peer.name, point.mode, point.direction
    modes = peer.modes
    if mode not in modes:
        why = (getattr(peer, "unsupported", None) or {}).get(mode)
        return f"backend '{name}' does not implement mode '{mode}'" + (f": {why}" if why else f" (it has {', '.join(modes)})")
    if direction not in tuple(modes[mode]):
        why = (getattr(peer, "direction_reasons", None) or {}).get(mode)
        return (f"backend '{name}' runs mode '{mode}' only in direction(s) {', '.join(modes[mode])}, not '{direction}'"
                + (f": {why}" if why else ""))
    own = getattr(peer, "skip_reason", None)
    return own(point) if callable(own) else None
