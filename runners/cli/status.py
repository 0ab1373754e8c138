"""`cpbench status [SWEEP]`: the sweeps and workers, or one sweep's progress, running points and failures.

    cpbench status [--limit 20] [--db URL]   # recent sweeps with their counts, and the workers
                                             # (a regression run's sweeps are one row: `regress-run:<id>`;
                                             # a busy worker paying a peer's first call: "busy: compiling
                                             # FlashQLA kernels, 95 s")
    cpbench status 3                         # sweep 3: counts per status, what runs where, each failed point's error

Both say why queued points wait when no live worker's gang fits them ("waiting: 2 point(s) W=8 > largest
gang 4"; a multi-host gang counts the ranks on all its hosts), and when they belong to a `cpbench run` that stopped
("waiting: sweep 3 belongs to the `cpbench run` that submitted it ...: cpbench run --resume 3").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from kernels.vocabulary import regress_run
from runners.activity import describe
from runners.cli.common import DbOption, fetch_results, out_console, resolve
from runners.errors import SweepNotFoundError
from runners.settings import get_worker_settings

__all__ = ["owned_reasons", "register", "waiting_reasons"]


def _age(t: datetime | None) -> str:
    if t is None:
        return "-"
    s = (datetime.now(timezone.utc) - t).total_seconds()
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


SCAN_SWEEPS = 500  # sweeps read to fill `--limit` rows when regression runs are collapsed


def _rows(sweeps: list[Any], progress: dict[int, dict[str, int]]) -> list[dict[str, Any]]:
    """One row per sweep, newest first, except that the sweeps of one regression run (their `regress-run:` tag)
    share one row: their ids as a range, the run's name, the counts summed, running/queued while any member is."""
    rows: dict[Any, dict[str, Any]] = {}
    for sw in sweeps:
        run = regress_run(sw.tags)
        row = rows.setdefault(("run", run) if run else sw.id, {"ids": [], "name": sw.name, "statuses": [], "run": run,
                                                              "created": sw.created_at, "counts": Counter()})
        row["ids"].append(sw.id)
        row["statuses"].append(sw.status)
        row["counts"].update(progress[sw.id])
    for row in rows.values():
        if row["run"] is not None:
            row["name"] = f"regress run {row['run']} ({len(row['ids'])} sweeps)"
        active = [st for st in row["statuses"] if st in ("running", "queued")]
        row["status"] = active[0] if active else row["statuses"][0]
        row["id"] = str(row["ids"][0]) if len(row["ids"]) == 1 else f"{min(row['ids'])}-{max(row['ids'])}"
    return list(rows.values())


