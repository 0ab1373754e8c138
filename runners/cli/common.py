"""Shared pieces of the CLI verbs: the store option, URL resolution and result rendering (table, CSV, JSON)."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["CSV_FIELDS", "DbOption", "Format", "fetch_results", "is_unreliable", "out_console", "render_results", "resolve",
           "results_table", "run_summary"]

DbOption = Annotated[
    str | None,
    typer.Option("--db", "--database-url", help="SQLAlchemy URL of the store (default: CPBENCH_DATABASE_URL, else a local SQLite file)"),
]


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


CSV_FIELDS = (
    "point_id", "sweep_id", "idx", "key", "op", "mode", "backend", "B", "T", "H", "K", "V", "lb", "W", "layout",
    "direction", "dtype", "seed", "status", "reason", "error", "attempts", "clock", "n", "median_ms", "p10_ms",
    "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms", "stop_reason", "unreliable", "err_vs_none", "err_vs_reference",
    "collectives", "collective_bytes", "host_syncs", "by_direction", "kernel_launches", "peak_memory_bytes", "artifact_id",
    "hosts", "ranks_per_host", "interconnect", "device_name", "torch", "triton", "git_sha", "host", "params",
    "measured_at", "configs", "report",
)  # fmt: skip


def out_console() -> Console:
    """Console for stdout: the terminal's width, or a wide 220 columns when piped (tables stay readable in files)."""
    return Console() if sys.stdout.isatty() else Console(width=220)


def resolve(db: str | None) -> str:
    from db.session import resolve_url

    return resolve_url(db)


def fetch_results(url: str, sweep_id: int, *, page: int = 1000) -> list[dict[str, Any]]:
    """Every point of the sweep with its measurement and profile (all pages)."""
    from db import crud
    from db.session import session_scope

    rows: list[dict[str, Any]] = []
    with session_scope(url) as s:
        while True:
            chunk, total = crud.list_results(s, sweep_id=sweep_id, skip=len(rows), limit=page)
            rows.extend(chunk)
            if not chunk or len(rows) >= total:
                break
    return rows


def _heads(r: dict[str, Any]) -> str:
    """`H`, or `H/HV` for grouped value heads (HV != H)."""
    hv = (r.get("params") or {}).get("HV")
    return f"{r.get('H')}/{hv}" if hv is not None and hv != r.get("H") else str(r.get("H"))


def _shape(r: dict[str, Any]) -> str:
    lengths = (r.get("params") or {}).get("lengths")
    if lengths:
        return "varlen " + "+".join(str(n) for n in lengths) if len(lengths) <= 4 else f"varlen {len(lengths)} seqs, {r['T']}"
    return f"{r['B']}x{r['T']}"


def _coll(c: dict[str, int] | None) -> str:
    short = {"all_gather": "ag", "all_to_all": "a2a", "all_reduce": "ar", "reduce_scatter": "rs", "send": "send", "recv": "recv"}
    if not c:
        return "-" if c is None else "0"
    return " ".join(f"{short.get(k, k)}{n}" for k, n in sorted(c.items()) if n) or "0"


def is_unreliable(r: dict[str, Any]) -> bool:
    """A done point whose stop rule did not converge: its stored `unreliable` reason (`runners.timing`; migration
    0005 marked the rows stored before it)."""
    return r.get("status") == "done" and bool(r.get("unreliable"))


