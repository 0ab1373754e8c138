"""`cpbench db`: the store's schema, and results brought in from another store.

    cpbench db upgrade [--db URL]      # migrate to the newest schema (creates the SQLite file if there is none)
    cpbench db current [--db URL]      # the revision the store is at
    cpbench db import FILE... --sweep N [--db URL]    # another store's export fills sweep N's points, by key
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from runners.cli.common import DbOption, out_console, resolve

__all__ = ["register"]

db_app = typer.Typer(help="The store: schema migrations, results imported from another store.", no_args_is_help=True)


@db_app.command("upgrade")
def upgrade(db: DbOption = None) -> None:
    """Migrate the store to the newest schema revision."""
    from db.migrate import safe_url
    from db.migrate import upgrade as do_upgrade

    url = resolve(db)
    rev = do_upgrade(url)
    Console().print(f"store {safe_url(url)} is at revision [bold]{rev}[/bold] (head)")


@db_app.command("current")
def current(db: DbOption = None) -> None:
    """Show the schema revision of the store (and the newest one)."""
    from db.migrate import current_revision, head_revision, safe_url

    url = resolve(db)
    cur, head = current_revision(url), head_revision()
    note = "up to date" if cur == head else "run `cpbench db upgrade`"
    Console().print(f"store {safe_url(url)}: revision {cur or 'none'}, head {head} ({note})")


@db_app.command("import")
def import_results(
    files: list[Path] = typer.Argument(..., help="exports of another store: `cpbench results M -f json` (or -f csv)"),
    sweep: int = typer.Option(..., "--sweep", help="the sweep whose points (same keys) the rows fill"),
    db: DbOption = None,
) -> None:
    """Fill a sweep's unmeasured points from exported result rows with the same keys (summaries, no raw samples)."""
    from runners.errors import CpbenchError
    from runners.results_import import import_files

    try:
        summaries = import_files(resolve(db), sweep, files)
    except ValueError as e:  # a file that is not an export, a sweep that is not there: one line (`cpbench` prints it)
        raise CpbenchError(str(e)) from None
    console = out_console()
    for path, summary in zip(files, summaries, strict=True):
        for line in summary.lines(sweep):
            console.print(f"{path.name}: {line}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
