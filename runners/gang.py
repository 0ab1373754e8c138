"""PERSISTENT RANK GANGS: W processes spawned once per CP size, process group initialised once, reused for every
point of that size; a crash, a hang or disagreeing ranks tear the gang down and the next job starts a new one.

A `Gang` spawns W ranks (`spawn` start method: no inherited threads or CUDA state) that rendezvous through a
`file://` store in a fresh temp dir and run `init_process_group` once: gloo on the CPU, NCCL on CUDA with rank r
on `cuda:r`. Each rank then loops: take a job from its queue, call `fn(ctx, payload)` with a `RankContext`
(rank, world size, device, process group, a per-rank cache that lives as long as the gang), send the result
back. Functions travel by reference (module-level functions), payloads and results by pickle: keep them small
(numbers, lists, dicts; trace files are written by the rank itself).

The parent's `run()` is the watchdog: it polls the result queue, checks that every rank process is alive, and
fails the job when
- a rank process died (its exit code / signal is in the message),
- some rank raised while others did not answer within `error_grace_s` (they are stuck in a collective),
- the job ran past `timeout_s` (a hung gang: retryable),
- every rank raised an error that leaves the process unusable (OOM, CUDA/NCCL errors, compile errors),
in each case with the gang torn down (`GangError.restarted`). A rank stuck in a collective (its peer hung or
died) is a transient failure: `GangError.retryable` is True for it whatever the raising rank's error was.
`run(..., collective_timeout_s=)` sets the process group's collective timeout for that job (ranks apply it
before running it), so a hung peer is noticed after the point's own limits, not after `pg_timeout_s`. A plain exception raised on every rank (a bad
input, a failed check) fails the job and keeps the gang. `cancel()` returning True aborts the job (SIGTERM).

Rank shutdown follows anchors/cpu-feasibility.md §3 (profiler + gloo abort at exit): results are sent first,
then `barrier`, `destroy_process_group`, `os._exit(0)`. A rank whose parent disappears exits by itself.
`GangPool` keeps one gang per W, at most `max_alive` at once (least recently used closed first). `Gangs` is what a
worker needs of its gangs (a `GangPool`, or `runners.multihost.TorchrunGang` across hosts); `run_rank_job`,
`set_collective_timeout` and `raise_job_errors` are one job on one rank, its collective timeout and the gang's
verdict on the ranks' errors, shared by both.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import tempfile
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from runners.errors import GangError

__all__ = ["Gang", "GangPool", "Gangs", "JobCancelled", "RankContext", "is_fatal", "raise_job_errors", "run_rank_job", "set_collective_timeout"]

logger = logging.getLogger(__name__)

# exceptions after which a rank process is not trusted for the next job, matched on type name or message
_FATAL_TYPES = ("OutOfMemoryError", "CompilationError", "DistBackendError", "DistNetworkError", "DistError", "AcceleratorError")
_FATAL_TEXT = ("out of memory", "CUDA error", "NCCL", "device-side assert", "illegal memory access", "Connection closed by peer")
_TRACEBACK_CHARS = 6000


class JobCancelled(Exception):
    """The job was aborted because `cancel()` said so (the gang was torn down)."""


@dataclass
class RankContext:
    """What a job function gets on each rank."""

    rank: int
    world_size: int
    device: Any  # torch.device
    backend: str  # "gloo" | "nccl"
    group: Any  # the gang's process group (the default group)
    cache: dict[str, Any] = field(default_factory=dict)  # lives as long as the rank process


def set_collective_timeout(seconds: float, group: Any = None) -> bool:
    """Set the collective timeout of `group` (None: the default group); False when torch's private API is gone
    (the caller's watchdog is then the backstop)."""
    import torch.distributed as dist

    try:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    except Exception:  # noqa: BLE001 - a private torch API
        return False
    return True


def run_rank_job(ctx: RankContext, fn: Callable[[RankContext, Any], Any], payload: Any) -> tuple[bool, Any]:
    """`fn(ctx, payload)` on this rank: (True, its picklable value), or (False, the error as `{type, message,
    traceback}` text) whatever it raised."""
    try:
        value = fn(ctx, payload)
        pickle.dumps(value)
        return True, value
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the gang's leader as text
        text = "".join(traceback.format_exception(type(err), err, err.__traceback__))[-_TRACEBACK_CHARS:]
        return False, {"type": type(err).__name__, "message": str(err), "traceback": text}


def raise_job_errors(errors: dict[int, dict[str, str]]) -> None:
    """Raise the `GangError` of a job whose ranks all answered, some with `errors` (rank -> `run_rank_job`'s
    error): restarted and retryable when an error leaves the rank process unusable (OOM, CUDA/NCCL...)."""
    if errors:
        fatal = is_fatal(errors)
        raise GangError(_error_text(errors), restarted=fatal, retryable=fatal)


def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _rank_main(
    rank: int,
    world_size: int,
    device_kind: str,
    rdzv: str,
    pg_timeout_s: float,
    job_q: Any,
    result_q: Any,
    parent_pid: int,
) -> None:
    """Entry point of one rank process (spawned)."""
    # the parent handles Ctrl-C and SIGTERM and tears the gang down itself (SIGKILL, `Gang._teardown`); a SIGTERM sent
    # to the whole process group (GNU `timeout`, systemd's default KillMode, `kill -- -PGID`) must reach only the
    # parent, or the running point dies with its rank and is retried (an attempt used) instead of released
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import torch
    import torch.distributed as dist

    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        dist.init_process_group(
            backend, init_method=f"file://{rdzv}", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout_s)
        )
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises
        result_q.put(("ready", rank, os.getpid(), f"{type(err).__name__}: {err}"))
        os._exit(1)
    result_q.put(("ready", rank, os.getpid(), None))
    ctx = RankContext(rank=rank, world_size=world_size, device=device, backend=backend, group=dist.group.WORLD)
    current_timeout_s = pg_timeout_s
    while True:
        try:
            msg = job_q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:
                os._exit(1)
            continue
        if msg[0] == "stop":
            break
        _, job_id, fn, payload, collective_timeout_s = msg
        if collective_timeout_s not in (None, current_timeout_s) and set_collective_timeout(collective_timeout_s):
            current_timeout_s = collective_timeout_s
        result_q.put((job_id, rank, *run_rank_job(ctx, fn, payload)))
    # results are out; now the shutdown that avoids the profiler + gloo abort at exit
    with contextlib.suppress(Exception):
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)


