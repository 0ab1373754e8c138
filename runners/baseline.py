"""Where the two sides of a regression run come from: stored sweeps -> runs per key, a baseline REF -> its sweeps,
and the portable baseline file (`cpbench regress ... --save-baseline FILE`).

A *run* of a key is one stored point of it: its measurement's median and IQR/median, and its deterministic signals
(status, collective counts and bytes, host syncs, the launch configs used). Every sweep a regression run submits is
one run of the suite; repetitions inside a sweep are further runs of the same key.

A baseline REF is, in this order:
- a path to a baseline file (JSON written by `--save-baseline`);
- sweep ids, `12` or `12,13,14`: those sweeps;
- a tag: the newest sweep carrying it and, when that sweep came from `cpbench regress`, every sweep of the same
  regression run that carries the tag too (so a recorded baseline contributes all its runs).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernels.vocabulary import REGRESS_RUN_TAG
from runners.errors import CpbenchError, SweepNotFoundError
from runners.regress import Run

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = [
    "BASELINE_FORMAT",
    "RUN_TAG_PREFIX",
    "BaselineError",
    "Side",
    "collect_runs",
    "load_baseline_file",
    "resolve_baseline",
    "run_from_result",
    "save_baseline_file",
    "tagged_sweeps",
]

logger = logging.getLogger(__name__)

BASELINE_FORMAT = "cpbench-regress-baseline"
BASELINE_VERSION = 1
RUN_TAG_PREFIX = REGRESS_RUN_TAG  # tag on every sweep one `cpbench regress` invocation submits (kernels.vocabulary)
_PAGE = 1000
_SIGNAL_FIELDS = ("collectives", "collective_bytes", "host_syncs", "configs")


class BaselineError(CpbenchError):
    """The baseline REF names nothing usable (no such tag, an unreadable or malformed file)."""


@dataclass
class Side:
    """One side of a comparison: runs per key, and where they came from."""

    ref: str
    runs: dict[str, list[Run]]
    sweep_ids: list[int] = field(default_factory=list)
    device: str | None = None
    suite: str | None = None


def run_from_result(row: Mapping[str, Any]) -> Run | None:
    """A `db.crud.list_results` row -> one `Run`; None for points that never ran to an outcome (queued, running,
    cancelled). Failed and skipped points are runs without a timing, so a change of status is seen."""
    status = row.get("status")
    if status not in ("done", "failed", "skipped"):
        return None
    signals: dict[str, Any] = {"status": status}
    median = row.get("median_ms") if status == "done" else None
    if median is None:
        return Run(median_ms=None, signals=signals)
    for name in _SIGNAL_FIELDS:
        if row.get(name) is not None:
            signals[name] = row[name]
    iqr = row.get("iqr_ms")
    rel_iqr = float(iqr) / float(median) if iqr is not None and median > 0 else None
    return Run(median_ms=float(median), rel_iqr=rel_iqr, n=row.get("n"), signals=signals)


def collect_runs(session: Session, *, sweep_ids: Sequence[int],
                 keys: Iterable[str] | None = None) -> tuple[dict[str, list[Run]], str | None]:
    """Runs per key of these sweeps (in sweep, then point order), and the device most of them ran on."""
    from db import crud

    wanted = set(keys) if keys is not None else None
    out: dict[str, list[Run]] = {}
    devices: Counter[str] = Counter()
    for sid in sweep_ids:
        skip = 0
        while True:
            rows, total = crud.list_results(session, sweep_id=sid, skip=skip, limit=_PAGE)
            for row in rows:
                if wanted is not None and row["key"] not in wanted:
                    continue
                run = run_from_result(row)
                if run is None:
                    continue
                out.setdefault(row["key"], []).append(run)
                if row.get("device_name"):
                    devices[row["device_name"]] += 1
            skip += len(rows)
            if not rows or skip >= total:
                break
    device = devices.most_common(1)[0][0] if devices else None
    return out, device


def resolve_baseline(session: Session, ref: str) -> Side:
    """The baseline named by REF (file, sweep ids or tag; see the module docstring), with its runs loaded."""
    from db import crud

    ref = ref.strip()
    if not ref:
        raise BaselineError("--baseline is empty; give a baseline file, sweep id(s) or a tag")
    path = Path(ref)
    if ref.lower().endswith(".json") or path.is_file():
        return load_baseline_file(path)
    if re.fullmatch(r"\d+(\s*,\s*\d+)*", ref):
        ids = [int(x) for x in ref.split(",")]
        for sid in ids:
            if crud.get_sweep(session, sweep_id=sid) is None:
                raise SweepNotFoundError(f"baseline sweep {sid} not found in the store")
    else:
        ids = tagged_sweeps(session, ref)
        if not ids:
            raise BaselineError(f"no sweep is tagged {ref!r}: record a baseline with "
                                f"`cpbench regress SUITE --baseline {ref} --record-baseline`, or pass a sweep id or a file")
    runs, device = collect_runs(session, sweep_ids=ids)
    sweep = crud.get_sweep(session, sweep_id=ids[0])
    return Side(ref=ref, runs=runs, sweep_ids=ids, device=device, suite=sweep.name if sweep else None)


def tagged_sweeps(session: Session, tag: str) -> list[int]:
    """Sweep ids of the newest regression run tagged `tag` (or the newest such sweep alone), oldest first."""
    from db import crud

    latest, total = crud.list_sweeps(session, tag=tag, limit=1)
    if not total:
        return []
    run_tags = [t for t in latest[0].tags if t.startswith(RUN_TAG_PREFIX)]
    if not run_tags:
        return [latest[0].id]
    ids: list[int] = []
    skip = 0
    while True:
        page, n = crud.list_sweeps(session, tag=run_tags[0], skip=skip, limit=_PAGE)
        ids += [s.id for s in page if tag in s.tags]
        skip += len(page)
        if not page or skip >= n:
            break
    return sorted(ids)


def save_baseline_file(path: str | Path, side: Side) -> Path:
    """Write a side's runs as a portable baseline (JSON); `--baseline FILE` reads it back."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": side.suite,
        "ref": side.ref,
        "sweep_ids": list(side.sweep_ids),
        "device": side.device,
        "keys": {
            key: [{"median_ms": r.median_ms, "rel_iqr": r.rel_iqr, "n": r.n, "signals": dict(r.signals)} for r in runs]
            for key, runs in sorted(side.runs.items())
        },
    }
    p.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return p


