"""THE MULTI-HOST WORKER: `cpbench worker --multi-host`, started by torchrun on every host of an allocation; one
gang of every rank torchrun started (NCCL on GPUs, gloo with `--cpu`), whose rank 0 alone talks to the store.

    python -m torch.distributed.run --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        --max-restarts 3 -m bench_server worker --multi-host [--cpu] [--once]

We write no launcher: torchrun (Slurm: `srun torchrun ...`, Kubernetes: a JobSet running torchrun) starts the ranks,
forms the rendezvous and restarts the gang. Every rank reads torchrun's environment (`TorchrunEnv`: RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK), joins the process group (`env://`, collective timeout
`CPBENCH_PG_TIMEOUT_S`) and a gloo control group for the messages between rank 0 and the others (timeout
`CPBENCH_JOB_TIMEOUT_S + CPBENCH_PG_TIMEOUT_S`, so no wait is endless), and tells rank 0 where it runs
(`runners.topology.RankPlace`).

Rank 0 runs a `runners.worker.Worker` (`MultiHostWorker`) whose gangs are this one (`TorchrunGang`), so the worker's
whole path is reused: it claims the points whose W fits the gang (W <= world size; larger ones stay queued and
`cpbench status` says why), renews the lease from its heartbeat thread, tunes, runs `runners.execute.run_point_job`,
turns the results into rows with the topology of the point's ranks (`runners.results.store_rows`) and stores them
(`runners.worker._write_results`). `TorchrunGang.run(W, ...)` broadcasts the job over the control group; the first
W ranks run it (`runners.gang.run_rank_job`) on the sub-group of ranks 0..W-1 (made by every rank on first use,
cached per W; the default group at W = world size), the others skip it; every rank's answer is gathered to rank 0,
which raises errors as a spawned gang does (`runners.gang.raise_job_errors`). While idle, rank 0 pings the others
every heartbeat. With `--once` rank 0 stops when nothing it can run is left, and every rank exits with its code.

Failures: a rank or host that dies breaks the process group. The ranks left get an error from their collective (or
its timeout); rank 0 fails the point's attempt (retryable: it returns to the queue at once) and stops, and every
rank exits 1, so the elastic agents restart the gang by torchrun's rules (`--max-restarts`). Were rank 0 itself
gone, its lease expires and the point returns to the queue. A job past its time limit on rank 0 (the point's own
limit plus `CPBENCH_POINT_OVERHEAD_S`) makes rank 0 exit 1 (the watchdog), with the same outcome. Start the agents
with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, so that a host replacing a dead one can join the restarted gang (torch
2.13's rank-0 agent otherwise does not publish its address again in the new round).

Topology: every rank's place is known to rank 0, so each point's measurement records the hosts of its W ranks
(`runners.topology`). On GPUs, unless NCCL_DEBUG is set, each rank has NCCL log its INIT/NET lines (and warnings)
to `<tmp>/cpbench-nccl-<pid>.log`, so that the interconnect names the network NCCL reports between hosts.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from db.topology import Topology
from runners.errors import CpbenchError, GangError
from runners.gang import RankContext, is_fatal, raise_job_errors, run_rank_job, set_collective_timeout
from runners.settings import get_worker_settings
from runners.topology import RankPlace, inter_host_link, intra_host_link, topology_of
from runners.worker import DeviceInfo, Worker, WorkerStats, detect_devices

__all__ = ["MultiHostWorker", "TorchrunEnv", "TorchrunGang", "exit_now", "run_multihost_worker"]

logger = logging.getLogger(__name__)

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunEnv:
    """This rank's place in the allocation, as torchrun tells it: global rank and size, local rank and size, node."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int  # GROUP_RANK: the host's (the torchrun agent's) index

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TorchrunEnv:
        env = os.environ if environ is None else environ
        missing = [k for k in TORCHRUN_VARS if not env.get(k)]
        if missing:
            raise CpbenchError(
                f"--multi-host runs under torchrun (python -m torch.distributed.run ... -m bench_server worker "
                f"--multi-host); {', '.join(missing)} not set"
            )
        rank, local_world = int(env["RANK"]), int(env["LOCAL_WORLD_SIZE"])
        return cls(
            rank=rank,
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=local_world,
            node=int(env.get("GROUP_RANK") or rank // local_world),
        )


class _Restart:
    """`TorchrunGang.get(W)`: closing it (the worker's answer to a crashed device) restarts the gang via torchrun."""

    def __init__(self, gang: TorchrunGang) -> None:
        self.gang = gang

    def close(self) -> None:
        self.gang.mark_broken("a rank's device crashed")


class TorchrunGang:
    """Every rank torchrun started, in one process group; on rank 0 the worker's `runners.gang.Gangs`."""

    def __init__(self, env: TorchrunEnv, device_kind: str, *, pg_timeout_s: float, control_timeout_s: float) -> None:
        self.env, self.device_kind = env, device_kind
        self.backend = "nccl" if device_kind == "cuda" else "gloo"
        self.pg_timeout_s, self.control_timeout_s = pg_timeout_s, control_timeout_s
        self.places: list[RankPlace] = []
        self.broken: str | None = None  # why the process group cannot be trusted any more
        self.on_broken: Callable[[str], None] | None = None
        self.restarts = 0  # torchrun restarts the gang, not us
        self._control: Any = None
        self._contexts: dict[int, RankContext] = {}
        self._pinged_at = time.monotonic()
        self._closed = False
        self.nccl_log = ""  # NCCL's INFO log of this process's first communicator, when captured

    # -- every rank ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Join the process group and the control group; rank 0 learns every rank's place."""
        import torch
        import torch.distributed as dist

        env = self.env
        if self.device_kind == "cuda":
            torch.cuda.set_device(env.local_rank)
            self.device = torch.device("cuda", env.local_rank)
        else:
            self.device = torch.device("cpu")
            if "OMP_NUM_THREADS" not in os.environ:
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))
        nccl_log = _capture_nccl_log() if self.backend == "nccl" else None
        t0 = time.monotonic()
        dist.init_process_group(
            self.backend,
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=self.pg_timeout_s),
        )
        self._control = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.control_timeout_s))
        place = RankPlace(env.node, socket.gethostname(), env.local_rank, intra_host_link(self.device_kind))
        places: list[Any] = [None] * env.world_size
        dist.all_gather_object(places, place, group=self._control)
        self.places = places
        if nccl_log is not None:  # the first collective on the NCCL group makes its communicator: NCCL logs its network
            dist.all_reduce(torch.zeros(1, device=self.device))
            torch.cuda.synchronize(self.device)
            self.nccl_log = nccl_log.read_text(errors="replace") if nccl_log.exists() else ""
            logger.info("rank %d: NCCL's log (its warnings too) goes to %s", env.rank, nccl_log)
        logger.info(
            "rank %d of %d joined a %s gang on %d host(s) in %.2f s",
            env.rank,
            env.world_size,
            self.backend,
            self.hosts,
            time.monotonic() - t0,
        )

    @property
    def hosts(self) -> int:
        return len({p.node for p in self.places})

    def topology(self, world_size: int) -> Topology:
        """The topology of a point's W ranks: the gang's first W."""
        return topology_of(self.places[:world_size], inter_host_link(self.backend, self.nccl_log))

    def _context(self, world_size: int) -> RankContext:
        """This rank's context for a W-rank job; every rank makes the W sub-group together on first use."""
        import torch.distributed as dist

        ctx = self._contexts.get(world_size)
        if ctx is None:
            if world_size == self.env.world_size:
                group = dist.group.WORLD
            else:
                group = dist.new_group(ranks=list(range(world_size)), timeout=timedelta(seconds=self.pg_timeout_s))
            ctx = RankContext(rank=self.env.rank, world_size=world_size, device=self.device, backend=self.backend, group=group)
            self._contexts[world_size] = ctx
        return ctx

    def _run_here(
        self, world_size: int, fn: Callable[[RankContext, Any], Any], payload: Any, collective_timeout_s: float | None
    ) -> tuple[bool, Any]:
        ctx = self._context(world_size)
        if self.env.rank >= world_size:
            return True, None
        if collective_timeout_s is not None:
            set_collective_timeout(collective_timeout_s, None if world_size == self.env.world_size else ctx.group)
        return run_rank_job(ctx, fn, payload)

    def _broadcast(self, msg: Any = None) -> Any:
        import torch.distributed as dist

        box = [msg]
        dist.broadcast_object_list(box, src=0, group=self._control)
        return box[0]

    def _gather(self, answer: tuple[bool, Any]) -> list[tuple[bool, Any]] | None:
        import torch.distributed as dist

        answers: list[Any] | None = [None] * self.env.world_size if self.env.rank == 0 else None
        dist.gather_object(answer, answers, dst=0, group=self._control)
        return answers

    def follow(self) -> int:
        """Ranks other than 0: run what rank 0 sends until it says stop; the exit code it sends (1 on a failure)."""
        rank = self.env.rank
        while True:
            try:
                msg = self._broadcast()
                if msg[0] == "stop":
                    self._shutdown()
                    return int(msg[1])
                if msg[0] == "ping":
                    continue
                _, world_size, fn, payload, collective_timeout_s = msg
                answer = self._run_here(world_size, fn, payload, collective_timeout_s)
                self._gather(answer)
            except Exception:  # noqa: BLE001 - a peer died or a collective timed out: torchrun restarts the gang
                logger.exception("rank %d: the gang's control channel failed; exiting for torchrun to restart the gang", rank)
                return 1
            if not answer[0] and is_fatal({rank: answer[1]}):
                logger.error("rank %d: %s; exiting for torchrun to restart the gang", rank, answer[1].get("message"))
                return 1

    def _shutdown(self) -> None:
        import torch.distributed as dist

        try:
            dist.barrier(group=self._control)
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer already gone: nothing left to tear down cleanly
            logger.debug("rank %d: unclean process group shutdown", self.env.rank, exc_info=True)

    # -- rank 0: the worker's Gangs ---------------------------------------------------------------------------------
    def mark_broken(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
            logger.error("the gang is broken (%s); exiting for torchrun to restart it", why)
            if self.on_broken is not None:
                self.on_broken(why)

    def get(self, world_size: int) -> _Restart:
        return _Restart(self)

    def ping(self, every_s: float) -> None:
        """Tell the other ranks that rank 0 is alive (at most once per `every_s`), so their wait does not time out."""
        if self.broken is None and time.monotonic() - self._pinged_at >= every_s:
            try:
                self._broadcast(("ping",))
            except Exception as err:  # noqa: BLE001 - a peer is gone
                self.mark_broken(f"ping failed: {type(err).__name__}: {err}")
            self._pinged_at = time.monotonic()

    def run(self, world_size: int, fn: Callable[[RankContext, Any], Any], payload: Any, *, timeout_s: float = 900.0,
            cancel: Callable[[], bool] | None = None, collective_timeout_s: float | None = None) -> list[Any]:  # fmt: skip
        """Run `fn(ctx, payload)` on ranks 0..W-1; their results, indexed by rank. Raises GangError. `cancel` is not
        polled: rank 0 runs the job itself (a stop takes effect after it)."""
        if self.broken is not None:
            raise GangError(f"the gang is broken ({self.broken}); torchrun restarts it", restarted=True, retryable=True)
        if world_size > self.env.world_size:
            raise GangError(f"W={world_size} does not fit a gang of {self.env.world_size} ranks", retryable=False)
        watchdog = threading.Timer(timeout_s + get_worker_settings().POINT_OVERHEAD_S, _watchdog_exit, (world_size, timeout_s))
        watchdog.daemon = True
        try:
            self._broadcast(("job", world_size, fn, payload, collective_timeout_s))
            watchdog.start()
            own = self._run_here(world_size, fn, payload, collective_timeout_s)
            if not own[0] and is_fatal({0: own[1]}):
                # the peers may be gone (a dead host): do not wait in the gather
                raise GangError(f"rank 0: {own[1]['type']}: {own[1]['message']}", restarted=True, retryable=True)
            answers = self._gather(own)
        except Exception as err:
            self.mark_broken(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            if isinstance(err, GangError):
                raise
            raise GangError(
                f"the W={world_size} job's collectives failed: {type(err).__name__}: {err}; torchrun restarts the gang",
                restarted=True,
                retryable=True,
            ) from err
        finally:
            watchdog.cancel()
        assert answers is not None
        errors = {r: value for r, (ok, value) in enumerate(answers[:world_size]) if not ok}
        if errors and is_fatal(errors):
            self.mark_broken(f"rank {min(errors)} failed: {errors[min(errors)]['type']}")
        raise_job_errors(errors)
        return [value for _, value in answers[:world_size]]

    def close(self) -> None:
        """The worker is done with the gang: nothing to do here, `stop()` ends the ranks once the exit code is known."""

    def stop(self, exit_code: int) -> None:
        """Tell the other ranks to stop with `exit_code` (unless the gang is broken), then leave the process group."""
        if self._closed:
            return
        self._closed = True
        if self.broken is None:
            try:
                self._broadcast(("stop", exit_code))
            except Exception:  # noqa: BLE001 - a peer is gone: they exit by their own error
                logger.warning("could not tell the ranks to stop", exc_info=True)
                return
            self._shutdown()


def _capture_nccl_log() -> Path | None:
    """Have NCCL write its INIT/NET INFO lines (its network is in them) and its warnings to a file of this process,
    unless the user set NCCL_DEBUG; the file, or None."""
    if os.environ.get("NCCL_DEBUG"):
        return None
    path = Path(tempfile.gettempdir()) / f"cpbench-nccl-{os.getpid()}.log"
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=str(path))
    return path


def _watchdog_exit(world_size: int, timeout_s: float) -> None:
    logger.error(
        "rank 0: a W=%d job ran past its %g s limit (watchdog); exiting for torchrun to restart the gang",
        world_size,
        timeout_s,
    )
    logging.shutdown()
    os._exit(1)


class MultiHostWorker(Worker):
    """Rank 0's worker: the gang is torchrun's (`TorchrunGang`), the devices all its ranks on all its hosts."""

    def __init__(self, url: str | None, gang: TorchrunGang, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.gang = gang
        gang.on_broken = lambda why: self.request_stop(f"a broken gang ({why})")

    def _detect_devices(self) -> DeviceInfo:
        local = detect_devices(self.gang.env.local_world_size, kind=self.gang.device_kind)
        return replace(local, count=self.gang.env.world_size, hosts=self.gang.hosts)

    def _make_pool(self, info: DeviceInfo) -> TorchrunGang:
        return self.gang

    def topology(self, world_size: int) -> Topology:
        return self.gang.topology(world_size)

    def _beat_idle(self) -> None:
        super()._beat_idle()
        self.gang.ping(self.heartbeat_s)


def run_multihost_worker(url: str | None = None, *, once: bool = False, max_points: int | None = None,
                         device_kind: str | None = None, lease_s: float | None = None, heartbeat_s: float | None = None,
                         name: str | None = None) -> tuple[int, WorkerStats | None]:  # fmt: skip
    """This rank's part of the multi-host worker (see the module docstring): (its exit code, rank 0's stats or
    None). device_kind: "cpu" forces gloo on the CPU; None uses the GPUs when there are any."""
    env = TorchrunEnv.from_environ()
    if device_kind is None:
        import torch

        device_kind = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"
    s = get_worker_settings()
    gang = TorchrunGang(env, device_kind, pg_timeout_s=s.PG_TIMEOUT_S, control_timeout_s=s.JOB_TIMEOUT_S + s.PG_TIMEOUT_S)
    gang.start()
    if env.rank != 0:
        return gang.follow(), None
    code = 1
    try:
        worker = MultiHostWorker(
            url,
            gang,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            device_kind=device_kind,
            name=name or f"{socket.gethostname()}-gang{env.world_size}",
        )
        stats = worker.run(once=once, max_points=max_points)
        code = 1 if gang.broken is not None else 0
    finally:
        gang.stop(code)
    return code, stats


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown (gloo and the profiler can abort at exit: runners.gang's rule)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