class Gang:
    """W rank processes with one process group, started lazily and kept until `close()` or a failure."""

    def __init__(
        self,
        world_size: int,
        *,
        device_kind: str = "cpu",
        start_timeout_s: float = 180.0,
        pg_timeout_s: float = 300.0,
        error_grace_s: float = 5.0,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got world_size={world_size}")
        if device_kind not in ("cpu", "cuda"):
            raise ValueError(f"device_kind must be 'cpu' or 'cuda', got device_kind={device_kind!r}")
        self.world_size = world_size
        self.device_kind = device_kind
        self.start_timeout_s = start_timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.error_grace_s = error_grace_s
        self.starts = 0
        self._procs: list[Any] = []
        self._job_qs: list[Any] = []
        self._result_q: Any = None
        self._dir: str | None = None
        self._job_id = 0
        self.pids: list[int] = []

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.exitcode is None for p in self._procs)

    def start(self) -> None:
        """Spawn the ranks and wait until every one has initialised its process group."""
        if self.alive:
            return
        self._teardown()
        ctx = mp.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix=f"cpbench-gang{self.world_size}-")
        rdzv = os.path.join(self._dir, "rdzv")
        self._result_q = ctx.Queue()
        self._job_qs = [ctx.Queue() for _ in range(self.world_size)]
        t0 = time.monotonic()
        self._procs = [
            ctx.Process(
                target=_rank_main,
                args=(r, self.world_size, self.device_kind, rdzv, self.pg_timeout_s, self._job_qs[r], self._result_q, os.getpid()),
                name=f"cpbench-rank{r}of{self.world_size}",
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        pids: dict[int, int] = {}
        deadline = t0 + self.start_timeout_s
        while len(pids) < self.world_size:
            try:
                kind, rank, pid, err = self._result_q.get(timeout=0.1)
            except queue.Empty:
                kind = None
            if kind == "ready":
                if err is not None:
                    self._teardown()
                    raise GangError(f"rank {rank} of a W={self.world_size} gang failed to start: {err}", restarted=True)
                pids[rank] = pid
                continue
            dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if p.exitcode is not None]
            if dead:
                self._teardown()
                raise GangError(
                    f"rank {dead[0][0]} of a W={self.world_size} gang {_signal_name(dead[0][1])} while starting", restarted=True
                )
            if time.monotonic() > deadline:
                self._teardown()
                raise GangError(f"a W={self.world_size} gang did not start within {self.start_timeout_s:g} s", restarted=True)
        self.pids = [pids[r] for r in range(self.world_size)]
        self.starts += 1
        logger.info("started a W=%d %s gang in %.2f s (pids %s)", self.world_size, self.device_kind, time.monotonic() - t0, self.pids)

    def run(
        self,
        fn: Callable[[RankContext, Any], Any],
        payload: Any,
        *,
        timeout_s: float = 900.0,
        cancel: Callable[[], bool] | None = None,
        collective_timeout_s: float | None = None,
    ) -> list[Any]:
        """Run `fn(ctx, payload)` on every rank; the results, indexed by rank. Raises GangError / JobCancelled.

        collective_timeout_s: the process group's collective timeout while this job runs (None: keep the last one).
        """
        self.start()
        self._job_id += 1
        job_id = self._job_id
        for q in self._job_qs:
            q.put(("job", job_id, fn, payload, collective_timeout_s))
        results: list[Any] = [None] * self.world_size
        errors: dict[int, dict[str, str]] = {}
        answered: set[int] = set()
        deadline = time.monotonic() + timeout_s
        first_error_at: float | None = None
        while len(answered) < self.world_size:
            try:
                jid, rank, ok, value = self._result_q.get(timeout=0.05)
            except queue.Empty:
                jid = None
            if jid == job_id:
                answered.add(rank)
                if ok:
                    results[rank] = value
                else:
                    errors[rank] = value
                    first_error_at = first_error_at or time.monotonic()
                continue
            dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if p.exitcode is not None and r not in answered]
            if dead:
                self._teardown()
                detail = "; ".join(f"rank {r} {_signal_name(c)}" for r, c in dead)
                raise GangError(f"{detail} during the job (W={self.world_size}); gang restarted", restarted=True)
            if cancel is not None and cancel():
                self._teardown()
                raise JobCancelled(f"job cancelled on a W={self.world_size} gang")
            now = time.monotonic()
            if first_error_at is not None and now - first_error_at > self.error_grace_s:
                missing = sorted(set(range(self.world_size)) - answered)
                self._teardown()
                raise GangError(
                    f"{_error_text(errors)}\n(ranks {missing} did not answer after rank {min(errors)} failed; gang restarted)",
                    restarted=True,
                    retryable=True,  # a hung collective is transient, whatever the raising rank said
                )
            if now > deadline:
                missing = sorted(set(range(self.world_size)) - answered)
                self._teardown()
                raise GangError(
                    f"ranks {missing} did not answer within {timeout_s:g} s (watchdog, W={self.world_size}); gang restarted",
                    restarted=True,
                )
        if errors and is_fatal(errors):
            self._teardown()
        raise_job_errors(errors)
        return results

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the ranks cleanly (barrier, destroy, exit), killing any that do not exit within `timeout_s`."""
        if self.alive:
            for q in self._job_qs:
                with contextlib.suppress(Exception):
                    q.put(("stop",))
            deadline = time.monotonic() + timeout_s
            for p in self._procs:
                p.join(max(0.0, deadline - time.monotonic()))
        self._teardown()

    def _teardown(self) -> None:
        for p in self._procs:
            if p.exitcode is None:
                with contextlib.suppress(Exception):
                    p.kill()
        for p in self._procs:
            with contextlib.suppress(Exception):
                p.join(5.0)
        for q in [*self._job_qs, *([self._result_q] if self._result_q is not None else [])]:
            with contextlib.suppress(Exception):
                q.cancel_join_thread()
                q.close()
        self._procs, self._job_qs, self._result_q, self.pids = [], [], None, []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def is_fatal(errors: dict[int, dict[str, str]]) -> bool:
    return any(e.get("type") in _FATAL_TYPES or any(t in e.get("message", "") for t in _FATAL_TEXT) for e in errors.values())


def _error_text(errors: dict[int, dict[str, str]]) -> str:
    rank = min(errors)
    e = errors[rank]
    return f"rank {rank}: {e['type']}: {e['message']}\n{e['traceback']}".rstrip()


class Gangs(Protocol):
    """What a worker runs its points on: a `GangPool` (gangs spawned on this host) or the gang torchrun started
    across hosts (`runners.multihost.TorchrunGang`)."""

    @property
    def restarts(self) -> int: ...

    def get(self, world_size: int) -> Any: ...  # its `close()` restarts the gang of that W

    def run(
        self,
        world_size: int,
        fn: Callable[[RankContext, Any], Any],
        payload: Any,
        *,
        timeout_s: float = ...,
        cancel: Callable[[], bool] | None = ...,
        collective_timeout_s: float | None = ...,
    ) -> list[Any]: ...

    def close(self) -> None: ...


class GangPool:
    """One gang per CP size, started on first use; at most `max_alive` alive (LRU closed first)."""

    def __init__(self, device_kind: str = "cpu", *, max_alive: int = 4, **gang_kwargs: Any) -> None:
        self.device_kind = device_kind
        self.max_alive = max_alive
        self.gang_kwargs = gang_kwargs
        self._gangs: OrderedDict[int, Gang] = OrderedDict()

    def get(self, world_size: int) -> Gang:
        gang = self._gangs.pop(world_size, None)
        if gang is None:
            gang = Gang(world_size, device_kind=self.device_kind, **self.gang_kwargs)
        self._gangs[world_size] = gang
        while sum(g.alive for g in self._gangs.values()) > self.max_alive - (0 if gang.alive else 1):
            w, old = next((w, g) for w, g in self._gangs.items() if g.alive and g is not gang)
            logger.info("closing the W=%d gang (more than %d alive)", w, self.max_alive)
            old.close()
        return gang

    def run(self, world_size: int, fn: Callable[[RankContext, Any], Any], payload: Any, **kwargs: Any) -> list[Any]:
        return self.get(world_size).run(fn, payload, **kwargs)

    @property
    def restarts(self) -> int:
        """Gang starts past each gang's first (its restarts after failures)."""
        return sum(max(0, g.starts - 1) for g in self._gangs.values())

    def close(self) -> None:
        for gang in self._gangs.values():
            gang.close()
        self._gangs.clear()
