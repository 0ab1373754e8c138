"""Import exported result rows into a sweep of this store, matched by benchmark key (`cpbench db import`).

A store on a machine that cannot reach the service (an air-gapped GPU node, a device lent for one session) exports
its rows with `cpbench results N -f json` (every field) or `-f csv` (`runners.cli.common.CSV_FIELDS`). Here they
fill the points of a sweep that hold the same keys and are not measured yet: a sweep submitted from the same spec, or
from a larger one (a whole grid whose parts ran on different machines), so its pages and figures show them together
and a worker runs only what is still queued.

- Only rows with status `done` are imported; a point is filled when it is `queued` or `failed` (a `running` point
  is a worker's; a `done` one keeps its measurement; a `skipped` one has its reason).
- An imported measurement holds the summary (n, median, percentiles, errors, the profile's counts and peak memory)
  but not the raw samples, which an export does not carry: its samples blob is empty, `n` is the original count, and
  `report["imported"]` names the file, the original sweep, point and store time. A JSON export keeps the report
  (a peer's split, FLA's dispatch) and the launch configs; a CSV export has neither.
- The environment row is the export's device, versions, git sha and host ("unknown" where the export lacks one).
- Re-importing the same file changes nothing (its points are done).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["ImportSummary", "import_files", "import_rows", "read_rows"]

# the fields a `done` row must carry (both export formats have them)
REQUIRED = ("key", "status", "clock", "n", "median_ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms")
_JSON_FIELDS = ("params", "collectives", "collective_bytes", "by_direction", "sync_events", "configs", "report")
_INT_FIELDS = ("n", "attempts", "host_syncs", "kernel_launches", "peak_memory_bytes", "hosts", "ranks_per_host",
               "device_count", "sweep_id", "point_id")  # fmt: skip
_FLOAT_FIELDS = ("median_ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms", "err_vs_none",
                 "err_vs_reference")  # fmt: skip
_ENV_FIELDS = ("device_name", "device_count", "compute_capability", "driver", "cuda", "torch", "triton", "git_sha", "host")
FILLABLE = ("queued", "failed")


@dataclass
class ImportSummary:
    """What an import did: keys imported, and the rows it left out, by why."""

    imported: list[str] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)  # the sweep's point was measured already
    not_in_sweep: list[str] = field(default_factory=list)  # no point of the sweep has the key
    not_fillable: list[str] = field(default_factory=list)  # the point is running or skipped
    not_done: int = 0  # rows of the export that were not `done` (skipped, queued, failed there)

    def lines(self, sweep_id: int) -> list[str]:
        out = [f"imported {len(self.imported)} row(s) into sweep {sweep_id}"]
        for what, keys in (("already measured there", self.already_done), ("not in the sweep", self.not_in_sweep),
                           ("running or skipped there", self.not_fillable)):  # fmt: skip
            if keys:
                shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")
                out.append(f"left out {len(keys)} {what}: {shown}")
        if self.not_done:
            out.append(f"{self.not_done} row(s) of the export were not done (skipped, queued or failed there)")
        return out


def _value(name: str, raw: Any) -> Any:
    """A cell as the store's type (CSV: JSON columns parsed, numbers converted, "" as None; JSON values as they
    are), `measured_at` (ISO 8601) as an aware datetime, naive read as UTC, so a bad file fails before any import."""
    if not isinstance(raw, str):
        return raw
    if raw == "":
        return None
    try:
        if name in _JSON_FIELDS:
            return json.loads(raw)
        if name in _INT_FIELDS:
            return int(float(raw))
        if name in _FLOAT_FIELDS:
            return float(raw)
        if name == "measured_at":
            when = datetime.fromisoformat(raw)
            return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    except ValueError as e:
        kind = {"measured_at": "an ISO 8601 time"}.get(name, "a JSON value" if name in _JSON_FIELDS else "a number")
        raise ValueError(f"column {name!r} holds {raw[:60]!r}, not {kind}") from e
    return raw


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The result rows of an export (`cpbench results N -f json` or `-f csv`), by the file's suffix."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from e
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: not a `cpbench results -f json` export (a list of result objects)")
    elif path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        raise ValueError(f"{path}: the suffix must be .json or .csv (a `cpbench results -f json|csv` export)")
    if rows:
        missing = [f for f in REQUIRED if f not in rows[0]]
        if missing:
            raise ValueError(f"{path}: not a `cpbench results` export: it lacks the column(s) {', '.join(missing)}")
    try:
        return [{k: _value(k, v) for k, v in r.items()} for r in rows]
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def _facts(row: Mapping[str, Any]) -> dict[str, Any]:
    """The environment facts of an exported row (`db.crud.get_or_create_environment`)."""
    facts = {k: row.get(k) for k in _ENV_FIELDS if row.get(k) is not None}
    for k in ("device_name", "torch", "host", "python", "cpbench"):
        facts.setdefault(k, row.get(k) or "unknown")
    return facts


def import_rows(url: str, sweep_id: int, rows: Iterable[Mapping[str, Any]], *, source: str) -> ImportSummary:
    """Fill the sweep's unmeasured points from the `done` rows with their keys, in one transaction."""
    from db import crud
    from db.models import utcnow
    from db.queue import refresh_sweep_status
    from db.session import session_scope

    summary = ImportSummary()
    done: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if r.get("status") == "done":
            done[str(r["key"])] = r  # a key twice: the later row (a later export of the same store)
        else:
            summary.not_done += 1
    with session_scope(url) as s:
        if crud.get_sweep(s, sweep_id=sweep_id) is None:
            raise ValueError(f"no sweep {sweep_id} in this store (`cpbench status` lists them)")
        points = crud.points_by_key(s, sweep_id=sweep_id)
        for key, row in done.items():
            point = points.get(key)
            if point is None:
                summary.not_in_sweep.append(key)
                continue
            if point.status == "done":
                summary.already_done.append(key)
                continue
            if point.status not in FILLABLE:
                summary.not_fillable.append(key)
                continue
            missing = [f for f in REQUIRED if row.get(f) is None]
            if missing:
                raise ValueError(f"{source}: the done row of {key} lacks {', '.join(missing)}")
            env = crud.get_or_create_environment(s, facts=_facts(row))
            report = dict(row.get("report") or {})
            when = row.get("measured_at")  # an older export has none: the import's time
            report["imported"] = {"from": source, "sweep_id": row.get("sweep_id"), "point_id": row.get("point_id"),
                                  "measured_at": when and when.isoformat()}  # fmt: skip
            crud.store_summary_measurement(s, point_id=point.id, environment_id=env.id, fields=row, report=report,
                                           measured_at=when)  # fmt: skip
            if row.get("host_syncs") is not None:
                crud.store_profile(
                    s, point_id=point.id, collectives=row.get("collectives") or {},
                    collective_bytes=row.get("collective_bytes") or {}, host_syncs=int(row["host_syncs"]),
                    sync_events=row.get("sync_events") or {}, kernel_launches=int(row.get("kernel_launches") or 0),
                    peak_memory_bytes=row.get("peak_memory_bytes"), by_direction=row.get("by_direction"),
                )  # fmt: skip
            point.status, point.error, point.finished_at = "done", None, utcnow()
            point.attempts = max(int(row.get("attempts") or 1), 1)
            point.lease_owner = point.lease_expires_at = None
            summary.imported.append(key)
        s.flush()
        s.commit()
        refresh_sweep_status(s, sweep_id=sweep_id)
    return summary


def import_files(url: str, sweep_id: int, paths: Sequence[str | Path]) -> list[ImportSummary]:
    """`import_rows` of each file in turn (each its own transaction), after every file has been read."""
    read = [(str(p), read_rows(p)) for p in paths]
    return [import_rows(url, sweep_id, rows, source=Path(p).name) for p, rows in read]