def waiting_reasons(queued: Mapping[tuple[int, str | None], int], gangs: Sequence[tuple[str, int]]) -> list[str]:
    """Why queued points wait: a line per W (and device kind) that no live worker's gang fits. `queued`:
    `db.crud.queued_widths`; `gangs`: (device kind, ranks) of each live worker (a multi-host gang counts every rank)."""
    lines = []
    for (W, kind), n in sorted(queued.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        sizes = [count for k, count in gangs if kind is None or k == kind]
        where = f" {kind}" if kind else ""
        if not sizes:
            lines.append(f"waiting: {n} point(s) W={W}: no live{where} worker")
        elif max(sizes) < W:
            lines.append(f"waiting: {n} point(s) W={W} > largest{where} gang {max(sizes)}")
    return lines


def owned_reasons(sweep_ids: Sequence[int]) -> list[str]:
    """A line per live sweep whose queued points only its own `cpbench run` claims (`db.crud.owned_waiting`)."""
    return [f"waiting: sweep {i} belongs to the `cpbench run` that submitted it (a plain worker does not take its "
            f"points): cpbench run --resume {i}" for i in sweep_ids]


def _live_gangs(workers: Sequence[Any], now: datetime, lease_s: float) -> list[tuple[str, int]]:
    from db import crud

    return [((w.devices or {}).get("kind", "?"), int((w.devices or {}).get("count", 0))) for w in workers
            if crud.worker_state(w, now, lease_s) in ("idle", "busy")]


def _devices(dev: dict[str, Any]) -> str:
    hosts = int(dev.get("hosts") or 1)
    return f"{dev.get('count', '?')} {dev.get('kind', '?')}" + (f" on {hosts} hosts" if hosts > 1 else "")


def status(
    sweep: int | None = typer.Argument(None, help="sweep id (default: list recent sweeps)"),
    limit: int = typer.Option(20, "--limit", min=1, help="sweeps to list"),
    db: DbOption = None,
) -> None:
    """Show sweeps and workers, or one sweep in detail."""
    from db import crud
    from db.clock import store_now
    from db.migrate import require_migrated
    from db.session import session_scope

    url = resolve(db)
    require_migrated(url)
    console = out_console()
    if sweep is None:
        with session_scope(url) as s:
            sweeps, total = crud.list_sweeps(s, skip=0, limit=max(limit, SCAN_SWEEPS))
            rows = _rows(sweeps, crud.sweeps_progress(s, sweep_ids=[sw.id for sw in sweeps]))[:limit]
            shown = sum(len(r["ids"]) for r in rows)
            table = Table(title=f"sweeps ({shown} of {total}; a regression run's sweeps in one row)", header_style="bold")
            for col in ("id", "name", "status", "points", "done", "unreliable", "failed", "skipped", "queued", "running",
                        "created"):
                table.add_column(col)
            for r in rows:
                c = r["counts"]
                table.add_row(r["id"], escape(r["name"]), escape(r["status"]), str(c["total"]), str(c["done"]), str(c["unreliable"]), str(c["failed"]),
                              str(c["skipped"]), str(c["queued"]), str(c["running"]), _age(r["created"]))
            workers = crud.list_workers(s)
            wt = Table(title=f"workers ({len(workers)})", header_style="bold")
            for col in ("name", "status", "devices", "point", "done", "heartbeat"):
                wt.add_column(col)
            now, lease = store_now(s), get_worker_settings().LEASE_S
            for w in workers:
                dev = w.devices or {}
                state = crud.worker_state(w, now, lease)
                doing = describe(dev.get("activity")) if state == "busy" else None  # e.g. compiling FlashQLA kernels
                wt.add_row(escape(w.name), escape(f"{state}: {doing}" if doing else state), _devices(dev), str(w.current_point_id or "-"),
                           str(w.points_done), _age(w.last_heartbeat))
            waiting = waiting_reasons(crud.queued_widths(s), _live_gangs(workers, now, lease))
            waiting += owned_reasons(crud.owned_waiting(s))
        console.print(table)
        console.print(wt)
        for line in waiting:
            console.print(escape(line))
        return
    with session_scope(url) as s:
        found = crud.get_sweep(s, sweep_id=sweep)
        if found is None:
            raise SweepNotFoundError(f"no sweep with id {sweep}")
        c = crud.sweep_progress(s, sweep_id=sweep)
        now, lease = store_now(s), get_worker_settings().LEASE_S
        waiting = waiting_reasons(crud.queued_widths(s, sweep_id=sweep), _live_gangs(crud.list_workers(s), now, lease))
        waiting += owned_reasons(crud.owned_waiting(s, sweep_id=sweep))
        header = (f"sweep [bold]{found.id}[/bold] {escape(found.name)} {escape(f'[{found.status}]')}  tags={escape(','.join(found.tags)) or '-'}  created {_age(found.created_at)}"
                  f"  finished {_age(found.finished_at)}")
    console.print(header)
    console.print("  ".join(f"{k} {v}" for k, v in c.items()))
    for line in waiting:
        console.print(escape(line))
    rows = fetch_results(url, sweep)
    running = [r for r in rows if r["status"] == "running"]
    failed = [r for r in rows if r["status"] == "failed"]
    for title, subset, field in (("running", running, None), ("failed", failed, "error")):
        if not subset:
            continue
        t = Table(title=title, header_style="bold")
        for col in ("#", "key", "attempts", "detail"):
            t.add_column(col, overflow="fold")
        for r in subset:
            detail = (r.get(field) or "").strip().splitlines()[0] if field else f"claimed {_age(r.get('claimed_at'))}"
            t.add_row(str(r["idx"]), escape(r["key"]), f"{r['attempts']}/{r['max_attempts']}", escape(detail))
        console.print(t)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
