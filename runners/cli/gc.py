"""`cpbench gc`: remove orphan files, trace files with no artifact row and spool files nobody will store.

    cpbench gc [--db URL] [--artifact-dir DIR] [--min-age-s 3600] [--dry-run]

What counts as an orphan is `runners.housekeeping`'s business; a trace younger than `--min-age-s` is kept while
its worker is alive (it may be about to store it).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from runners.cli.common import DbOption, resolve
from runners.errors import CpbenchError

__all__ = ["register"]


def gc(
    db: DbOption = None,
    artifact_dir: Path | None = typer.Option(None, "--artifact-dir", help="default CPBENCH_ARTIFACT_DIR"),
    min_age_s: float = typer.Option(3600.0, "--min-age-s", help="keep younger trace files of live workers"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed, remove nothing"),
) -> None:
    """Remove orphan trace and spool files."""
    import math

    from db.migrate import require_migrated
    from db.settings import get_db_settings
    from runners.housekeeping import collect_garbage
    from runners.settings import get_worker_settings

    if not (math.isfinite(min_age_s) and min_age_s >= 0):
        raise CpbenchError(f"--min-age-s must be a finite number >= 0, got {min_age_s}")
    url = resolve(db)
    require_migrated(url)
    art = Path(artifact_dir or get_db_settings().ARTIFACT_DIR).resolve()
    spool_dir = get_worker_settings().SPOOL_DIR
    spool = Path(spool_dir).resolve() if spool_dir else art / "spool"
    report = collect_garbage(url, art, spool, min_age_s=min_age_s, dry_run=dry_run)
    out = Console(highlight=False)
    for f in report.removed:
        out.print(escape(str(f)))
    verb = "would remove" if dry_run else "removed"
    Console(stderr=True).print(f"{verb} {len(report.removed)} orphan file(s), {report.bytes} bytes")


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)
