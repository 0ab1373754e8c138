"""`cpbench db upgrade`: migrate the store to the newest schema (what the worker and the server require).

    cpbench db upgrade [--db URL]      # creates the SQLite file when it does not exist
    cpbench db current [--db URL]      # the revision the store is at
"""

from __future__ import annotations

import typer
from rich.console import Console

from runners.cli.common import DbOption, resolve

__all__ = ["register"]

db_app = typer.Typer(help="The store: schema migrations.", no_args_is_help=True)


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


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
