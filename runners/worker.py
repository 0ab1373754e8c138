"""THE WORKER: claim a point -> run it in a rank gang -> store measurement, profile and trace -> complete; repeat.

    run_worker(url, once=False, max_points=None, lease_s=60, heartbeat_s=10, devices=None)

Startup: refuse an unmigrated store (`db.migrate.require_migrated`), detect the devices (CUDA GPUs, else the
CPU with up to `CPBENCH_CPU_RANKS` gloo ranks) and the environment (GPU name/count, compute capability,
driver, CUDA, torch, Triton, Python, git sha, host), register the worker.

Loop: claim the oldest queued point this worker can run (W <= its devices, its device kind; the claim also
returns expired leases to the queue), keep the lease alive from a heartbeat thread, (for a sweep with
`tune: true` and the triton backend, first tune the point's kernels on the W=1 gang: `runners.tuner.ensure_tuned`
through `runners.execute.tune_job`, searching as the spec's `tuning` says, and time with the tuned configs),
send the point to the persistent gang of its W (`runners.gang`, job `runners.execute.run_point_job`), then
store the artifact (Chrome trace), measurement and profile and mark the point done, all in one transaction
(`complete_point` commits them together, or drops them if the lease was lost meanwhile). Failures become data:
a failed correctness gate or an exception raised on every rank fails the point (not retried: it is
deterministic); a crashed, hung or OOM rank fails the attempt (retried while attempts remain) and restarts the
gang. The worker keeps going either way.

Stopping: SIGTERM (or SIGINT, or `stop_event`) lets the current point finish for up to `CPBENCH_STOP_GRACE_S`,
then aborts it and releases it to the queue (no attempt used); the worker then closes its gangs and exits. A
second Ctrl-C stops at once (the point's lease then expires and the point returns to the queue).
`once=True` exits when nothing is left to claim; `until_sweep` exits when that sweep is finished (what
`cpbench run` uses, through `runners.engine.run_until_done`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.provenance import driver_version, git_sha
from runners.errors import CpbenchError, GangError, SweepNotFoundError
from runners.execute import run_point_job, tune_job
from runners.gang import GangPool, JobCancelled
from runners.grid import available_backends
from runners.profile import ProfileSummary, merge_ranks
from runners.settings import get_worker_settings
from runners.stats import summarize
from runners.versions import software_versions

__all__ = ["DeviceInfo", "WorkerStats", "detect_devices", "environment_facts", "run_worker"]

logger = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DeviceInfo:
    """What this worker runs on: kind ("cuda" | "cpu"), how many ranks it can host, device names."""

    kind: str
    count: int
    names: tuple[str, ...] = ()
    compute_capability: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "names": list(self.names), "compute_capability": self.compute_capability}


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
    }
    if info.kind == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts.update(l2_cache_bytes=int(getattr(props, "L2_cache_size", 0)), sm_count=props.multi_processor_count,
                     memory_bytes=int(props.total_memory))
    return facts


class _Heartbeat(threading.Thread):
    """Renews the lease of the running point every `every_s`; sets `lost` when the lease is gone."""

    def __init__(self, url: str, *, point_id: int, worker: str, lease_s: float, every_s: float) -> None:
        super().__init__(name=f"cpbench-heartbeat-{point_id}", daemon=True)
        self.url, self.point_id, self.worker, self.lease_s, self.every_s = url, point_id, worker, lease_s, every_s
        self.lost = False
        self._stop_ev = threading.Event()

    def run(self) -> None:
        from db.queue import heartbeat
        from db.session import session_scope

        while not self._stop_ev.wait(self.every_s):
            try:
                with session_scope(self.url) as s:
                    ok = heartbeat(s, point_id=self.point_id, worker=self.worker, lease_s=self.lease_s)
            except Exception:  # noqa: BLE001 - a missed beat is retried; the lease is longer than a beat
                logger.warning("heartbeat for point %s failed", self.point_id, exc_info=True)
                continue
            if not ok:
                logger.warning("lease on point %s lost", self.point_id)
                self.lost = True
                return

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(timeout=30)


def _options(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec.get(k) for k in ("timing", "check", "profile", "tune")}


def _merge_expected(results: list[dict[str, Any]]) -> dict[str, int]:
    """kernels.cp's expected collectives of the gang, merged like the profile (send/recv summed, others max)."""
    out: dict[str, int] = {}
    for r in results:
        for k, n in (r.get("expected_collectives") or {}).items():
            out[k] = out.get(k, 0) + n if k in ("send", "recv") else max(out.get(k, 0), n)
    return dict(sorted(out.items()))


