"""The store's tables (SQLAlchemy 2): sweeps and their points (the queue), measurements, profiles, artifacts,
tuning trials, tuned configs, regression verdicts, workers and the environments results were measured in.

Data only: behaviour (claiming, storing, querying) lives in `db.crud` and `db.queue`. Alembic owns the schema
(`db/migrations`); a change here needs a new revision.

Status vocabularies are the `*_STATUSES` tuples below; they are stored as plain strings. Every timestamp is a
`db.types.UTCDateTime`: aware UTC on read, on SQLite as on PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from db.base import Base
from db.types import UTCDateTime

SWEEP_STATUSES = ("queued", "running", "done", "cancelled")
POINT_STATUSES = ("queued", "running", "done", "failed", "skipped", "cancelled")
TRIAL_STATUSES = ("ok", "invalid", "disqualified", "failed")
VERDICTS = ("SLOW", "FAST", "SAME", "INCONCLUSIVE", "CHANGED")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Environment(Base):
    """Where a result was measured: device, driver and software versions, code revision, host."""

    __tablename__ = "environments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the fields below
    device_name: Mapped[str] = mapped_column(String(128))  # "NVIDIA H200" or "cpu"
    device_count: Mapped[int] = mapped_column(Integer, default=0)
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    driver: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(32))
    torch: Mapped[str] = mapped_column(String(64))
    triton: Mapped[str | None] = mapped_column(String(64))
    python: Mapped[str] = mapped_column(String(32))
    cpbench: Mapped[str] = mapped_column(String(32))
    git_sha: Mapped[str | None] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Worker(Base):
    """A runner process: its devices, heartbeat and what it is doing."""

    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # host:pid:uuid8
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    # {"kind": "cuda"|"cpu", "count": n, "names": [...]}, and while it lasts "activity": {"what", "since"} (a long
    # first call being compiled, runners.activity)
    devices: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    status: Mapped[str] = mapped_column(String(16), default="idle")  # idle | busy | stopped
    current_point_id: Mapped[int | None] = mapped_column(Integer)
    points_done: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    lease_s: Mapped[float | None] = mapped_column(Float)  # the lease it takes: a heartbeat older than this is "lost"


class Sweep(Base):
    """One submitted grid: its spec as given and its lifecycle. Progress counts come from its points."""

    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # runners.spec.SweepSpec.model_dump(mode="json")
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    n_points: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # the one worker (its `owner` token) that may claim the points: `cpbench run` and `cpbench regress` work their
    # own sweeps in-process; NULL = any worker (db.queue.claim_point)
    owner: Mapped[str | None] = mapped_column(String(128), index=True)
    points: Mapped[list[Point]] = relationship(back_populates="sweep", cascade="all, delete-orphan", order_by="Point.idx")


class Point(Base):
    """One grid point of a sweep and its place in the queue (lease, attempts, outcome)."""

    __tablename__ = "points"
    __table_args__ = (
        UniqueConstraint("sweep_id", "idx"),
        Index("ix_points_status_id", "status", "id"),
        Index("ix_points_filters", "op", "mode", "backend", "T", "W"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    idx: Mapped[int] = mapped_column(Integer)  # position in the deterministic grid expansion
    key: Mapped[str] = mapped_column(String(512), index=True)  # canonical benchmark key (same point across sweeps)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)  # every axis value, incl. lengths for varlen
    op: Mapped[str] = mapped_column(String(8))
    mode: Mapped[str] = mapped_column(String(32))
    backend: Mapped[str] = mapped_column(String(16))
    B: Mapped[int] = mapped_column(Integer)
    T: Mapped[int] = mapped_column(BigInteger)
    H: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    V: Mapped[int] = mapped_column(Integer)
    lb: Mapped[float] = mapped_column(Float)
    W: Mapped[int] = mapped_column(Integer)
    layout: Mapped[str] = mapped_column(String(16))
    direction: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str | None] = mapped_column(String(16))  # "cuda" | "cpu": which workers may claim it; None = any
    status: Mapped[str] = mapped_column(String(16), default="queued")
    reason: Mapped[str | None] = mapped_column(Text)  # why skipped
    error: Mapped[str | None] = mapped_column(Text)  # why failed (last attempt)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), index=True)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sweep: Mapped[Sweep] = relationship(back_populates="points")
    measurement: Mapped[Measurement | None] = relationship(back_populates="point", uselist=False, cascade="all, delete-orphan")
    profile: Mapped[Profile | None] = relationship(back_populates="point", uselist=False, cascade="all, delete-orphan")


class Measurement(Base):
    """Timing of one point: raw samples (zlib-compressed float64 ms) plus their summary, and its correctness."""

    __tablename__ = "measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    point_id: Mapped[int] = mapped_column(ForeignKey("points.id", ondelete="CASCADE"), unique=True)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    worker: Mapped[str | None] = mapped_column(String(255))
    clock: Mapped[str] = mapped_column(String(16))  # "cuda_events" | "wall"
    samples: Mapped[bytes] = mapped_column(LargeBinary)  # zlib(float64 little-endian array), ms per step (max over ranks)
    n: Mapped[int] = mapped_column(Integer)
    median_ms: Mapped[float] = mapped_column(Float)
    p10_ms: Mapped[float] = mapped_column(Float)
    p90_ms: Mapped[float] = mapped_column(Float)
    iqr_ms: Mapped[float] = mapped_column(Float)
    mean_ms: Mapped[float] = mapped_column(Float)
    min_ms: Mapped[float] = mapped_column(Float)
    max_ms: Mapped[float] = mapped_column(Float)
    stop_reason: Mapped[str | None] = mapped_column(String(32))  # "noise" | "max_samples" | "timeout"
    # why the stop rule did not converge (`runners.timing.unreliable_reason`); None: it did
    unreliable: Mapped[str | None] = mapped_column(String(255))
    err_vs_none: Mapped[float | None] = mapped_column(Float)  # relative L2 error of o vs the `none` mode
    err_vs_reference: Mapped[float | None] = mapped_column(Float)  # relative L2 vs the fp32 reference (reduced shape)
    configs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # kernel name -> launch config used
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # scheme report (e.g. warmup_correct), floors
    # the topology the point ran on (`runners.topology`): hosts its ranks spanned, ranks per host, and the links
    # ("none" | "loopback" | "nvlink" | "pcie", "+<between hosts>" across hosts); NULL where not known (before 0006)
    hosts: Mapped[int | None] = mapped_column(Integer)
    ranks_per_host: Mapped[int | None] = mapped_column(Integer)
    interconnect: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    point: Mapped[Point] = relationship(back_populates="measurement")


class Artifact(Base):
    """A file kept beside the database (e.g. a gzipped Chrome trace), referenced by path."""

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    point_id: Mapped[int | None] = mapped_column(ForeignKey("points.id", ondelete="SET NULL"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # "chrome_trace"
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Profile(Base):
    """One profiled step of a point: collectives (counts and bytes), host syncs, launches, peak memory; for a
    training step the same counts per direction."""

    __tablename__ = "profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    point_id: Mapped[int] = mapped_column(ForeignKey("points.id", ondelete="CASCADE"), unique=True)
    collectives: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)  # all_to_all, all_gather, send, recv, all_reduce
    collective_bytes: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    host_syncs: Mapped[int] = mapped_column(Integer, default=0)
    sync_events: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)  # aten::item, aten::_local_scalar_dense, d2h copies...
    kernel_launches: Mapped[int] = mapped_column(Integer, default=0)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    artifact_id: Mapped[int | None] = mapped_column(ForeignKey("artifacts.id", ondelete="SET NULL"))
    # a training step's split (runners.profile): {"fwd": {collectives, collective_bytes, host_syncs}, "bwd": {...}};
    # NULL for a forward point (and for profiles stored before 0004)
    by_direction: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    point: Mapped[Point] = relationship(back_populates="profile")


class TuningTrial(Base):
    """One config tried for one kernel and shape key: checked, then timed (or why not)."""

    __tablename__ = "tuning_trials"
    __table_args__ = (Index("ix_tuning_trials_kernel_key", "kernel", "key_str", "device_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    device_name: Mapped[str] = mapped_column(String(128))
    kernel: Mapped[str] = mapped_column(String(128))
    key: Mapped[dict[str, Any]] = mapped_column(JSON)
    key_str: Mapped[str] = mapped_column(String(512))  # canonical "H=16,K=128,..." (sorted)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    strategy: Mapped[str] = mapped_column(String(32))  # exhaustive | random | halving
    rung: Mapped[int] = mapped_column(Integer, default=0)  # successive-halving round
    status: Mapped[str] = mapped_column(String(16))  # see TRIAL_STATUSES
    median_ms: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TunedConfig(Base):
    """The winning config per (kernel, shape key, device), with its margin over the runner-up and the default."""

    __tablename__ = "tuned_configs"
    __table_args__ = (UniqueConstraint("kernel", "key_str", "device_name", name="uq_tuned_configs_kernel_key_device"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kernel: Mapped[str] = mapped_column(String(128))
    key: Mapped[dict[str, Any]] = mapped_column(JSON)
    key_str: Mapped[str] = mapped_column(String(512))
    device_name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    median_ms: Mapped[float] = mapped_column(Float)
    default_ms: Mapped[float | None] = mapped_column(Float)
    runner_up_ms: Mapped[float | None] = mapped_column(Float)
    source_hash: Mapped[str] = mapped_column(String(64))  # hash of the kernel source when tuned
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    measured_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RegressionResult(Base):
    """Verdict of one benchmark key of a regression run against its baseline."""

    __tablename__ = "regression_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), index=True)  # one `cpbench regress` invocation
    suite: Mapped[str] = mapped_column(String(128))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    baseline_ref: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(512), index=True)
    verdict: Mapped[str] = mapped_column(String(16))  # see VERDICTS
    ratio: Mapped[float | None] = mapped_column(Float)  # new median / baseline median
    effect_log: Mapped[float | None] = mapped_column(Float)  # Hodges-Lehmann shift of log medians
    p_welch: Mapped[float | None] = mapped_column(Float)
    p_mannwhitney: Mapped[float | None] = mapped_column(Float)
    q_value: Mapped[float | None] = mapped_column(Float)  # Benjamini-Hochberg
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # deterministic signal diffs, medians
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
