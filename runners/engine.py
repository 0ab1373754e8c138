"""The engine's two entry points for other parts of cpbench (CLI, server demo, regression runs).

    with session_scope(url) as s:
        sweep = submit_spec(s, spec)              # grid expansion + create_sweep (commits with the scope)
    final = run_until_done(url, sweep.id, progress=print)   # work it in this process until finished

`submit_spec` accepts a `SweepSpec`, a mapping (validated, `SpecError` on a bad field) or a YAML/JSON path.
Points that cannot run are stored as skipped with their reason; `max_W`/`backends` let a caller that will run
the sweep itself skip what this machine cannot do (`cpbench run` passes its own devices); without them only
the spec's own rules apply and workers pick points by W and device kind at claim time.

`run_until_done` runs a worker (`runners.worker.run_worker`) in this process until the sweep is done or
cancelled, and returns the sweep's final progress counts. A sweep submitted with an `owner` token (`new_owner()`) is
claimed only by a worker given the same token and never by the others; `cpbench run` and `cpbench regress` own
their sweeps this way, so their in-process worker works exactly their points.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runners.errors import SweepNotFoundError
from runners.grid import available_modes, expand
from runners.spec import SweepSpec, load_spec, parse_spec

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.models import Sweep

__all__ = ["new_owner", "run_until_done", "submit_spec"]

logger = logging.getLogger(__name__)

_DEVICE_KIND = {"any": None, "cuda": "cuda", "cpu": "cpu"}


def submit_spec(
    session: Session,
    spec: SweepSpec | Mapping[str, Any] | str | Path,
    *,
    max_W: int | None = None,
    backends: Iterable[str] | None = None,
    keys: Collection[str] | None = None,
    owner: str | None = None,
) -> Sweep:
    """Expand the spec's grid and store the sweep with its points (queued or skipped); flushes, the caller commits.

    keys: keep only the points with these keys (a regression round rerunning some keys of a suite). owner: only a
    worker with this token works the sweep (see the module doc).
    """
    from db import crud

    if isinstance(spec, (str, Path)):
        spec = load_spec(spec)
    elif not isinstance(spec, SweepSpec):
        spec = parse_spec(spec)
    points = expand(spec, max_W=max_W, modes=available_modes(), backends=backends)
    if keys is not None:
        points = [p for p in points if p["key"] in keys]
    device_kind = _DEVICE_KIND[spec.device]
    for p in points:
        p["device_kind"] = device_kind
    sweep = crud.create_sweep(session, name=spec.name, tags=spec.tags, spec=spec.model_dump(mode="json"), points=points,
                              owner=owner)
    logger.info("submitted sweep %s %r: %d points", sweep.id, spec.name, len(points))
    return sweep


def new_owner(verb: str) -> str:
    """A fresh owner token for the sweeps one process submits and works itself: `<verb>:<host>:<pid>:<random>`."""
    return f"{verb}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:128]


def run_until_done(
    url: str | None,
    sweep_id: int,
    *,
    progress: Callable[[dict[str, int]], None] | None = None,
    devices: int | None = None,
    stop_event: threading.Event | None = None,
    **worker_kwargs: Any,
) -> dict[str, int]:
    """Work the sweep in this process until it is done or cancelled; returns its final progress counts.

    progress(counts) is called at the start and after each point (counts per status plus `total`).
    Extra keyword arguments go to `run_worker` (lease_s, heartbeat_s, device_kind, artifact_dir, on_point, owner:
    the sweep's owner token when it has one...).
    """
    from db import crud
    from db.session import session_scope
    from runners.worker import run_worker

    with session_scope(url) as s:
        if crud.get_sweep(s, sweep_id=sweep_id) is None:
            raise SweepNotFoundError(f"no sweep with id {sweep_id}")
    run_worker(url, until_sweep=sweep_id, on_progress=progress, devices=devices, stop_event=stop_event, **worker_kwargs)
    with session_scope(url) as s:
        final = crud.sweep_progress(s, sweep_id=sweep_id)
    if progress is not None:
        progress(final)
    return final
