"""What a worker's devices are busy with beyond timing (a peer's first-call compile), from the rank to `cpbench status`.

A rank announces a long first call with `notice("compiling FlashQLA kernels")` around it: a small JSON file at the
path in `CPBENCH_ACTIVITY_FILE` (the worker sets it for its gangs), removed when the call returns. The worker's
heartbeat reads it (`read_notice`) and keeps it on its row (`db.crud.beat_worker(activity=...)`) while it lasts;
`describe` words it for `cpbench status`: "compiling FlashQLA kernels, 95 s". Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ACTIVITY_ENV", "describe", "notice", "read_notice"]

ACTIVITY_ENV = "CPBENCH_ACTIVITY_FILE"


@contextlib.contextmanager
def notice(what: str) -> Iterator[None]:
    """Announce `what` (with its start time) while inside, when this process has a notice file; else nothing."""
    path = os.environ.get(ACTIVITY_ENV)
    if not path:
        yield
        return
    target = Path(path)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"what": what, "since": time.time()}))
        tmp.replace(target)
    except OSError:
        pass  # a notice is a courtesy: never fail the point for it
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            target.unlink()


def read_notice(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The notice at `path` ({"what", "since"}), or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("what"), str):
        return None
    return {"what": data["what"], "since": float(data.get("since", time.time()))}


def describe(activity: Mapping[str, Any] | None, now: float | None = None) -> str | None:
    """The words of an activity for `cpbench status` ("compiling FlashQLA kernels, 95 s"), None for none."""
    if not activity or not activity.get("what"):
        return None
    elapsed = max(0.0, (time.time() if now is None else now) - float(activity.get("since", 0.0)))
    return f"{activity['what']}, {elapsed:.0f} s"
