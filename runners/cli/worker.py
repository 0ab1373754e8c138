"""`cpbench worker`: work the queue with persistent rank gangs until stopped (SIGTERM/Ctrl-C release the point).

    cpbench worker [--db URL] [--once] [--max-points N] [--devices N] [--cpu] [--lease-s 60] [--heartbeat-s 10] [--name NAME]
    torchrun --nnodes N --nproc-per-node G ... -m bench_server worker --multi-host [--cpu] [--once] ...

Refuses an unmigrated store. Knobs not given here come from `CPBENCH_*` variables (runners/settings.py); on the
CPU `--devices` defaults to `CPBENCH_CPU_RANKS` (4) gloo ranks. `--multi-host` makes one gang of every rank
torchrun started, across its hosts (`runners.multihost`); rank 0 alone works the store, and each rank exits with
its code (1: the gang broke, for torchrun to restart it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from runners.cli.common import DbOption, resolve

if TYPE_CHECKING:
    from runners.worker import WorkerStats

__all__ = ["register"]


def worker(
    db: DbOption = None,
    once: bool = typer.Option(False, "--once", help="exit when nothing is left to claim"),
    max_points: int | None = typer.Option(None, "--max-points", min=1, help="exit after this many points"),
    devices: int | None = typer.Option(None, "--devices", min=1, help="ranks to use (GPUs, or gloo ranks on the CPU)"),
    cpu: bool = typer.Option(False, "--cpu", help="run on the CPU even when GPUs are present"),
    lease_s: float | None = typer.Option(None, "--lease-s", help="lease per claimed point (default CPBENCH_LEASE_S)"),
    heartbeat_s: float | None = typer.Option(None, "--heartbeat-s", help="lease renewal period (default CPBENCH_HEARTBEAT_S)"),
    name: str | None = typer.Option(None, "--name", help="name prefix (default the host); pid and a random suffix are added"),
    multi_host: bool = typer.Option(False, "--multi-host", help="one gang of every rank torchrun started (on every host)"),
) -> None:
    """Claim and run points until stopped."""
    from runners.worker import run_worker

    if multi_host:
        _multi_host(db, once=once, max_points=max_points, devices=devices, cpu=cpu, lease_s=lease_s, heartbeat_s=heartbeat_s,
                    name=name)
        return
    url = resolve(db)
    stats = run_worker(
        url, once=once, max_points=max_points, devices=devices, device_kind="cpu" if cpu else None,
        lease_s=lease_s, heartbeat_s=heartbeat_s, name=name,
    )
    _print_stats(stats)
    if once:
        _print_owned(url)


def _print_owned(url: str) -> None:
    """After `--once`: the sweeps left queued because only their own `cpbench run` may take them (`cpbench status`)."""
    from db import crud
    from db.session import session_scope
    from runners.cli.status import owned_reasons

    with session_scope(url) as s:
        for line in owned_reasons(crud.owned_waiting(s)):
            Console(stderr=True).print(escape(line))


def _multi_host(db: str | None, *, devices: int | None, cpu: bool, **kwargs: Any) -> NoReturn:
    """This rank's part of a multi-host gang (`runners.multihost`); exits with its code."""
    from runners.errors import CpbenchError
    from runners.multihost import exit_now, run_multihost_worker

    if devices is not None:
        raise CpbenchError("--devices does not apply with --multi-host: the gang is every rank torchrun started")
    code, stats = run_multihost_worker(resolve(db), device_kind="cpu" if cpu else None, **kwargs)
    if stats is not None:
        _print_stats(stats)
    exit_now(code)


def _print_stats(stats: WorkerStats) -> None:
    Console(stderr=True).print(
        f"worker {escape(stats.name)}: {stats.done} done, {stats.failed} failed, {stats.released} released"
        + (f" (stopped by {escape(stats.stopped_by)})" if stats.stopped_by else "")
    )


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