def _file_facts(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return path.stat().st_size, h.hexdigest()


def _store_results(
    url: str,
    *,
    point_id: int,
    worker: str,
    environment_id: int | None,
    results: list[dict[str, Any]],
) -> bool:
    """Artifact + measurement + profile + `done`, committed together; False (nothing kept) if the lease was lost."""
    from db import crud
    from db.queue import complete_point
    from db.session import session_scope

    r0 = results[0]
    timing, gate = r0["timing"], r0["gate"]
    profiles = [ProfileSummary(**r["profile"]) for r in results if r.get("profile")]
    prof = merge_ranks(profiles) if profiles else None
    summary = summarize(timing["samples_ms"])
    skews = [hi - lo for hi, lo in zip(timing["samples_ms"], timing["rank_min_ms"], strict=False)]
    report = {
        **r0.get("report", {}),
        "gate": {k: gate[k] for k in ("tol_none", "tol_reference")},
        "timing": {
            "warmup_iters": timing["warmup_iters"],
            "warmup_s": round(timing["warmup_s"], 6),
            "l2_flush_bytes": timing["l2_flush_bytes"],
            "rank_skew_median_ms": summarize(skews).median if skews else 0.0,
            # CUDA: host time to enqueue one step; near the sample itself means the step is launch-bound
            "host_enqueue_median_ms": summarize(timing["host_ms"]).median if timing.get("host_ms") else None,
        },
    }
    report["expected_collectives"] = _merge_expected(results)
    if prof is not None:
        report["profile_ranks"] = prof.per_rank
    trace = Path(prof.trace_path) if prof is not None and prof.trace_path else None
    with session_scope(url) as s:
        artifact_id = None
        if trace is not None and trace.exists():
            size, sha = _file_facts(trace)
            artifact_id = crud.store_artifact(s, point_id=point_id, kind="chrome_trace", path=str(trace), size_bytes=size, sha256=sha).id
        crud.store_measurement(
            s, point_id=point_id, environment_id=environment_id, worker=worker, clock=timing["clock"],
            samples=timing["samples_ms"], summary={f"{k}_ms" if k != "n" else k: v for k, v in summary.as_dict().items()},
            stop_reason=timing["stop_reason"], err_vs_none=gate["err_vs_none"], err_vs_reference=gate["err_vs_reference"],
            configs=r0.get("configs", {}), report=report,
        )
        if prof is not None:
            crud.store_profile(
                s, point_id=point_id, collectives=prof.collectives, collective_bytes=prof.collective_bytes,
                host_syncs=prof.host_syncs, sync_events=prof.sync_events, kernel_launches=prof.kernel_launches,
                peak_memory_bytes=prof.peak_memory_bytes, artifact_id=artifact_id,
            )
        ok = complete_point(s, point_id=point_id, worker=worker)
    if not ok and trace is not None:
        trace.unlink(missing_ok=True)
    return ok


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
    """Work the queue until told to stop (see the module docstring). Returns what was done.

    url: the store (default `CPBENCH_DATABASE_URL`). once: exit when nothing is claimable. max_points: exit
    after this many points. lease_s / heartbeat_s: default `CPBENCH_LEASE_S` / `CPBENCH_HEARTBEAT_S`.
    devices: cap on ranks (GPUs, or CPU ranks). device_kind: force "cpu" or "cuda". until_sweep: exit when
    that sweep is finished. on_progress(progress): after each point of `until_sweep`. on_point(point_id,
    status): after each point. stop_event: set it to stop like SIGTERM (from another thread). owner: work only the
    sweeps submitted with this owner token (`cpbench run`, `cpbench regress`); None: only sweeps without an owner.
    """
    from db import crud
    from db.migrate import require_migrated
    from db.queue import claim_point, fail_point, refresh_sweep_status, release_point
    from db.session import resolve_url, session_scope
    from db.settings import get_db_settings

    settings = get_worker_settings()
    url = resolve_url(url)
    lease_s = float(lease_s if lease_s is not None else settings.LEASE_S)
    heartbeat_s = float(heartbeat_s if heartbeat_s is not None else settings.HEARTBEAT_S)
    if heartbeat_s >= lease_s:
        raise CpbenchError(f"the heartbeat must be shorter than the lease, got heartbeat_s={heartbeat_s}, lease_s={lease_s}")
    require_migrated(url)
    info = detect_devices(devices, kind=device_kind)
    facts = environment_facts(info)
    host = socket.gethostname()
    name = name or f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    art_root = Path(artifact_dir if artifact_dir is not None else get_db_settings().ARTIFACT_DIR).resolve()
    have_backends = available_backends()
    with session_scope(url) as s:
        # writes first: on SQLite a read transaction that another process overtakes cannot become a write one
        env_id = crud.get_or_create_environment(s, facts=facts).id
        crud.register_worker(s, name=name, host=host, pid=os.getpid(), devices=info.as_dict(), environment_id=env_id)
        if until_sweep is not None and crud.get_sweep(s, sweep_id=until_sweep) is None:
            raise SweepNotFoundError(f"no sweep with id {until_sweep}")  # (rolls the registration back)
    logger.info("worker %s: %d %s rank(s), environment %s", name, info.count, info.kind, env_id)

    stats = WorkerStats(name=name)
    stop = {"at": None, "why": None}

    def request_stop(why: str) -> None:
        if stop["at"] is None:
            stop["at"], stop["why"] = time.monotonic(), why
            logger.info("worker %s: %s received; finishing or releasing the current point", name, why)

    def on_signal(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and stop["at"] is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now (the gangs are still closed on the way out)
        request_stop(signal.Signals(signum).name)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)

    def stopping() -> bool:
        if stop_event is not None and stop_event.is_set():
            request_stop("stop_event")
        return stop["at"] is not None

    pool = GangPool(
        info.kind, max_alive=settings.MAX_GANGS, start_timeout_s=settings.GANG_START_TIMEOUT_S, pg_timeout_s=settings.PG_TIMEOUT_S
    )
    specs: dict[int, dict[str, Any]] = {}

    def progress(sweep_id: int) -> None:
        if on_progress is not None and until_sweep is not None and sweep_id == until_sweep:
            with session_scope(url) as s:
                on_progress(crud.sweep_progress(s, sweep_id=sweep_id))

    try:
        if until_sweep is not None:
            progress(until_sweep)
        while not stopping():
            if max_points is not None and len(stats.point_ids) >= max_points:
                break
            if until_sweep is not None:
                with session_scope(url) as s:
                    sweep = crud.get_sweep(s, sweep_id=until_sweep)
                    if sweep is None or sweep.status in ("done", "cancelled"):
                        break
            with session_scope(url) as s:
                point = claim_point(s, worker=name, lease_s=lease_s, max_W=info.count, device_kind=info.kind, owner=owner)
                if point is not None:
                    pid, sweep_id, W, params = point.id, point.sweep_id, point.W, dict(point.params)
                    # the write before the read (claim_point committed): see the registration above
                    crud.touch_worker(s, name=name, status="busy", current_point_id=pid)
                    if sweep_id not in specs:
                        specs[sweep_id] = dict(crud.get_sweep(s, sweep_id=sweep_id).spec)
            if point is None:
                if once:
                    break
                _sleep(settings.POLL_S, stopping)
                continue

            status = _run_one(
                url, pool, name=name, point_id=pid, sweep_id=sweep_id, W=W, params=params, spec=specs[sweep_id],
                env_id=env_id, lease_s=lease_s, heartbeat_s=heartbeat_s, art_root=art_root, have_backends=have_backends,
                stopping=stopping, grace_s=settings.STOP_GRACE_S, stop=stop, job_timeout_s=settings.JOB_TIMEOUT_S,
                fail_point=fail_point, release_point=release_point, stats=stats,
            )
            stats.point_ids.append(pid)
            with session_scope(url) as s:
                refresh_sweep_status(s, sweep_id=sweep_id)
            with session_scope(url) as s:
                crud.touch_worker(s, name=name, status="idle", points_done_inc=1 if status == "done" else 0)
            if on_point is not None:
                on_point(pid, status)
            progress(sweep_id)
    finally:
        stats.gang_restarts = sum(max(0, g.starts - 1) for g in pool._gangs.values())
        pool.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            with session_scope(url) as s:
                crud.touch_worker(s, name=name, status="stopped")
        except Exception:  # noqa: BLE001 - the store may be gone at shutdown; nothing to do about it
            logger.warning("could not mark worker %s stopped", name, exc_info=True)
    stats.stopped_by = stop["why"]
    logger.info("worker %s exits: %d done, %d failed, %d released", name, stats.done, stats.failed, stats.released)
    return stats


def _sleep(seconds: float, stopping: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stopping():
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def _run_one(
    url: str,
    pool: GangPool,
    *,
    name: str,
    point_id: int,
    sweep_id: int,
    W: int,
    params: dict[str, Any],
    spec: dict[str, Any],
    env_id: int | None,
    lease_s: float,
    heartbeat_s: float,
    art_root: Path,
    have_backends: tuple[str, ...],
    stopping: Callable[[], bool],
    grace_s: float,
    stop: dict[str, Any],
    job_timeout_s: float,
    fail_point: Callable[..., bool],
    release_point: Callable[..., bool],
    stats: WorkerStats,
) -> str:
    """Run one claimed point to an outcome; returns the point's new status ("done", "failed", "queued"...)."""
    from db.session import session_scope

    def fail(error: str, retryable: bool) -> str:
        with session_scope(url) as s:
            fail_point(s, point_id=point_id, worker=name, error=error, retryable=retryable)
        stats.failed += 1
        return "failed" if not retryable else "retry"

    if params.get("backend") not in have_backends:
        return fail(f"backend {params.get('backend')!r} is not available on worker {name} (has {', '.join(have_backends)})", False)
    options = _options(spec)
    # one file per worker and point: a rank orphaned by a killed worker can't overwrite the finishing worker's trace
    tag = "".join(c if c.isalnum() else "-" for c in name.rsplit(":", 1)[-1])
    trace = art_root / f"sweep{sweep_id}" / f"point{point_id}-{tag}.trace.json.gz" if options.get("profile", True) else None
    payload: dict[str, Any] = {"params": params, "options": options, "trace_path": str(trace) if trace else None}
    hb = _Heartbeat(url, point_id=point_id, worker=name, lease_s=lease_s, every_s=heartbeat_s)
    hb.start()

    def cancel() -> bool:
        return hb.lost or (stopping() and time.monotonic() - stop["at"] >= grace_s)

    t0 = time.monotonic()
    try:
        if options.get("tune") and params.get("backend") == "triton":
            # tuning runs once, on one device (the W=1 gang), before the point's own gang times it
            tune_payload = {"url": url, "params": params, "sweep_id": sweep_id, "environment_id": env_id,
                            "tuning": spec.get("tuning") or {}}
            payload["autotune"] = pool.run(1, tune_job, tune_payload, timeout_s=job_timeout_s, cancel=cancel)[0]
        results = pool.run(W, run_point_job, payload, timeout_s=job_timeout_s, cancel=cancel)
    except JobCancelled:
        hb.stop()
        if hb.lost:
            stats.lost += 1
            return "lost"
        with session_scope(url) as s:
            release_point(s, point_id=point_id, worker=name)
        stats.released += 1
        logger.info("point %s released (worker stopping)", point_id)
        return "queued"
    except GangError as err:
        hb.stop()
        if err.restarted:
            logger.warning("point %s: gang W=%d restarted: %s", point_id, W, str(err).splitlines()[0])
        return fail(str(err), err.retryable)
    except Exception as err:  # noqa: BLE001 - a bug of the parent side still fails only this point
        hb.stop()
        logger.exception("point %s: worker error", point_id)
        return fail(f"worker error: {type(err).__name__}: {err}", False)
    hb.stop()
    if hb.lost:
        stats.lost += 1
        return "lost"
    r0 = results[0]
    if not r0.get("ok"):
        return fail(r0.get("error") or "point failed", False)
    try:
        stored = _store_results(url, point_id=point_id, worker=name, environment_id=env_id, results=results)
    except Exception as err:  # noqa: BLE001 - a store hiccup fails this attempt (retried), not the worker
        logger.exception("point %s: storing its results failed", point_id)
        return fail(f"storing the results failed: {type(err).__name__}: {err}", True)
    if stored:
        stats.done += 1
        logger.info("point %s done in %.2f s", point_id, time.monotonic() - t0)
        return "done"
    stats.lost += 1
    return "lost"
