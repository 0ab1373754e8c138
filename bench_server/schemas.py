"""Pydantic I/O models of the API. Tables live in `db.models`; these are what goes over the wire.

Families follow the template's naming: `SweepCreate` (the body of POST /sweeps: a `runners.spec.SweepSpec`),
`SweepPublic` (one sweep with its progress), `SweepsPublic` ({data, count} page); `ResultPublic` / `ResultsPublic`
(one flat row per point: point, measurement, profile and environment columns, as `db.crud.list_results` gives
them); `WorkerPublic` / `WorkersPublic`; `Health`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runners.spec import SweepSpec

__all__ = [
    "Health",
    "Message",
    "ResultPublic",
    "ResultsPublic",
    "SweepCancelled",
    "SweepCreate",
    "SweepProgress",
    "SweepPublic",
    "SweepsPublic",
    "WorkerPublic",
    "WorkersPublic",
]

SweepCreate = SweepSpec  # the body of POST /sweeps


class SweepProgress(BaseModel):
    """Points of a sweep per status; `unreliable` counts the done ones whose stop rule did not converge."""

    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    total: int = 0
    unreliable: int = 0


class SweepPublic(BaseModel):
    """A sweep as the API returns it: lifecycle, spec as submitted, and progress counts."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    tags: list[str]
    status: str
    n_points: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: SweepProgress
    spec: dict[str, Any]


class SweepsPublic(BaseModel):
    """A page of sweeps, newest first, with the total count."""

    data: list[SweepPublic]
    count: int


class SweepCancelled(SweepPublic):
    """The sweep after a cancel, with how many queued points were cancelled."""

    cancelled_points: int


class ResultPublic(BaseModel):
    """One grid point with its outcome: None in the measurement/profile fields until it is measured."""

    model_config = ConfigDict(extra="allow")

    id: int
    point_id: int
    sweep_id: int
    idx: int
    key: str
    params: dict[str, Any]
    op: str
    mode: str
    backend: str
    B: int
    T: int
    H: int
    K: int
    V: int
    lb: float
    W: int
    layout: str
    direction: str
    dtype: str
    seed: int
    status: str
    reason: str | None = None
    error: str | None = None
    attempts: int | None = None
    finished_at: datetime | None = None
    clock: str | None = None
    n: int | None = None
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    iqr_ms: float | None = None
    # why the stop rule did not converge (stopped on max_samples / timeout, or n < min_samples); None: it did
    unreliable: str | None = None
    err_vs_none: float | None = None
    err_vs_reference: float | None = None
    configs: dict[str, Any] | None = None
    report: dict[str, Any] | None = None
    collectives: dict[str, int] | None = None
    collective_bytes: dict[str, int] | None = None
    host_syncs: int | None = None
    # a training step's counts per direction: {"fwd": {collectives, collective_bytes, host_syncs}, "bwd": {...}}
    by_direction: dict[str, dict[str, Any]] | None = None
    kernel_launches: int | None = None
    peak_memory_bytes: int | None = None
    # the topology the point ran on (runners.topology): hosts, ranks per host, "loopback" | "nvlink" | "nvlink+IB"...
    hosts: int | None = None
    ranks_per_host: int | None = None
    interconnect: str | None = None
    device_name: str | None = None
    git_sha: str | None = None


class ResultsPublic(BaseModel):
    """A page of results with the total count matching the filters."""

    data: list[ResultPublic]
    count: int


class WorkerPublic(BaseModel):
    """A runner process: devices, heartbeat, what it is doing; `alive` if its heartbeat is recent."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str  # worker-<id> without the token
    host: str | None = None  # null without the token
    pid: int | None = None  # null without the token
    devices: dict[str, Any]
    status: str
    state: str = Field(description="idle | busy | stopped | lost (heartbeat older than its lease)")
    current_point_id: int | None = None
    points_done: int
    started_at: datetime
    last_heartbeat: datetime
    alive: bool = Field(description="not stopped and not lost")


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int


class Health(BaseModel):
    """Liveness of the server and its store."""

    status: str  # "ok" | "degraded"
    db: str  # "ok" or "store unavailable" (the error itself goes to the server log only)
    version: str


class Message(BaseModel):
    detail: str
