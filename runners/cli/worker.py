"""`cpbench worker`: work the queue with persistent rank gangs until stopped (SIGTERM/Ctrl-C release the point).

    cpbench worker [--db URL] [--once] [--max-points N] [--devices N] [--cpu] [--lease-s 60] [--heartbeat-s 10] [--name NAME]

Refuses an unmigrated store. Knobs not given here come from `CPBENCH_*` variables (runners/settings.py); on the
CPU `--devices` defaults to `CPBENCH_CPU_RANKS` (4) gloo ranks.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from runners.cli.common import DbOption, resolve

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
) -> None:
    """Claim and run points until stopped."""
    from runners.worker import run_worker

    stats = run_worker(
        resolve(db), once=once, max_points=max_points, devices=devices, device_kind="cpu" if cpu else None,
        lease_s=lease_s, heartbeat_s=heartbeat_s, name=name,
    )
    Console(stderr=True).print(
        f"worker {escape(stats.name)}: {stats.done} done, {stats.failed} failed, {stats.released} released"
        + (f" (stopped by {escape(stats.stopped_by)})" if stats.stopped_by else "")
    )


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
