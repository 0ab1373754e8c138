"""Store and read back sweeps, results, workers, environments, tuning and regression records.

Every query of the store outside the queue (`db.queue`) is here: no other package runs a `select` or a session's
`execute` (tests/test_architecture.py); the tuner, the worker, the exporters and the dashboards call these.

Keyword-only functions that take a session. Writers open a write transaction when none is open
(`db.session.begin_write`) and flush, but never commit: the caller owns the transaction (`session_scope`, or
`db.queue.complete_point`, which commits a point's results together with its `done` status). Readers return ORM
objects or flat dicts; timestamps are aware UTC.

Raw timing samples are kept as zlib-compressed little-endian float64 (`encode_samples` / `decode_samples`): the
round trip is exact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

from sqlalchemy import ColumnElement, String, bindparam, cast, func, insert, select, text, type_coerce, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import Label

from db.clock import store_now
from db.models import (
    POINT_STATUSES,
    Artifact,
    Environment,
    Measurement,
    Point,
    Profile,
    RegressionResult,
    Sweep,
    TunedConfig,
    TuningTrial,
    Worker,
)
from db.session import begin_write, execute_rowcount

logger = logging.getLogger(__name__)

POINT_FIELDS = (
    "idx", "key", "params", "op", "mode", "backend", "B", "T", "H", "K", "V", "lb", "W", "layout", "direction",
    "dtype", "seed",
)  # fmt: skip
POINT_OPTIONAL_FIELDS = ("status", "reason", "max_attempts", "device_kind")
SUMMARY_FIELDS = ("median_ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms", "n")


def _now() -> datetime:
    return datetime.now(timezone.utc)


# --- samples ---------------------------------------------------------------------------------------------------


def encode_samples(samples: Sequence[float]) -> bytes:
    """zlib(little-endian float64 array) of the samples, as stored in `measurements.samples`."""
    values = [float(x) for x in samples]
    return zlib.compress(struct.pack(f"<{len(values)}d", *values), level=6)


def decode_samples(blob: bytes) -> list[float]:
    """The samples stored by `encode_samples`, exactly."""
    raw = zlib.decompress(blob)
    if len(raw) % 8:
        raise ValueError(f"samples blob holds {len(raw)} bytes, not a whole number of float64 values")
    return list(struct.unpack(f"<{len(raw) // 8}d", raw))


def ping(session: Session | Connection) -> None:
    """One round trip to the store (`SELECT 1`); raises when it is unavailable."""
    session.execute(text("SELECT 1"))


# --- sweeps and points -----------------------------------------------------------------------------------------


def create_sweep(
    session: Session, *, name: str, tags: Sequence[str], spec: Mapping[str, Any], points: Sequence[Mapping[str, Any]],
    owner: str | None = None,
) -> Sweep:
    """Store a sweep and its expanded points (queued, or skipped with a reason).

    Each point dict has the `Point` columns `idx, key, params, op, mode, backend, B, T, H, K, V, lb, W, layout,
    direction, dtype, seed` and optionally `status` ("queued" | "skipped", default "queued"), `reason`,
    `max_attempts` (default 3) and `device_kind` ("cuda" | "cpu" | None). A sweep with nothing to run is `done`
    at once. `owner`: only the worker claiming with this token may take its points (None: any worker).
    """
    rows = []
    for i, point in enumerate(points):
        missing = [f for f in POINT_FIELDS if f not in point]
        unknown = sorted(set(point) - set(POINT_FIELDS) - set(POINT_OPTIONAL_FIELDS))
        if missing or unknown:
            raise ValueError(f"points[{i}] has missing fields {missing} and unknown fields {unknown}")
        status = point.get("status") or "queued"
        if status not in ("queued", "skipped"):
            raise ValueError(f"points[{i}].status must be 'queued' or 'skipped', got status={status!r}")
        row = {f: point[f] for f in POINT_FIELDS}
        row.update(
            status=status,
            reason=point.get("reason"),
            max_attempts=point.get("max_attempts") or 3,
            device_kind=point.get("device_kind"),
            attempts=0,
        )
        rows.append(row)
    begin_write(session)
    now = _now()
    runnable = any(r["status"] == "queued" for r in rows)
    sweep = Sweep(
        name=name,
        tags=list(tags),
        spec=dict(spec),
        status="queued" if runnable else "done",
        n_points=len(rows),
        created_at=now,
        finished_at=None if runnable else now,
        owner=owner,
    )
    session.add(sweep)
    session.flush()
    for row in rows:
        row["sweep_id"] = sweep.id
        row["finished_at"] = now if row["status"] == "skipped" else None
    if rows:  # one multi-row INSERT, without an ORM object per point (10,000 points: ~0.5 s of CPU, not ~4 s)
        session.execute(insert(Point), rows)
    logger.info("sweep %s %r: %s points (%s queued)", sweep.id, name, len(rows), sum(r["status"] == "queued" for r in rows))
    return sweep


def get_sweep(session: Session, *, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def point_done_by(session: Session, *, point_id: int, worker: str) -> bool:
    """The point is `done` with a measurement by `worker` (its result is stored, e.g. by a commit whose answer was
    lost in an outage)."""
    row = session.execute(
        select(Point.status).join(Measurement, Measurement.point_id == Point.id)
        .where(Point.id == point_id, Measurement.worker == worker)
    ).first()
    return row is not None and row[0] == "done"


def take_over_sweep(session: Session, *, sweep_id: int, owner: str) -> Sweep:
    """Give an unfinished sweep a new owner token (`cpbench run --resume`): from now on only the worker with
    `owner` claims its queued points (a point still leased by the old owner finishes or, its lease expired, is
    queued again by the lease rules). ValueError naming the sweep when it does not exist or has finished."""
    begin_write(session)
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise ValueError(f"no sweep with id {sweep_id}")
    if sweep.status not in ("queued", "running"):
        raise ValueError(f"sweep {sweep_id} is {sweep.status}: nothing to resume")
    sweep.owner = owner
    session.flush()
    return sweep


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_sweeps(session: Session, *, skip: int = 0, limit: int = 50, tag: str | None = None) -> tuple[list[Sweep], int]:
    """Sweeps, newest first, optionally only those tagged `tag`; returns (page, total count)."""
    _check_page(skip, limit)
    stmt = select(Sweep)
    if tag is not None:
        # tags is a JSON list; its text holds the tag JSON-quoted on SQLite and PostgreSQL alike
        stmt = stmt.where(cast(Sweep.tags, String).like(f"%{_like_escape(json.dumps(tag))}%", escape="\\"))
    total = session.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()
    page = session.execute(stmt.order_by(Sweep.id.desc()).offset(skip).limit(limit)).scalars().all()
    return list(page), total


def sweep_progress(session: Session, *, sweep_id: int) -> dict[str, int]:
    """Number of the sweep's points in each status (every status present, zeros included) plus `total`."""
    counts = dict.fromkeys(POINT_STATUSES, 0)
    rows = session.execute(select(Point.status, func.count()).where(Point.sweep_id == sweep_id).group_by(Point.status)).all()
    for status, count in rows:
        counts[status] = count
    counts["total"] = sum(count for _, count in rows)
    return counts


