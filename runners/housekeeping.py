"""Housekeeping of a worker's files: trace files with no artifact row and spool files nobody will store.

A worker names its files after the random suffix of its identity (`point<id>-<tag>.trace.json.gz` under the
artifact folder, `point<id>-a<attempt>-<tag>.json` in the spool). A file is an orphan when
- a trace file has no `artifacts` row and is older than `min_age_s` (a live worker writes the row right after),
- a spool file's worker is not alive: stopped, gone from the store, or its heartbeat older than its lease.

`collect_garbage` (`cpbench gc`) removes every orphan; `remove_own_leftovers` (worker start) removes the orphans
of this host's dead worker processes only (their pid no longer runs), so two hosts sharing a folder never
remove each other's files.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GcReport", "collect_garbage", "remove_own_leftovers"]

logger = logging.getLogger(__name__)

_TRACE = re.compile(r"^point\d+-(?P<tag>[A-Za-z0-9-]+)\.trace\.json(\.gz)?$")
_SPOOL = re.compile(r"^point\d+-a\d+-(?P<tag>[A-Za-z0-9-]+)\.(json|tmp)$")


@dataclass
class GcReport:
    """What a collection removed (or would remove with `dry_run`)."""

    removed: list[Path] = field(default_factory=list)
    bytes: int = 0


def _tag(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.rsplit(":", 1)[-1])


def _file_tag(f: Path) -> str | None:
    m = _TRACE.match(f.name) or _SPOOL.match(f.name)
    return m["tag"] if m is not None else None


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _worker_tags(url: str) -> tuple[set[str], set[str], set[str]]:
    """(tags of live workers, tags of dead ones, tags of this host's dead worker processes)."""
    from db import crud
    from db.clock import store_now
    from db.session import session_scope
    from runners.settings import get_worker_settings

    lease = get_worker_settings().LEASE_S
    live: set[str] = set()
    dead: set[str] = set()
    own_dead: set[str] = set()
    host = socket.gethostname()
    with session_scope(url) as s:
        now = store_now(s)
        for w in crud.list_workers(s):
            tag = _tag(w.name)
            gone = crud.worker_state(w, now, lease) in ("stopped", "lost")
            (dead if gone else live).add(tag)
            if w.host == host and (w.status == "stopped" or not _pid_alive(w.pid)) and w.pid != os.getpid():
                own_dead.add(tag)
    return live, dead, own_dead


def _artifact_paths(url: str) -> set[str]:
    from db import crud
    from db.session import session_scope

    with session_scope(url) as s:
        return {str(Path(p).resolve()) for p in crud.list_artifact_paths(s)}


def _orphans(art_root: Path, spool_dir: Path, known: set[str], dead: set[str], live: set[str],
             min_age_s: float) -> list[Path]:
    now = time.time()
    out: list[Path] = []
    if art_root.is_dir():
        for f in art_root.rglob("point*.trace.json*"):
            m = _TRACE.match(f.name)
            if m is None or str(f.resolve()) in known or m["tag"] in live and now - f.stat().st_mtime < min_age_s:
                continue
            if m["tag"] in dead or now - f.stat().st_mtime >= min_age_s:
                out.append(f)
    if spool_dir.is_dir():
        for f in spool_dir.iterdir():
            m = _SPOOL.match(f.name)
            if m is not None and m["tag"] not in live:
                out.append(f)
    return out


def _remove(files: list[Path], dry_run: bool) -> GcReport:
    report = GcReport()
    for f in files:
        try:
            size = f.stat().st_size
            if not dry_run:
                f.unlink()
        except FileNotFoundError:
            continue
        report.removed.append(f)
        report.bytes += size
    return report


def collect_garbage(url: str, art_root: Path, spool_dir: Path, *, min_age_s: float = 3600.0,
                    dry_run: bool = False) -> GcReport:
    """Remove every orphan trace and spool file (see the module docstring)."""
    live, dead, _ = _worker_tags(url)
    known = _artifact_paths(url)
    return _remove(_orphans(art_root, spool_dir, known, dead, live, min_age_s), dry_run)


def remove_own_leftovers(url: str, art_root: Path, spool_dir: Path) -> GcReport:
    """At worker start: remove the orphans of this host's dead worker processes (best effort, never raises)."""
    try:
        live, _, own_dead = _worker_tags(url)
        known = _artifact_paths(url)
        files = [f for f in _orphans(art_root, spool_dir, known, own_dead, live, float("inf")) if _file_tag(f) in own_dead]
        report = _remove(files, dry_run=False)
    except Exception:  # noqa: BLE001 - housekeeping must not stop a worker from starting
        logger.warning("could not remove leftover files", exc_info=True)
        return GcReport()
    if report.removed:
        logger.info("removed %d leftover file(s) of dead workers on this host (%d bytes)", len(report.removed), report.bytes)
    return report