def run_summary(rows: Sequence[dict[str, Any]], *, sweep_id: int, name: str) -> str:
    """One line for a finished run: done (unreliable among them), skipped, failed, unfinished; a sweep whose every
    point is skipped says so, with its skip reasons counted."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("status") or "?"] = counts.get(r.get("status") or "?", 0) + 1
    head = f"sweep {sweep_id} ({name}): "
    if rows and counts.get("skipped", 0) == len(rows):
        reasons: dict[str, int] = {}
        for r in rows:
            reason = (r.get("reason") or "no reason stored").strip()
            reasons[reason] = reasons.get(reason, 0) + 1
        said = "; ".join(f"{n} x {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return head + f"every point ({len(rows)}) was skipped, nothing was measured: {said}"
    unreliable = sum(is_unreliable(r) for r in rows)
    parts = [f"{counts.get('done', 0)} done" + (f" ({unreliable} unreliable: stop rule not converged)" if unreliable else ""),
             f"{counts.get('skipped', 0)} skipped", f"{counts.get('failed', 0)} failed"]
    left = counts.get("queued", 0) + counts.get("running", 0)
    parts += [f"{left} unfinished"] if left else []
    parts += [f"{counts['cancelled']} cancelled"] if counts.get("cancelled") else []
    return head + ", ".join(parts)


def _status_cell(r: dict[str, Any]) -> str:
    colors = {"done": "green", "failed": "red", "skipped": "yellow", "running": "cyan", "cancelled": "magenta"}
    status = r.get("status") or ""
    if is_unreliable(r):
        return "[yellow]done, unreliable[/]"
    return f"[{colors.get(status, 'white')}]{escape(status)}[/]"


def _note(r: dict[str, Any]) -> str:
    """The reason of a skipped point, the first line of a failed one's error, or why a measurement is unreliable."""
    if r.get("reason"):
        return str(r["reason"])
    if r.get("error"):
        return str(r["error"]).splitlines()[0] if str(r["error"]).strip() else ""
    if is_unreliable(r):
        return str(r["unreliable"])
    return ""


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def results_table(rows: Sequence[dict[str, Any]], *, title: str | None = None) -> Table:
    table = Table(title=escape(title) if title else None, show_lines=False, header_style="bold")
    for col, kw in (
        ("#", {"justify": "right"}), ("op", {}), ("direction", {}), ("mode", {}), ("backend", {}), ("shape", {}),
        ("H", {"justify": "right"}), ("K/V", {}), ("lb", {"justify": "right"}), ("W", {"justify": "right"}), ("layout", {}),
        ("dtype", {}), ("status", {}), ("median ms", {"justify": "right"}), ("p10-p90 ms", {"justify": "right"}),
        ("n", {"justify": "right"}), ("err/none", {"justify": "right"}), ("err/ref", {"justify": "right"}),
        ("collectives", {}), ("syncs", {"justify": "right"}), ("note", {"overflow": "fold", "max_width": 48}),
    ):
        table.add_column(col, **kw)
    for r in rows:
        table.add_row(
            str(r.get("idx")), r.get("op"), r.get("direction") or "fwd", r.get("mode"), r.get("backend"), _shape(r), _heads(r),
            f"{r.get('K')}/{r.get('V')}", f"{r.get('lb'):g}", str(r.get("W")), r.get("layout"), r.get("dtype"), _status_cell(r),
            _num(r.get("median_ms"), ".4f"),
            "-" if r.get("p10_ms") is None else f"{r['p10_ms']:.4f}-{r['p90_ms']:.4f}",
            "-" if r.get("n") is None else str(r["n"]),
            _num(r.get("err_vs_none"), ".1e"), _num(r.get("err_vs_reference"), ".1e"),
            _coll(r.get("collectives")) if r.get("measurement_id") else "-",
            "-" if r.get("host_syncs") is None else str(r["host_syncs"]),
            escape(_note(r)),
        )
    return table


def _cell(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return "" if v is None else v


def render_results(rows: Sequence[dict[str, Any]], fmt: Format, *, console: Console, title: str | None = None) -> None:
    """Print the rows as a rich table, CSV (`CSV_FIELDS`) or JSON (every field)."""
    if fmt == Format.table:
        console.print(results_table(rows, title=title))
    elif fmt == Format.csv:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in CSV_FIELDS})
        typer.echo(buf.getvalue(), nl=False)
    else:
        typer.echo(json.dumps(list(rows), default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v), indent=1))