def load_baseline_file(path: str | Path) -> Side:
    """Read a baseline file written by `save_baseline_file`; BaselineError names what is wrong."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"baseline file {p} not found") from None
    except (OSError, json.JSONDecodeError) as err:
        raise BaselineError(f"cannot read baseline file {p}: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT:
        raise BaselineError(f"{p} is not a cpbench baseline file (format must be {BASELINE_FORMAT!r}, "
                            f"got {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r})")
    if doc.get("version") != BASELINE_VERSION:
        raise BaselineError(f"{p}: baseline version {doc.get('version')!r} is not supported (expected {BASELINE_VERSION})")
    runs: dict[str, list[Run]] = {}
    for key, items in (doc.get("keys") or {}).items():
        try:
            runs[key] = [Run(median_ms=None if it.get("median_ms") is None else float(it["median_ms"]),
                             rel_iqr=it.get("rel_iqr"), n=it.get("n"), signals=dict(it.get("signals") or {}))
                         for it in items]
        except (AttributeError, TypeError, ValueError) as err:
            raise BaselineError(f"{p}: keys[{key!r}] is malformed: {err}") from None
    return Side(ref=str(p), runs=runs, sweep_ids=[int(x) for x in doc.get("sweep_ids") or []],
                device=doc.get("device"), suite=doc.get("suite"))
