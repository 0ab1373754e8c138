"""THE WORKER: claim a point -> run it in a rank gang -> store measurement, profile and trace -> complete; repeat.

    Worker(url, lease_s=60, heartbeat_s=10, devices=None).run(once=False, max_points=None)
    run_worker(url, once=..., ...)          # the same, in one call

A `Worker` holds its settings, the store URL, its gang pool, its stats and its stop state, and it is the only
writer of the store in its process tree: rank processes return results, the parent stores them.

Startup: refuse an unmigrated store (`db.migrate.require_migrated`), detect the devices (CUDA GPUs, else the
CPU with up to `CPBENCH_CPU_RANKS` gloo ranks) and the environment (GPU name/count, compute capability,
driver, CUDA, torch, Triton, Python, git sha, host), remove its own leftover spool and trace files
(`runners.housekeeping`), register the worker. Its identity is unique per process: `--name` (default the host)
plus the pid and a random suffix, so two processes given the same name never share leases.

Loop: claim the oldest queued point this worker can run (W <= its devices, its device kind; the claim also
returns expired leases to the queue), keep the lease and the worker's own heartbeat alive from a heartbeat
thread, (for a sweep with `tune: true` and the triton backend, first tune the point's kernels on the W=1 gang:
`runners.tuner.tune_missing` through `runners.execute.tune_job`, searching as the spec's `tuning` says, with the
store's tuned configs read here and passed in; the rank returns its trials and winners and this process stores
them (`db.crud.store_tuning`; a device crash stores the trials so far, restarts the gang and retries the
attempt); then time with the tuned configs), send the point to the persistent gang of its W (`runners.gang`, job
`runners.execute.run_point_job`) under a time limit derived from the spec's timing limits
(`point_time_limit_s`: the watchdog and the collective timeout; the point travels as a `runners.point.PointJob`,
rebuilt from the stored JSON, and every rank returns a `runners.results.PointResult`), turn the results into rows
before any session opens (`runners.results.store_rows`: the merged profile, its collectives checked against
kernels.cp's count, per direction for a training step, the differences in the report's `collective_mismatches`),
with the topology the point ran on (`Worker.topology`: one host of W ranks here, `runners.topology`), then store the
artifact (Chrome trace), measurement and profile and mark the point done, all in one transaction
(`complete_point` commits them together, or drops them if the lease was lost meanwhile). Failures become data: a failed correctness gate or an exception
raised on every rank fails the point (not retried: it is deterministic); a crashed, hung, timed-out or OOM rank
fails the attempt (retried while attempts remain) and restarts the gang. The worker keeps going either way.

Store outages: every store call goes through `db.retry.StoreRetry` (transient errors retried with capped,
jittered exponential backoff; the outage logged once and the recovery once). A finished measurement is first
written to the spool folder (`CPBENCH_SPOOL_DIR`, default `<artifact dir>/spool`) and stored when the store
answers again; storing is idempotent by point and worker (a commit whose answer was lost is recognised, not
repeated), and the spool file is removed once the outcome is known. The point's heartbeat keeps renewing the lease
until the result is stored (through the storing's backoff too), or until the store answers that the lease is lost
(then the retries stop and the result is dropped). While the store is away the lease cannot be renewed, so an
outage longer than the lease gives the point back to the queue: the stale result is then refused before anything
is written (one log line) and dropped, never stored twice. The transaction that stores a result re-takes its lease
first (`db.queue.retake_lease`: renewed, the point's row locked), so no other worker claims the point between that
check and the commit.

Multi-host: `runners.multihost.MultiHostWorker` is this worker on rank 0 of a gang torchrun started across hosts; it
replaces `_detect_devices` (every rank on every host), `_make_pool` (the torchrun gang, a `runners.gang.Gangs`) and
`topology` (the hosts of the point's ranks), and pings its ranks while idle; the rest is this path.

Idle: while the queue holds nothing it can claim, the worker renews its own heartbeat every `heartbeat_s` (a beat
that meets an outage is skipped), so `cpbench status` and `/api/v1/workers` show it `idle`, not `lost`.

Stopping: SIGTERM (or SIGINT, or `stop_event`) lets the current point finish for up to `CPBENCH_STOP_GRACE_S`,
then aborts it and releases it to the queue (no attempt used); the worker then closes its gangs and exits. A
second Ctrl-C stops at once (the point's lease then expires and the point returns to the queue).
`once=True` exits when nothing is left to claim; `until_sweep` exits when that sweep is finished (what
`cpbench run` uses, through `runners.engine.run_until_done`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from db.retry import StoreRetry, StoreUnavailable
from db.topology import Topology
from runners.activity import ACTIVITY_ENV, read_notice
from runners.errors import CpbenchError, GangError, SweepNotFoundError
from runners.execute import run_point_job, tune_job
from runners.gang import GangPool, Gangs, JobCancelled
from runners.grid import available_backends
from runners.housekeeping import remove_own_leftovers
from runners.peers.flash_qla import use_device_tilelang_cache
from runners.plugins import unavailable
from runners.point import PointJob, PointSpec
from runners.results import PointResult, StoreRows, store_rows, trace_path
from runners.settings import WorkerSettings, get_worker_settings
from runners.topology import single_host_topology
from runners.versions import driver_version, git_sha, peer_versions, software_versions

__all__ = ["DeviceInfo", "Worker", "WorkerStats", "detect_devices", "environment_facts", "point_time_limit_s", "run_worker"]

logger = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DeviceInfo:
    """What this worker runs on: kind ("cuda" | "cpu"), how many ranks it can host (on how many hosts), device names."""

    kind: str
    count: int
    names: tuple[str, ...] = ()
    compute_capability: str | None = None
    hosts: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "names": list(self.names), "compute_capability": self.compute_capability,
                "hosts": self.hosts}


@dataclass
class WorkerStats:
    """What a `run_worker` call did."""

    name: str = ""
    done: int = 0
    failed: int = 0
    released: int = 0
    lost: int = 0
    gang_restarts: int = 0
    stopped_by: str | None = None
    point_ids: list[int] = field(default_factory=list)
    spooled: int = 0  # results written to the spool before being stored
    store_outages: int = 0  # times the store became unavailable
    longest_outage_s: float = 0.0


def detect_devices(devices: int | None = None, *, kind: str | None = None) -> DeviceInfo:
    """CUDA GPUs when present (`devices` caps the count), else the CPU with `devices` or `CPBENCH_CPU_RANKS` ranks."""
    import torch

    if kind not in (None, "cpu", "cuda"):
        raise ValueError(f"kind must be 'cpu', 'cuda' or None, got kind={kind!r}")
    if kind != "cpu" and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        n = torch.cuda.device_count() if devices is None else min(devices, torch.cuda.device_count())
        names = tuple(torch.cuda.get_device_name(i) for i in range(n))
        major, minor = torch.cuda.get_device_capability(0)
        return DeviceInfo(kind="cuda", count=n, names=names, compute_capability=f"{major}.{minor}")
    if kind == "cuda":
        raise GangError("no CUDA device is visible to this worker", retryable=False)
    n = devices if devices is not None else get_worker_settings().CPU_RANKS
    return DeviceInfo(kind="cpu", count=max(1, int(n)), names=(platform.processor() or platform.machine(),))


def environment_facts(info: DeviceInfo) -> dict[str, Any]:
    """The `db.models.Environment` facts of this process (stable across runs of the same setup)."""
    import torch

    versions = software_versions()
    facts: dict[str, Any] = {
        "device_name": info.names[0] if info.kind == "cuda" else "cpu",
        "device_count": info.count,
        "compute_capability": info.compute_capability,
        "driver": driver_version() if info.kind == "cuda" else None,
        "cuda": torch.version.cuda if info.kind == "cuda" else None,
        "torch": versions["torch"],
        "triton": versions["triton"],
        "python": platform.python_version(),
        "cpbench": versions["cpbench"],
        "git_sha": git_sha(),
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        **peer_versions(),  # fla, flash_qla, tilelang, flash_kda (None when absent): in the environment's `extra`
    }
    if info.kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.update(l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)), sm_count=props.multi_processor_count,
                     memory_bytes=int(props.total_memory))
    return facts



MIN_HEARTBEAT_S = 0.1
MAX_LEASE_S = 86_400.0


def worker_identity(name: str | None = None) -> str:
    """A name unique to this process: `name` (default the host), the pid and a random suffix."""
    return f"{name or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def point_time_limit_s(spec: dict[str, Any], settings: WorkerSettings, first_call_s: float = 0.0) -> float:
    """Seconds a point's job may take: the spec's timing limits plus `CPBENCH_POINT_OVERHEAD_S` (inputs, the
    correctness gate, the profiled step, compilation) plus a peer's `first_call_s` (its own first-call autotune:
    FLA's takes minutes), capped by `CPBENCH_JOB_TIMEOUT_S`. Also the collective timeout of the gang while the
    point runs, so a hung peer is noticed after this, not after 300 s."""
    timing = spec.get("timing") or {}
    warmup = float(timing.get("warmup_s", 0.025))
    run = max(float(timing.get("timeout_s", 15.0)), float(timing.get("min_time_s", 0.5)))
    return min(settings.JOB_TIMEOUT_S, settings.POINT_OVERHEAD_S + 2.0 * (warmup + run) + max(0.0, first_call_s))


def _first_call_s(point: PointSpec) -> float:
    """The first-call allowance the point's peer backend states (0 for ours)."""
    from runners.plugins import peer_of_point

    try:
        peer = peer_of_point(point)
    except ValueError:
        return 0.0
    return float(getattr(peer, "first_call_s", 0.0)) if peer is not None else 0.0  # checked by runners.peers.check_peer


