"""`cpbench submit SPEC`: validate a sweep spec, expand its grid and queue it for workers.

    cpbench submit runners/suites/demo.yaml [--db URL]

Points that cannot run (H % W != 0 for headwise, token counts that do not split, the one-device modes `none` and
`warmup_correct` at W > 1) are stored as skipped with the reason; device limits are left to the workers, which claim
by W and device kind. Prints a summary line, then the sweep id alone on the last line.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from runners.cli.common import DbOption, resolve

__all__ = ["register"]


def submit(
    spec: Path = typer.Argument(..., help="sweep spec, YAML or JSON (a YAML file of several documents: one sweep each)"),
    db: DbOption = None,
) -> None:
    """Queue a sweep (or each sweep of a multi-document suite) for the workers."""
    from db import crud
    from db.migrate import require_migrated
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_specs

    url = resolve(db)
    require_migrated(url)
    for sweep_spec in load_specs(spec):  # every document is checked before any is queued
        with session_scope(url) as s:
            sweep = submit_spec(s, sweep_spec)
            sweep_id, n = sweep.id, sweep.n_points
        with session_scope(url) as s:
            prog = crud.sweep_progress(s, sweep_id=sweep_id)
        Console().print(
            f"sweep [bold]{sweep_id}[/bold] ({escape(sweep_spec.name)}) queued: {n} points, {prog['queued']} to run, {prog['skipped']} skipped"
        )
        typer.echo(sweep_id)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
