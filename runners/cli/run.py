"""`cpbench run SPEC`: submit a sweep and work it in this process until every point is done, failed or skipped.

    cpbench run runners/suites/demo.yaml [--db URL] [--devices N] [--cpu] [--format table|csv|json]
    cpbench run --resume SWEEP_ID [--db URL] ...      # take over an unfinished sweep (its run was stopped)

A sweep that `cpbench run` submits is owned by that process: no other worker claims its points. When the run is
stopped (Ctrl-C, a time limit, a crash), `--resume SWEEP_ID` gives the sweep to this process and works the points
left; what was measured stays stored.

Points this machine cannot run (W more than its devices, a backend not installed) are stored as skipped. On the
CPU the devices are gloo ranks: `--devices N`, default `CPBENCH_CPU_RANKS` (4).
Shows a progress bar while it works, the result table at the end (stdout), then one summary line on stderr: done
(how many of them unreliable: their stop rule did not converge), skipped, failed; a sweep whose every point was
skipped says so, with its skip reasons counted. Exits 1 when a point failed or points were left unfinished.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from runners.cli.common import DbOption, Format, fetch_results, out_console, render_results, resolve, run_summary

__all__ = ["register"]


def run(
    spec: Path | None = typer.Argument(None, help="sweep spec, YAML or JSON (not with --resume)"),
    resume: int | None = typer.Option(None, "--resume", min=1, help="take over this unfinished sweep instead"),
    db: DbOption = None,
    devices: int | None = typer.Option(None, "--devices", min=1, help="ranks to use (GPUs, or gloo ranks on the CPU)"),
    cpu: bool = typer.Option(False, "--cpu", help="run on the CPU even when GPUs are present"),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="result output"),
) -> None:
    """Submit a sweep and run it here until done."""
    from db import crud
    from db.migrate import require_migrated
    from db.session import session_scope
    from runners.engine import new_owner, run_until_done, submit_spec
    from runners.grid import available_backends
    from runners.spec import load_spec
    from runners.worker import detect_devices

    if (spec is None) == (resume is None):
        raise typer.BadParameter("give a spec file or --resume SWEEP_ID (one of them)")
    url = resolve(db)
    require_migrated(url)
    info = detect_devices(devices, kind="cpu" if cpu else None)
    owner = new_owner("run")  # this process works the sweep; other workers on the store never claim its points
    if spec is not None:
        sweep_spec = load_spec(spec)
        with session_scope(url) as s:
            sweep = submit_spec(s, sweep_spec, max_W=info.count, backends=available_backends(), owner=owner)
            sweep_id, name = sweep.id, sweep_spec.name
    else:
        assert resume is not None
        try:
            with session_scope(url) as s:
                name = crud.take_over_sweep(s, sweep_id=resume, owner=owner).name
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--resume") from None
        sweep_id = resume
    with session_scope(url) as s:
        start = crud.sweep_progress(s, sweep_id=sweep_id)
    err = Console(stderr=True)
    left = start["queued"] + start["running"]
    err.print(
        f"sweep [bold]{sweep_id}[/bold] ({escape(name)}): {start['total']} points, {start['skipped']} skipped"
        + (f", {left} left to run" if resume is not None else "") + f"; running on {info.count} {info.kind} rank(s)"
    )
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("running", total=start["total"])

        def progress(c: dict[str, int]) -> None:
            finished = c["done"] + c["failed"] + c["skipped"] + c["cancelled"]
            bar.update(task, completed=finished, description=f"done {c['done']}  failed {c['failed']}  skipped {c['skipped']}")

        final = run_until_done(url, sweep_id, progress=progress, devices=info.count, device_kind=info.kind, owner=owner)
    rows = fetch_results(url, sweep_id)
    render_results(rows, fmt, console=out_console(), title=f"sweep {sweep_id}: {name}")
    summary = run_summary(rows, sweep_id=sweep_id, name=name)
    everything_skipped = bool(rows) and all(r["status"] == "skipped" for r in rows)
    err.print(escape(summary), style="yellow" if everything_skipped else None, highlight=False, soft_wrap=True)
    if final["failed"]:
        err.print(f"[red]{final['failed']} point(s) failed[/red] (see `cpbench status {sweep_id}`)")
        raise typer.Exit(1)
    if final["queued"] or final["running"]:
        err.print(f"[yellow]stopped with {final['queued'] + final['running']} point(s) unfinished[/yellow] "
                  f"(`cpbench run --resume {sweep_id}` works them)")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