SWEEP_VIEW_COLUMNS = ("id", "name", "tags", "status", "n_points", "created_at", "started_at", "finished_at", "spec")
# `sweep_view`'s two statements, built once (a statement built per call costs more CPU than SQLite's answer)
_SWEEP_ROW = select(*(Sweep.__table__.c[n] for n in SWEEP_VIEW_COLUMNS)).where(Sweep.__table__.c.id == bindparam("sid"))
_SWEEP_COUNTS = (select(Point.status, func.count(), func.count(Measurement.unreliable))
                 .select_from(Point).outerjoin(Measurement, Measurement.point_id == Point.id)
                 .where(Point.sweep_id == bindparam("sid")).group_by(Point.status))


def sweep_view(session: Session, *, sweep_id: int) -> dict[str, Any] | None:
    """One sweep's public columns (`SWEEP_VIEW_COLUMNS`) and `progress` (`sweep_progress` plus `unreliable`), or None
    when there is no such sweep: two prebuilt Core statements, no ORM objects (the sweep page polls it)."""
    row = session.execute(_SWEEP_ROW, {"sid": sweep_id}).first()
    if row is None:
        return None
    progress = {**dict.fromkeys(POINT_STATUSES, 0), "total": 0, "unreliable": 0}
    for status, count, unreliable in session.execute(_SWEEP_COUNTS, {"sid": sweep_id}).tuples():
        progress[status] = count
        progress["total"] += count
        if status == "done":
            progress["unreliable"] = unreliable
    return {**row._asdict(), "progress": progress}