def _check_times(lease_s: float, heartbeat_s: float) -> None:
    if not (math.isfinite(lease_s) and 0 < lease_s <= MAX_LEASE_S):
        raise CpbenchError(f"the lease must be a number of seconds in (0, {MAX_LEASE_S:g}], got lease_s={lease_s}")
    if not (math.isfinite(heartbeat_s) and heartbeat_s >= MIN_HEARTBEAT_S):
        raise CpbenchError(f"the heartbeat must be at least {MIN_HEARTBEAT_S} s, got heartbeat_s={heartbeat_s}")
    if heartbeat_s >= lease_s:
        raise CpbenchError(f"the heartbeat must be shorter than the lease, got heartbeat_s={heartbeat_s}, lease_s={lease_s}")


class _Heartbeat(threading.Thread):
    """Renews the point's lease and the worker's heartbeat every `every_s`; sets `lost` when the lease is gone.

    A beat that meets a store outage is recorded by the shared `StoreRetry` (logged once) and tried again on the
    next beat; only the store's answer "not yours any more" marks the lease lost.
    """

    def __init__(self, worker: Worker, point_id: int) -> None:
        super().__init__(name=f"cpbench-heartbeat-{point_id}", daemon=True)
        self.worker, self.point_id = worker, point_id
        self.lost = False
        self._stop_ev = threading.Event()
        self._activity: dict[str, Any] | None = None  # the ranks' notice last put on the worker's row

    def _beat(self) -> bool:
        from db import crud
        from db.queue import heartbeat
        from db.session import session_scope

        with session_scope(self.worker.url) as s:
            ok = heartbeat(s, point_id=self.point_id, worker=self.worker.name, lease_s=self.worker.lease_s)
            if ok:
                crud.beat_worker(s, name=self.worker.name)
                activity = read_notice(self.worker.activity_file)
                if activity != self._activity:  # a first call being compiled (runners.activity), shown by `status`
                    crud.set_worker_activity(s, name=self.worker.name, activity=activity)
                    self._activity = activity
            elif crud.point_done_by(s, point_id=self.point_id, worker=self.worker.name):
                return True  # the result was just stored (the beat raced the commit): not a lost lease
        return ok

    def run(self) -> None:
        while not self._stop_ev.wait(self.worker.heartbeat_s):
            try:
                answered, ok = self.worker.retry.attempt("heartbeat", self._beat)
            except Exception:  # noqa: BLE001 - a non-transient error: retried on the next beat, the lease is longer
                logger.warning("heartbeat for point %s failed", self.point_id, exc_info=True)
                continue
            if answered and not ok:
                logger.warning("lease on point %s lost", self.point_id)
                self.lost = True
                return

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(timeout=30)
        if self._activity is not None:  # the point is over: so is its notice
            from db import crud

            try:
                self.worker._store("clear activity", lambda s: crud.set_worker_activity(s, name=self.worker.name,
                                                                                       activity=None),
                                   give_up=lambda: True)
            except Exception:  # noqa: BLE001 - a stale notice is replaced by the next beat's
                logger.warning("could not clear worker %s's activity", self.worker.name, exc_info=True)


