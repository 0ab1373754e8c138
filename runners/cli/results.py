"""`cpbench results SWEEP`: every point of a sweep with its timing, errors and profile.

    cpbench results 3 [--format table|csv|json] [--db URL]

`table` is for people; `csv` has the fixed columns of `runners.cli.common.CSV_FIELDS` (JSON in the dict
cells); `json` is every stored field of every point.
"""

from __future__ import annotations

import typer

from runners.cli.common import DbOption, Format, fetch_results, out_console, render_results, resolve
from runners.errors import SweepNotFoundError

__all__ = ["register"]


def results(
    sweep: int = typer.Argument(..., help="sweep id"),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="table | csv | json"),
    db: DbOption = None,
) -> None:
    """Show the results of one sweep."""
    from db import crud
    from db.migrate import require_migrated
    from db.session import session_scope

    url = resolve(db)
    require_migrated(url)
    with session_scope(url) as s:
        row = crud.get_sweep(s, sweep_id=sweep)
        if row is None:
            raise SweepNotFoundError(f"no sweep with id {sweep}")
        name = row.name
    render_results(fetch_results(url, sweep), fmt, console=out_console(), title=f"sweep {sweep}: {name}")


def register(app: typer.Typer) -> None:
    app.command("results")(results)