def sweeps_progress(session: Session, *, sweep_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """`sweep_progress` of many sweeps, plus `unreliable` (`sweeps_unreliable`), in two queries."""
    out = {i: {**dict.fromkeys(POINT_STATUSES, 0), "total": 0} for i in sweep_ids}
    if not out:
        return out
    stmt = (select(Point.sweep_id, Point.status, func.count()).where(Point.sweep_id.in_(list(sweep_ids)))
            .group_by(Point.sweep_id, Point.status))
    for sweep_id, status, count in session.execute(stmt).all():
        out[sweep_id][status] = count
        out[sweep_id]["total"] += count
    for sweep_id, count in sweeps_unreliable(session, sweep_ids=sweep_ids).items():
        out[sweep_id]["unreliable"] = count
    return out


def sweeps_unreliable(session: Session, *, sweep_ids: Sequence[int]) -> dict[int, int]:
    """{sweep_id: how many of its `done` points have an unreliable measurement} (`measurements.unreliable`: the stop
    rule did not converge), zeros included."""
    out = dict.fromkeys(sweep_ids, 0)
    if not out:
        return out
    stmt = (select(Point.sweep_id, func.count()).join(Measurement, Measurement.point_id == Point.id)
            .where(Point.sweep_id.in_(list(sweep_ids)), Point.status == "done", Measurement.unreliable.is_not(None))
            .group_by(Point.sweep_id))
    out.update(session.execute(stmt).tuples().all())
    return out


def queued_widths(session: Session, *, sweep_id: int | None = None) -> dict[tuple[int, str | None], int]:
    """{(W, device_kind): queued points} of the live sweeps (or of one sweep): what a worker's gang must fit."""
    stmt = (select(Point.W, Point.device_kind, func.count()).join(Sweep, Sweep.id == Point.sweep_id)
            .where(Point.status == "queued", Sweep.status.in_(("queued", "running"))).group_by(Point.W, Point.device_kind))
    if sweep_id is not None:
        stmt = stmt.where(Point.sweep_id == sweep_id)
    return {(W, kind): n for W, kind, n in session.execute(stmt).all()}


def owned_waiting(session: Session, *, sweep_id: int | None = None) -> list[int]:
    """Ids of the live sweeps (or of that one) with queued points that only their `cpbench run` may claim (an owner
    token): a plain worker never takes them, so they wait until that run resumes (`cpbench run --resume <id>`)."""
    stmt = (select(Sweep.id).join(Point, Point.sweep_id == Sweep.id)
            .where(Point.status == "queued", Sweep.status.in_(("queued", "running")), Sweep.owner.is_not(None))
            .distinct().order_by(Sweep.id))
    if sweep_id is not None:
        stmt = stmt.where(Sweep.id == sweep_id)
    return list(session.execute(stmt).scalars())


def sweeps_by_age(session: Session) -> list[Sweep]:
    """Every sweep, oldest first."""
    return list(session.execute(select(Sweep).order_by(Sweep.created_at)).scalars())


def point_keys(session: Session, *, sweep_ids: Sequence[int]) -> list[str]:
    """The distinct benchmark keys of these sweeps' points, sorted."""
    stmt = select(Point.key).where(Point.sweep_id.in_(list(sweep_ids))).distinct().order_by(Point.key)
    return list(session.execute(stmt).scalars())


def done_medians(session: Session, *, keys: Sequence[str], sweep_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """(key, mode, sweep_id, median_ms, p10_ms, p90_ms, device_name) of the `done` points of these keys in these
    sweeps, by sweep then point."""
    stmt = (select(Point.key, Point.mode, Point.sweep_id, Measurement.median_ms, Measurement.p10_ms, Measurement.p90_ms,
                   Environment.device_name)
            .join(Measurement, Measurement.point_id == Point.id)
            .outerjoin(Environment, Environment.id == Measurement.environment_id)
            .where(Point.key.in_(list(keys)), Point.sweep_id.in_(list(sweep_ids)), Point.status == "done")
            .order_by(Point.sweep_id, Point.id))
    return [tuple(r) for r in session.execute(stmt).all()]


def unreliable_reasons(session: Session, *, keys: Sequence[str], sweep_ids: Sequence[int]) -> dict[tuple[str, int], str]:
    """{(key, sweep_id): why} for the `done` points of these keys in these sweeps whose measurement is unreliable
    (`measurements.unreliable`: the stop rule did not converge)."""
    stmt = (
        select(Point.key, Point.sweep_id, Measurement.unreliable)
        .join(Measurement, Measurement.point_id == Point.id)
        .where(Point.key.in_(list(keys)), Point.sweep_id.in_(list(sweep_ids)), Point.status == "done",
               Measurement.unreliable.is_not(None))
        .order_by(Point.sweep_id, Point.id)
    )
    out: dict[tuple[str, int], str] = {}
    for key, sweep_id, why in session.execute(stmt).all():
        out.setdefault((key, sweep_id), why or "")
    return out


# --- environments and workers ----------------------------------------------------------------------------------

_ENV_COLUMNS = (
    "device_name", "device_count", "compute_capability", "driver", "cuda", "torch", "triton", "python", "cpbench",
    "git_sha", "host",
)  # fmt: skip


def environment_fingerprint(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def get_or_create_environment(session: Session, *, facts: Mapping[str, Any]) -> Environment:
    """The environment row for these facts (found by the sha256 of the sorted facts), created when new.

    Facts named like `Environment` columns fill them; any other fact goes to `extra`. `device_name`, `torch`,
    `python`, `cpbench` and `host` are required.
    """
    required = ("device_name", "torch", "python", "cpbench", "host")
    missing = [f for f in required if facts.get(f) is None]
    if missing:
        raise ValueError(f"facts lacks {missing}; got keys {sorted(facts)}")
    fingerprint = environment_fingerprint(facts)
    begin_write(session)
    found = session.execute(select(Environment).where(Environment.fingerprint == fingerprint)).scalar_one_or_none()
    if found is not None:
        return found
    values = {k: facts[k] for k in _ENV_COLUMNS if k in facts}
    values.setdefault("device_count", 0)
    env = Environment(fingerprint=fingerprint, extra={k: v for k, v in facts.items() if k not in _ENV_COLUMNS}, **values)
    try:
        # a savepoint, so a concurrent insert of the same environment (PostgreSQL) only costs a re-read
        with session.begin_nested():
            session.add(env)
    except IntegrityError:
        return session.execute(select(Environment).where(Environment.fingerprint == fingerprint)).scalar_one()
    return env


def get_environment(session: Session, *, environment_id: int) -> Environment | None:
    return session.get(Environment, environment_id)


def register_worker(
    session: Session, *, name: str, host: str, pid: int, devices: Mapping[str, Any], environment_id: int | None,
    lease_s: float | None = None,
) -> Worker:
    """Record a starting worker (a worker restarted under the same name is reset)."""
    begin_write(session)
    now = store_now(session)
    worker = session.execute(select(Worker).where(Worker.name == name)).scalar_one_or_none()
    if worker is None:
        worker = Worker(name=name, points_done=0)
        session.add(worker)
    worker.host, worker.pid, worker.devices, worker.environment_id = host, pid, dict(devices), environment_id
    worker.status, worker.current_point_id, worker.lease_s = "idle", None, lease_s
    worker.started_at = worker.last_heartbeat = now
    session.flush()
    return worker


def touch_worker(
    session: Session, *, name: str, status: str, current_point_id: int | None = None, points_done_inc: int = 0
) -> Worker:
    """Update a worker's heartbeat, status ("idle" | "busy" | "stopped") and current point."""
    if status not in ("idle", "busy", "stopped"):
        raise ValueError(f"status must be 'idle', 'busy' or 'stopped', got status={status!r}")
    begin_write(session)
    worker = session.execute(select(Worker).where(Worker.name == name)).scalar_one_or_none()
    if worker is None:
        raise ValueError(f"no worker registered with name={name!r}")
    worker.status, worker.current_point_id = status, current_point_id
    worker.points_done += points_done_inc
    worker.last_heartbeat = store_now(session)
    session.flush()
    return worker


def beat_worker(session: Session, *, name: str) -> bool:
    """Renew a worker's heartbeat (during a point: its status stays); False when no such worker is registered."""
    begin_write(session)
    matched = execute_rowcount(session, update(Worker).where(Worker.name == name).values(last_heartbeat=store_now(session))
                               .execution_options(synchronize_session=False))
    return matched == 1


def set_worker_activity(session: Session, *, name: str, activity: Mapping[str, Any] | None) -> None:
    """Put what the worker's devices are busy with beyond timing (`runners.activity`: {"what", "since"}) on its row,
    in `devices["activity"]`, or remove it (None)."""
    begin_write(session)
    worker = session.execute(select(Worker).where(Worker.name == name)).scalar_one_or_none()
    if worker is None:
        return
    devices = {k: v for k, v in (worker.devices or {}).items() if k != "activity"}
    if activity:
        devices["activity"] = dict(activity)
    worker.devices = devices
    session.flush()


def list_workers(session: Session) -> list[Worker]:
    return list(session.execute(select(Worker).order_by(Worker.id)).scalars())


def worker_state(worker: Worker, now: datetime, default_lease_s: float) -> str:
    """"idle" | "busy" | "stopped", or "lost" when it is not stopped and its heartbeat is older than its lease."""
    if worker.status == "stopped":
        return "stopped"
    lease = worker.lease_s or default_lease_s
    return "lost" if (now - worker.last_heartbeat).total_seconds() > lease else worker.status


# --- results ---------------------------------------------------------------------------------------------------


def store_measurement(
    session: Session,
    *,
    point_id: int,
    environment_id: int | None,
    worker: str | None,
    clock: str,
    samples: Sequence[float],
    summary: Mapping[str, Any],
    stop_reason: str | None,
    err_vs_none: float | None,
    err_vs_reference: float | None,
    configs: Mapping[str, Any] | None = None,
    report: Mapping[str, Any] | None = None,
    unreliable: str | None = None,
    hosts: int | None = None,
    ranks_per_host: int | None = None,
    interconnect: str | None = None,
) -> Measurement:
    """Store a point's timing: raw samples (compressed) and their summary (`median_ms, p10_ms, p90_ms, iqr_ms,
    mean_ms, min_ms, max_ms, n`, with `n == len(samples)`), why its stop rule did not converge (`unreliable`,
    None: it did), its correctness errors and the topology it ran on (`runners.topology.Topology.columns`)."""
    missing = [f for f in SUMMARY_FIELDS if f not in summary]
    if missing:
        raise ValueError(f"summary lacks {missing}; got keys {sorted(summary)}")
    if int(summary["n"]) != len(samples):
        raise ValueError(f"summary n={summary['n']} differs from len(samples)={len(samples)}")
    begin_write(session)
    measurement = Measurement(
        point_id=point_id,
        environment_id=environment_id,
        worker=worker,
        clock=clock,
        samples=encode_samples(samples),
        configs=dict(configs or {}),
        report=dict(report or {}),
        stop_reason=stop_reason,
        unreliable=unreliable,
        err_vs_none=err_vs_none,
        err_vs_reference=err_vs_reference,
        hosts=hosts,
        ranks_per_host=ranks_per_host,
        interconnect=interconnect,
        n=int(summary["n"]),
        **{f: float(summary[f]) for f in SUMMARY_FIELDS if f != "n"},
    )
    session.add(measurement)
    session.flush()
    return measurement


def store_summary_measurement(
    session: Session,
    *,
    point_id: int,
    environment_id: int | None,
    fields: Mapping[str, Any],
    report: Mapping[str, Any],
    measured_at: datetime | None = None,
) -> Measurement:
    """Store a measurement known only by its summary (`runners.results_import`: a row exported by another store):
    `fields` holds `clock`, `SUMMARY_FIELDS` and optionally `worker`, `configs`, `stop_reason`, `unreliable`,
    `err_vs_none`, `err_vs_reference`, `hosts`, `ranks_per_host`, `interconnect`. Its samples blob is empty (an
    export carries none); `n` is the original count, and `report` says where it came from. `measured_at`: when the
    other store measured it (default: now), so a later export of this store still says when."""
    missing = [f for f in ("clock", *SUMMARY_FIELDS) if fields.get(f) is None]
    if missing:
        raise ValueError(f"summary lacks {missing}")
    begin_write(session)
    optional = ("stop_reason", "unreliable", "err_vs_none", "err_vs_reference", "hosts", "ranks_per_host", "interconnect")
    measurement = Measurement(
        point_id=point_id,
        environment_id=environment_id,
        worker=fields.get("worker") or "imported",
        clock=fields["clock"],
        samples=encode_samples([]),
        configs=dict(fields.get("configs") or {}),
        report=dict(report),
        n=int(fields["n"]),
        **{f: float(fields[f]) for f in SUMMARY_FIELDS if f != "n"},
        **{f: fields.get(f) for f in optional},
        created_at=measured_at or _now(),
    )
    session.add(measurement)
    session.flush()
    return measurement


def points_by_key(session: Session, *, sweep_id: int) -> dict[str, Point]:
    """The sweep's points by benchmark key (rows locked for update where the dialect has it)."""
    begin_write(session)
    stmt = select(Point).where(Point.sweep_id == sweep_id).with_for_update()
    return {p.key: p for p in session.execute(stmt).scalars()}


def store_profile(
    session: Session,
    *,
    point_id: int,
    collectives: Mapping[str, int],
    collective_bytes: Mapping[str, int],
    host_syncs: int,
    sync_events: Mapping[str, int],
    kernel_launches: int,
    peak_memory_bytes: int | None,
    artifact_id: int | None = None,
    by_direction: Mapping[str, Any] | None = None,
) -> Profile:
    """Store the profiled step of a point (collective counts and bytes, host syncs, launches, peak memory; for a
    training step `by_direction`, the same counts of its forward and of its backward)."""
    begin_write(session)
    profile = Profile(
        point_id=point_id,
        collectives=dict(collectives),
        collective_bytes=dict(collective_bytes),
        host_syncs=host_syncs,
        sync_events=dict(sync_events),
        kernel_launches=kernel_launches,
        peak_memory_bytes=peak_memory_bytes,
        artifact_id=artifact_id,
        by_direction=dict(by_direction) if by_direction else None,
    )
    session.add(profile)
    session.flush()
    return profile


def store_artifact(session: Session, *, point_id: int | None, kind: str, path: str, size_bytes: int, sha256: str) -> Artifact:
    """Record a file kept beside the database (e.g. a gzipped Chrome trace)."""
    begin_write(session)
    artifact = Artifact(point_id=point_id, kind=kind, path=str(path), size_bytes=size_bytes, sha256=sha256)
    session.add(artifact)
    session.flush()
    return artifact


def list_artifact_paths(session: Session) -> list[str]:
    """The path of every artifact row (files kept beside the database)."""
    return list(session.execute(select(Artifact.path)).scalars())


_RESULT_COLUMNS: tuple[Label[Any] | InstrumentedAttribute[Any], ...] = (
    Point.id.label("id"),
    Point.id.label("point_id"),
    Point.sweep_id,
    Point.idx,
    Point.key,
    Point.params,
    Point.op,
    Point.mode,
    Point.backend,
    Point.B,
    Point.T,
    Point.H,
    Point.K,
    Point.V,
    Point.lb,
    Point.W,
    Point.layout,
    Point.direction,
    Point.dtype,
    Point.seed,
    Point.device_kind,
    Point.status,
    Point.reason,
    Point.error,
    Point.attempts,
    Point.max_attempts,
    Point.claimed_at,
    Point.finished_at,
    Measurement.id.label("measurement_id"),
    Measurement.clock,
    Measurement.worker,
    Measurement.n,
    Measurement.median_ms,
    Measurement.p10_ms,
    Measurement.p90_ms,
    Measurement.iqr_ms,
    Measurement.mean_ms,
    Measurement.min_ms,
    Measurement.max_ms,
    Measurement.stop_reason,
    Measurement.unreliable,
    Measurement.err_vs_none,
    Measurement.err_vs_reference,
    Measurement.configs,
    Measurement.report,
    Measurement.hosts,
    Measurement.ranks_per_host,
    Measurement.interconnect,
    Measurement.created_at.label("measured_at"),
    Profile.collectives,
    Profile.collective_bytes,
    Profile.host_syncs,
    Profile.sync_events,
    Profile.kernel_launches,
    Profile.peak_memory_bytes,
    Profile.artifact_id,
    Profile.by_direction,
    Measurement.environment_id,
    Environment.device_name,
    Environment.device_count,
    Environment.compute_capability,
    Environment.driver,
    Environment.cuda,
    Environment.torch,
    Environment.triton,
    Environment.git_sha,
    Environment.host,
)
RESULT_FIELDS = tuple(c.key for c in _RESULT_COLUMNS)


# what a result row can change by, per point: a point changes status or attempts or is claimed anew (claimed_at)
# whenever its reason, error or outcome changes; measurements and profiles are written once (a new row, a new id)
_REVISION_COLUMNS = (
    Point.id, Point.status, Point.attempts, type_coerce(Point.claimed_at, String), type_coerce(Point.finished_at, String),
    Measurement.id, Profile.id,
)  # fmt: skip


def _results_select(columns: Sequence[Any] = _RESULT_COLUMNS) -> Select[Any]:
    return (
        select(*columns)
        .select_from(Point)
        .outerjoin(Measurement, Measurement.point_id == Point.id)
        .outerjoin(Profile, Profile.point_id == Point.id)
        .outerjoin(Environment, Environment.id == Measurement.environment_id)
    )


def _match(column: Any, value: Any) -> ColumnElement[bool]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return column.in_(list(value))
    return column == value


def _check_page(skip: int, limit: int) -> None:
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got skip={skip}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got limit={limit}")


def list_results(
    session: Session,
    *,
    sweep_id: int | Sequence[int] | None = None,
    op: str | Sequence[str] | None = None,
    mode: str | Sequence[str] | None = None,
    backend: str | Sequence[str] | None = None,
    direction: str | Sequence[str] | None = None,
    B: int | Sequence[int] | None = None,
    T: int | Sequence[int] | None = None,
    W: int | Sequence[int] | None = None,
    lb: float | Sequence[float] | None = None,
    device: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    skip: int = 0,
    limit: int = 100,
) -> tuple[list[dict[str, Any]], int]:
    """One flat dict per point (keys `RESULT_FIELDS`) joined with its measurement, profile and environment.

    Each filter takes one value or a list of values; `device` matches the environment's `device_name`.
    Points without a measurement (queued, failed, skipped...) have None in the measurement fields. Ordered by
    point id; returns (page, total count matching the filters).
    """
    filters = {"sweep_id": sweep_id, "op": op, "mode": mode, "backend": backend, "direction": direction, "B": B, "T": T,
               "W": W, "lb": lb, "device": device, "status": status}  # fmt: skip
    rows, total = _results_page(session, _RESULT_COLUMNS, filters, skip, limit)
    return [dict(zip(RESULT_FIELDS, row, strict=True)) for row in rows], total


def results_revision(session: Session, *, skip: int = 0, limit: int = 100, **filters: Any) -> tuple[Any, ...]:
    """The revision of the `list_results(session, skip=, limit=, **filters)` page, at a fraction of its cost: per point
    of the page its id, status, attempts, claim and finish times and its measurement's and profile's ids, and the
    total count. Two reads with the same revision give the same page, so a page can be cached under it."""
    rows, total = _results_page(session, _REVISION_COLUMNS, filters, skip, limit)
    return tuple(tuple(row) for row in rows), total


_RESULT_FILTERS = {
    "sweep_id": Point.sweep_id, "op": Point.op, "mode": Point.mode, "backend": Point.backend,
    "direction": Point.direction, "B": Point.B, "T": Point.T, "W": Point.W, "lb": Point.lb,
    "device": Environment.device_name, "status": Point.status,
}  # fmt: skip


def _results_page(session: Session, columns: Sequence[Any], filters: Mapping[str, Any], skip: int,
                  limit: int) -> tuple[list[Any], int]:
    """`columns` of the points matching `filters` ({name in `_RESULT_FILTERS`: value or values; None: any}), by point
    id, one page; and the total count matching."""
    _check_page(skip, limit)
    stmt = _results_select(columns)
    for name, value in filters.items():
        if value is not None:
            stmt = stmt.where(_match(_RESULT_FILTERS[name], value))
    rows = list(session.execute(stmt.order_by(Point.id).offset(skip).limit(limit)))
    if 0 < len(rows) < limit or (skip == 0 and not rows):  # the last page: the count is known without a query
        return rows, skip + len(rows)
    return rows, session.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()


def short_error(error: str | None) -> str | None:
    """A stored point error without its traceback: the summary line ("rank 0: ValueError: ...", type and message)
    and the traceback's last line when it says more, so that no frame or install path shows (a worker stores the
    traceback, possibly cut to its tail, after that line). An error with no traceback is returned whole."""
    if not error or ("Traceback (most recent call last):" not in error and '\n  File "' not in error):
        return error
    lines = [line for line in error.splitlines() if line.strip()]
    first, last = lines[0], lines[-1]
    return first if last[0].isspace() or last in first else f"{first}\n{last}"


def results_by_key(session: Session, *, sweep_ids: Sequence[int]) -> dict[str, dict[str, Any]]:
    """For each benchmark key measured in these sweeps, its latest `done` result row plus decoded `samples`."""
    stmt = (
        _results_select()
        .add_columns(Measurement.samples.label("samples"))
        .where(Point.sweep_id.in_(list(sweep_ids)), Point.status == "done", Measurement.id.is_not(None))
        .order_by(Measurement.created_at, Measurement.id)
    )
    out: dict[str, dict[str, Any]] = {}
    for row in session.execute(stmt).mappings():
        item = dict(row)
        item["samples"] = decode_samples(item["samples"])
        out[item["key"]] = item
    return out


# --- tuning ----------------------------------------------------------------------------------------------------


def store_trial(session: Session, **fields: Any) -> TuningTrial:
    """Store one tuning trial; `fields` are `TuningTrial` columns (kernel, key, key_str, config, strategy, ...)."""
    columns = set(TuningTrial.__table__.columns.keys()) - {"id"}
    unknown = sorted(set(fields) - columns)
    if unknown:
        raise ValueError(f"store_trial got unknown fields {unknown}; valid: {sorted(columns)}")
    begin_write(session)
    trial = TuningTrial(**fields)
    session.add(trial)
    session.flush()
    return trial


def list_trials(
    session: Session, *, kernel: str | None = None, sweep_id: int | None = None, device_name: str | None = None,
    status: str | None = None, error_contains: str | None = None,
) -> list[TuningTrial]:
    """Tuning trials in the order stored, filtered by kernel, sweep, device, status and a substring of the error."""
    stmt = select(TuningTrial).order_by(TuningTrial.id)
    if status is not None:
        stmt = stmt.where(TuningTrial.status == status)
    if error_contains is not None:
        stmt = stmt.where(TuningTrial.error.contains(error_contains))
    if kernel is not None:
        stmt = stmt.where(TuningTrial.kernel == kernel)
    if sweep_id is not None:
        stmt = stmt.where(TuningTrial.sweep_id == sweep_id)
    if device_name is not None:
        stmt = stmt.where(TuningTrial.device_name == device_name)
    return list(session.execute(stmt).scalars())


def upsert_tuned_config(
    session: Session,
    *,
    kernel: str,
    key: Mapping[str, Any],
    key_str: str,
    device_name: str,
    compute_capability: str | None,
    config: Mapping[str, Any],
    median_ms: float,
    default_ms: float | None,
    runner_up_ms: float | None,
    source_hash: str,
    sweep_id: int | None,
    environment_id: int | None,
    measured_at: datetime | None = None,
) -> TunedConfig:
    """Insert or replace the winning config for (kernel, key_str, device_name); `measured_at` default: now."""
    begin_write(session)
    values = {
        "key": dict(key), "compute_capability": compute_capability, "config": dict(config), "median_ms": median_ms,
        "default_ms": default_ms, "runner_up_ms": runner_up_ms, "source_hash": source_hash, "sweep_id": sweep_id,
        "environment_id": environment_id, "measured_at": measured_at or _now(),
    }  # fmt: skip
    ident = (TunedConfig.kernel == kernel, TunedConfig.key_str == key_str, TunedConfig.device_name == device_name)
    for _ in range(2):
        row = session.execute(select(TunedConfig).where(*ident)).scalar_one_or_none()
        if row is not None:
            for name, value in values.items():
                setattr(row, name, value)
            session.flush()
            return row
        row = TunedConfig(kernel=kernel, key_str=key_str, device_name=device_name, **values)
        try:
            with session.begin_nested():
                session.add(row)
            return row
        except IntegrityError:
            continue  # inserted meanwhile by another process: update it instead
    raise RuntimeError(f"could not upsert tuned config kernel={kernel!r} key_str={key_str!r} device_name={device_name!r}")


def list_tuned_configs(session: Session, *, device_name: str | None = None) -> list[TunedConfig]:
    stmt = select(TunedConfig).order_by(TunedConfig.device_name, TunedConfig.kernel, TunedConfig.key_str)
    if device_name is not None:
        stmt = stmt.where(TunedConfig.device_name == device_name)
    return list(session.execute(stmt).scalars())


class TuningRows(Protocol):
    """What `store_tuning` stores (`runners.tuner.TuneResult` is one): plain field dicts, measured beforehand."""

    def trial_rows(self) -> Iterable[Mapping[str, Any]]: ...  # `store_trial` fields but sweep_id, environment_id

    def winner_rows(self) -> Iterable[Mapping[str, Any]]: ...  # `upsert_tuned_config` fields but the same two


def store_tuning(
    session: Session, *, result: TuningRows, sweep_id: int | None = None, environment_id: int | None = None
) -> list[TunedConfig]:
    """Store a tuning run measured without a session: its trials, then its winners (upserted, each keeping when it
    was measured), all with `sweep_id` and `environment_id`; returns the winners' rows."""
    ids: dict[str, Any] = {"sweep_id": sweep_id, "environment_id": environment_id}
    for trial in result.trial_rows():
        store_trial(session, **trial, **ids)
    return [upsert_tuned_config(session, **winner, **ids) for winner in result.winner_rows()]


# --- regression ------------------------------------------------------------------------------------------------


def store_regression_results(session: Session, *, rows: Sequence[Mapping[str, Any]]) -> list[RegressionResult]:
    """Store the verdicts of one regression run (each row: `RegressionResult` columns)."""
    columns = set(RegressionResult.__table__.columns.keys()) - {"id"}
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - columns)
        if unknown:
            raise ValueError(f"rows[{i}] has unknown fields {unknown}; valid: {sorted(columns)}")
    begin_write(session)
    stored = [RegressionResult(**dict(row)) for row in rows]
    session.add_all(stored)
    session.flush()
    return stored


def list_regression_results(
    session: Session, *, key: str | Sequence[str] | None = None, suite: str | None = None, run_id: str | None = None
) -> list[RegressionResult]:
    """Regression verdicts in the order stored; `key` one key or a list of keys."""
    stmt = select(RegressionResult).order_by(RegressionResult.id)
    if key is not None:
        stmt = stmt.where(_match(RegressionResult.key, key))
    if suite is not None:
        stmt = stmt.where(RegressionResult.suite == suite)
    if run_id is not None:
        stmt = stmt.where(RegressionResult.run_id == run_id)
    return list(session.execute(stmt).scalars())