def _options(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec.get(k) for k in ("timing", "check", "profile", "tune")}


def _file_facts(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return path.stat().st_size, h.hexdigest()


@dataclass
class _Claim:
    point_id: int
    sweep_id: int
    W: int
    attempt: int
    point: PointSpec


class Worker:
    """One worker process: settings, store URL, gang pool, stats and stop state (see the module docstring)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        lease_s: float | None = None,
        heartbeat_s: float | None = None,
        devices: int | None = None,
        device_kind: str | None = None,
        name: str | None = None,
        stop_event: threading.Event | None = None,
        artifact_dir: str | os.PathLike[str] | None = None,
        owner: str | None = None,
    ) -> None:
        from db.session import resolve_url
        from db.settings import get_db_settings

        self.settings = get_worker_settings()
        self.url = resolve_url(url)
        self.lease_s = float(lease_s if lease_s is not None else self.settings.LEASE_S)
        self.heartbeat_s = float(heartbeat_s if heartbeat_s is not None else self.settings.HEARTBEAT_S)
        _check_times(self.lease_s, self.heartbeat_s)
        self.devices, self.device_kind = devices, device_kind
        self.name = worker_identity(name)
        self.art_root = Path(artifact_dir if artifact_dir is not None else get_db_settings().ARTIFACT_DIR).resolve()
        self.spool_dir = Path(self.settings.SPOOL_DIR).resolve() if self.settings.SPOOL_DIR else self.art_root / "spool"
        self.stop_event = stop_event
        self.owner = owner  # work only the sweeps submitted with this token (`cpbench run` / `regress`); None: unowned ones
        self.stats = WorkerStats(name=self.name)
        self.retry = StoreRetry(who=f"worker {self.name}", max_delay_s=self.settings.STORE_RETRY_MAX_S)
        self._stop_at: float | None = None
        self._stop_why: str | None = None
        self._specs: dict[int, dict[str, Any]] = {}
        self._idle_beat_at = -math.inf  # monotonic time of the last idle heartbeat
        self.pool: Gangs | None = None
        self.activity_file = self.spool_dir / f"activity-{_tag(self.name)}.json"  # runners.activity's notice
        self.info: DeviceInfo | None = None
        self.env_id: int | None = None

    # -- stop state ------------------------------------------------------------------------------------------------
    def request_stop(self, why: str) -> None:
        if self._stop_at is None:
            self._stop_at, self._stop_why = time.monotonic(), why
            logger.info("worker %s: %s received; finishing or releasing the current point", self.name, why)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and self._stop_at is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now (the gangs are still closed on the way out)
        self.request_stop(signal.Signals(signum).name)

    def stopping(self) -> bool:
        if self.stop_event is not None and self.stop_event.is_set():
            self.request_stop("stop_event")
        return self._stop_at is not None

    def _past_grace(self) -> bool:
        return self.stopping() and time.monotonic() - (self._stop_at or 0.0) >= self.settings.STOP_GRACE_S

    def topology(self, world_size: int) -> Topology:
        """The topology a point of `world_size` ranks runs on: a gang on this host."""
        assert self.info is not None
        return single_host_topology(world_size, self.info.kind)

    # -- the store, through the retry loop -------------------------------------------------------------------------
    def _store(self, what: str, fn: Callable[[Any], Any], *, give_up: Callable[[], bool] | None = None) -> Any:
        """`fn(session)` in one committed session, retried through store outages."""
        from db.session import session_scope

        def once() -> Any:
            with session_scope(self.url) as s:
                return fn(s)

        return self.retry.call(what, once, give_up=give_up)

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def _start(self, until_sweep: int | None) -> None:
        from db import crud
        from db.migrate import require_migrated

        require_migrated(self.url)
        self.info = info = self._detect_devices()
        facts = environment_facts(info)
        remove_own_leftovers(self.url, self.art_root, self.spool_dir)

        def register(s: Any) -> int | None:
            # writes first: on SQLite a read transaction that another process overtakes cannot become a write one
            env_id = crud.get_or_create_environment(s, facts=facts).id
            crud.register_worker(s, name=self.name, host=socket.gethostname(), pid=os.getpid(), devices=info.as_dict(),
                                 environment_id=env_id, lease_s=self.lease_s)
            if until_sweep is not None and crud.get_sweep(s, sweep_id=until_sweep) is None:
                raise SweepNotFoundError(f"no sweep with id {until_sweep}")  # (rolls the registration back)
            return env_id

        self.env_id = self._store("register", register, give_up=self.stopping)
        # the gangs inherit both: one TileLang cache per device model (FlashQLA's JIT paid once per sweep) and the
        # file through which a rank announces a long first call (runners.activity)
        if info.kind == "cuda":
            use_device_tilelang_cache(self.art_root, info.names[0], info.compute_capability)
        os.environ[ACTIVITY_ENV] = str(self.activity_file)
        self.pool = self._make_pool(info)
        logger.info("worker %s: %d %s rank(s), environment %s", self.name, info.count, info.kind, self.env_id)

    def _detect_devices(self) -> DeviceInfo:
        return detect_devices(self.devices, kind=self.device_kind)

    def _make_pool(self, info: DeviceInfo) -> Gangs:
        """The gangs the points run on: spawned on this host, one per W."""
        s = self.settings
        return GangPool(info.kind, max_alive=s.MAX_GANGS, start_timeout_s=s.GANG_START_TIMEOUT_S, pg_timeout_s=s.PG_TIMEOUT_S)

    def run(
        self,
        *,
        once: bool = False,
        max_points: int | None = None,
        until_sweep: int | None = None,
        on_progress: Callable[[dict[str, int]], None] | None = None,
        on_point: Callable[[int, str], None] | None = None,
    ) -> WorkerStats:
        """Work the queue until told to stop; see `run_worker` for the arguments. Returns what was done."""
        from db import crud
        from db.queue import refresh_sweep_status

        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        stats = self.stats
        try:
            self._start(until_sweep)

            def progress(sweep_id: int) -> None:
                if on_progress is not None and until_sweep is not None and sweep_id == until_sweep:
                    on_progress(self._store("progress", lambda s: crud.sweep_progress(s, sweep_id=sweep_id)))

            if until_sweep is not None:
                progress(until_sweep)
            while not self.stopping():
                if max_points is not None and len(stats.point_ids) >= max_points:
                    break
                if until_sweep is not None and self._sweep_finished(until_sweep):
                    break
                claim = self._claim()
                if claim is None:
                    if once:
                        break
                    self._beat_idle()
                    _sleep(min(self.settings.POLL_S, self.heartbeat_s), self.stopping)
                    continue
                status = self._run_point(claim)
                stats.point_ids.append(claim.point_id)
                self._store("refresh", functools.partial(refresh_sweep_status, sweep_id=claim.sweep_id))
                self._store("touch", functools.partial(crud.touch_worker, name=self.name, status="idle",
                                                       points_done_inc=1 if status == "done" else 0))
                if on_point is not None:
                    on_point(claim.point_id, status)
                progress(claim.sweep_id)
        except StoreUnavailable:
            logger.warning("worker %s: stopping while the store is unavailable", self.name)
        finally:
            if self.pool is not None:
                stats.gang_restarts = self.pool.restarts
                self.pool.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.env_id is not None or self.pool is not None:
                try:
                    with_retry = self.retry.attempt("stop", lambda: self._touch_stopped())
                    if not with_retry[0]:
                        logger.warning("could not mark worker %s stopped: the store is unavailable", self.name)
                except Exception:  # noqa: BLE001 - the store may be gone at shutdown; nothing to do about it
                    logger.warning("could not mark worker %s stopped", self.name, exc_info=True)
        stats.stopped_by = self._stop_why
        stats.store_outages, stats.longest_outage_s = self.retry.outages, self.retry.longest_outage_s
        logger.info("worker %s exits: %d done, %d failed, %d released", self.name, stats.done, stats.failed, stats.released)
        return stats

    def _beat_idle(self) -> None:
        """Renew this worker's heartbeat while it waits for work, once per `heartbeat_s` (skipped in an outage)."""
        from db import crud
        from db.session import session_scope

        now = time.monotonic()
        if now - self._idle_beat_at < self.heartbeat_s:
            return

        def beat() -> None:
            with session_scope(self.url) as s:
                crud.beat_worker(s, name=self.name)

        try:
            if self.retry.attempt("idle heartbeat", beat)[0]:
                self._idle_beat_at = now
        except Exception:  # noqa: BLE001 - a non-transient error: tried again on the next poll
            logger.warning("worker %s: idle heartbeat failed", self.name, exc_info=True)

    def _touch_stopped(self) -> None:
        from db import crud
        from db.session import session_scope

        with session_scope(self.url) as s:
            crud.touch_worker(s, name=self.name, status="stopped")

    def _sweep_finished(self, sweep_id: int) -> bool:
        from db import crud

        def read(s: Any) -> bool:
            sweep = crud.get_sweep(s, sweep_id=sweep_id)
            return sweep is None or sweep.status in ("done", "cancelled")

        return self._store("sweep status", read, give_up=self.stopping)

    def _claim(self) -> _Claim | None:
        from db import crud
        from db.queue import claim_point

        info = self.info
        assert info is not None

        def claim(s: Any) -> _Claim | None:
            point = claim_point(s, worker=self.name, lease_s=self.lease_s, max_W=info.count, device_kind=info.kind,
                                owner=self.owner)
            if point is None:
                return None
            c = _Claim(point.id, point.sweep_id, point.W, point.attempts, PointSpec.from_json(point.params))
            # the write before the read (claim_point committed): see the registration
            crud.touch_worker(s, name=self.name, status="busy", current_point_id=c.point_id)
            if c.sweep_id not in self._specs:
                sweep = crud.get_sweep(s, sweep_id=c.sweep_id)
                assert sweep is not None, f"point {c.point_id} of a missing sweep {c.sweep_id}"  # a foreign key
                self._specs[c.sweep_id] = dict(sweep.spec)
            return c

        # a claim whose commit was lost in an outage holds a lease nobody renews: it expires and the point returns
        return self._store("claim", claim, give_up=self.stopping)

    # -- one point -------------------------------------------------------------------------------------------------
    def _end_attempt(self, claim: _Claim, error: str, retryable: bool) -> str:
        from db.queue import fail_point

        self._store("fail", lambda s: fail_point(s, point_id=claim.point_id, worker=self.name, error=error, retryable=retryable),
                    give_up=self._past_grace)
        self.stats.failed += 1
        return "failed" if not retryable else "retry"

    def _run_point(self, claim: _Claim) -> str:
        """Run one claimed point to an outcome; returns the point's new status ("done", "failed", "queued"...)."""
        from db.queue import release_point

        assert self.pool is not None and self.info is not None
        stats, point, spec = self.stats, claim.point, self._specs[claim.sweep_id]
        missing = unavailable(point, available_backends(), where=f"on worker {self.name}")
        if missing:
            return self._end_attempt(claim, missing, False)
        options = _options(spec)
        # one file per worker and point: a rank orphaned by a killed worker can't overwrite the finishing worker's trace
        tag = _tag(self.name)
        trace = (self.art_root / f"sweep{claim.sweep_id}" / f"point{claim.point_id}-{tag}.trace.json.gz"
                 if options.get("profile", True) else None)
        payload = PointJob(point=point, options=options, trace_path=str(trace) if trace else None)
        limit_s = point_time_limit_s(spec, self.settings, _first_call_s(point))
        hb = _Heartbeat(self, claim.point_id)
        hb.start()

        def cancel() -> bool:
            return hb.lost or self._past_grace()

        t0 = time.monotonic()
        try:
            if options.get("tune") and point.backend == "triton":
                # tuning runs once, on one device (the W=1 gang), before the point's own gang times it
                from db.crud import store_tuning
                from runners.tuner.sweep import tuning_state

                # the rank reads nothing from the store and writes nothing: this process reads, then stores its outcome
                state = self._store("read tuning state", tuning_state)
                tune_payload = {"state": state, "point": point, "tuning": spec.get("tuning") or {}}
                outcome = self.pool.run(1, tune_job, tune_payload, timeout_s=self.settings.JOB_TIMEOUT_S, cancel=cancel)[0]
                self._store("store tuning", lambda s: store_tuning(s, result=outcome.result, sweep_id=claim.sweep_id,
                                                                   environment_id=self.env_id))
                if outcome.error is not None:
                    # a device crash poisons the rank's process: restart the gang, retry (its crasher is now known)
                    self.pool.get(1).close()
                    hb.stop()
                    return self._end_attempt(claim, outcome.error, True)
                payload = replace(payload, autotune=outcome.payload)
            results = self.pool.run(claim.W, run_point_job, payload, timeout_s=limit_s, cancel=cancel,
                                    collective_timeout_s=limit_s)
        except JobCancelled:
            hb.stop()
            if hb.lost:
                stats.lost += 1
                return "lost"
            self._store("release", lambda s: release_point(s, point_id=claim.point_id, worker=self.name), give_up=lambda: True)
            stats.released += 1
            logger.info("point %s released (worker stopping)", claim.point_id)
            return "queued"
        except GangError as err:
            hb.stop()
            if err.restarted:
                logger.warning("point %s: gang W=%d restarted: %s", claim.point_id, claim.W, str(err).splitlines()[0])
            return self._end_attempt(claim, str(err), err.retryable)
        except StoreUnavailable:
            hb.stop()
            raise
        except Exception as err:  # noqa: BLE001 - a bug of the parent side still fails only this point
            hb.stop()
            logger.exception("point %s: worker error", claim.point_id)
            return self._end_attempt(claim, f"worker error: {type(err).__name__}: {err}", False)
        if hb.lost:
            hb.stop()
            stats.lost += 1
            return "lost"
        r0 = results[0]
        if not r0.ok:
            hb.stop()
            return self._end_attempt(claim, r0.error or "point failed", False)
        try:  # the heartbeat keeps the lease while the result waits for the store (an outage, its backoff)
            stored = self._store_results(claim, results, lease_lost=lambda: hb.lost)
        finally:
            hb.stop()
        if stored:
            stats.done += 1
            logger.info("point %s done in %.2f s", claim.point_id, time.monotonic() - t0)
            return "done"
        stats.lost += 1
        return "lost"

    def _store_results(self, claim: _Claim, results: list[PointResult], *,
                       lease_lost: Callable[[], bool] = lambda: False) -> bool:
        """Spool the results, turn them into rows (`runners.results.store_rows`, before any session), store them
        through outages (idempotent), drop the spool file; False if the lease was lost (`lease_lost()`: the point's
        heartbeat, still renewing the lease meanwhile, learnt it was, so the retries stop)."""
        spool = self.spool_dir / f"point{claim.point_id}-a{claim.attempt}-{_tag(self.name)}.json"
        spool.parent.mkdir(parents=True, exist_ok=True)
        tmp = spool.with_suffix(".tmp")
        tmp.write_text(json.dumps({"point_id": claim.point_id, "attempt": claim.attempt, "worker": self.name,
                                   "environment_id": self.env_id, "results": [r.to_json() for r in results]}, default=str))
        tmp.replace(spool)
        self.stats.spooled += 1
        try:
            rows = store_rows(claim.point, results, self.topology(claim.W))
            if rows.mismatches:
                logger.warning("point %s: collectives differ from kernels.cp's count: %s", claim.point_id,
                               "; ".join(rows.mismatches))
            artifact = _trace_artifact(rows.trace)
            stored = self._store("store results", lambda s: _write_results(
                s, point_id=claim.point_id, worker=self.name, environment_id=self.env_id, rows=rows, artifact=artifact,
                lease_s=self.lease_s),
                give_up=lambda: lease_lost() or (self.stopping() and self._past_grace()))
        except StoreUnavailable:
            if lease_lost():  # the store answered the heartbeat: the point is someone else's now
                logger.warning("point %s: lease lost while its result waited for the store; result dropped", claim.point_id)
                spool.unlink(missing_ok=True)
                _drop_trace(results)
                return False
            logger.warning("point %s: results left in %s (the store stayed unavailable while stopping)", claim.point_id, spool)
            raise
        except Exception as err:  # noqa: BLE001 - a non-transient store error fails this attempt (retried), not the worker
            logger.exception("point %s: storing its results failed", claim.point_id)
            spool.unlink(missing_ok=True)
            _drop_trace(results)
            self._end_attempt(claim, f"storing the results failed: {type(err).__name__}: {err}", True)
            return False
        spool.unlink(missing_ok=True)
        if not stored:
            _drop_trace(results)
        return stored


def _tag(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.rsplit(":", 1)[-1])


def _drop_trace(results: list[PointResult]) -> None:
    trace = trace_path(results)
    if trace is not None:
        Path(trace).unlink(missing_ok=True)


def _trace_artifact(trace: str | None) -> dict[str, Any] | None:
    """The `db.crud.store_artifact` fields of rank 0's trace file (None: no file)."""
    if trace is None or not Path(trace).exists():
        return None
    size, sha = _file_facts(Path(trace))
    return {"kind": "chrome_trace", "path": trace, "size_bytes": size, "sha256": sha}


def _already_stored(session: Any, point_id: int, worker: str) -> bool:
    """This worker's result of the point is in the store (a commit whose answer was lost in an outage)."""
    from db import crud

    return crud.point_done_by(session, point_id=point_id, worker=worker)


def _retake_lease(session: Any, point_id: int, worker: str, lease_s: float) -> bool:
    """`worker` still holds the point's lease, now renewed and its row locked until the commit (`db.queue.retake_lease`)."""
    from db.queue import retake_lease

    return retake_lease(session, point_id=point_id, worker=worker, lease_s=lease_s)


def _write_results(
    session: Any,
    *,
    point_id: int,
    worker: str,
    environment_id: int | None,
    rows: StoreRows,
    artifact: dict[str, Any] | None,
    lease_s: float,
) -> bool:
    """Artifact + measurement + profile + `done`, committed together; False (nothing kept) if the lease was lost.
    True without writing when this worker's result is already stored (idempotent). The lease is re-taken (renewed
    for `lease_s`, the point's row locked) in this transaction before anything is written."""
    from db import crud
    from db.queue import complete_point
    from db.session import begin_write

    begin_write(session)  # the write lock first (SQLite): the check and the writes see one state
    if _already_stored(session, point_id, worker):
        return True
    if not _retake_lease(session, point_id, worker, lease_s):  # a late result: one line, nothing written
        logger.warning("worker %s cannot complete point %s: lease lost; its result is dropped", worker, point_id)
        session.rollback()
        return False
    artifact_id = crud.store_artifact(session, point_id=point_id, **artifact).id if artifact is not None else None
    crud.store_measurement(session, point_id=point_id, environment_id=environment_id, worker=worker, **rows.measurement)
    if rows.profile is not None:
        crud.store_profile(session, point_id=point_id, artifact_id=artifact_id, **rows.profile)
    return complete_point(session, point_id=point_id, worker=worker)


def run_worker(
    url: str | None = None,
    *,
    once: bool = False,
    max_points: int | None = None,
    lease_s: float | None = None,
    heartbeat_s: float | None = None,
    devices: int | None = None,
    device_kind: str | None = None,
    name: str | None = None,
    until_sweep: int | None = None,
    on_progress: Callable[[dict[str, int]], None] | None = None,
    on_point: Callable[[int, str], None] | None = None,
    stop_event: threading.Event | None = None,
    artifact_dir: str | os.PathLike[str] | None = None,
    owner: str | None = None,
) -> WorkerStats:
    """Build a `Worker` and run it (see the module docstring). Returns what was done.

    url: the store (default `CPBENCH_DATABASE_URL`). once: exit when nothing is claimable. max_points: exit
    after this many points. lease_s / heartbeat_s: default `CPBENCH_LEASE_S` / `CPBENCH_HEARTBEAT_S`.
    devices: cap on ranks (GPUs, or CPU ranks). device_kind: force "cpu" or "cuda". name: the identity's prefix
    (a pid and a random suffix are added). until_sweep: exit when that sweep is finished. on_progress(progress):
    after each point of `until_sweep`. on_point(point_id, status): after each point. stop_event: set it to stop
    like SIGTERM (from another thread). owner: work only the sweeps submitted with this owner token
    (`cpbench run`, `cpbench regress`); None: only sweeps without an owner.
    """
    worker = Worker(url, lease_s=lease_s, heartbeat_s=heartbeat_s, devices=devices, device_kind=device_kind, name=name,
                    stop_event=stop_event, artifact_dir=artifact_dir, owner=owner)
    return worker.run(once=once, max_points=max_points, until_sweep=until_sweep, on_progress=on_progress, on_point=on_point)


def _sleep(seconds: float, stopping: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stopping():
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
