"""Best of each library: per shape, the fastest run of each library and how far behind the fastest library it is.

Rows in, figure out. The question it answers: at my shape, how far apart are FLA (its Triton path, `fla`; as
dispatched, `fla_dispatch`), FlashQLA (`flash_qla`) and ours? A library is a backend, but our backends (torch,
triton: `kernels.vocabulary.OUR_BACKENDS`) are one library, "ours" (`library`). One heatmap per (B, lb) facet: a row
per shape (T, W) of the mode map, a column per library (`LIBRARY_ORDER` first, then others as they appear). A cell:

- `library` (`meta.kind`): the library's fastest run of any mode at that shape (backend options and repetitions compete;
  an approximate scheme is marked "≈"), named "<mode>" (with its backend label where the library has several:
  "triton · none"; for FLA as dispatched, what its dispatch ran: "ran flash_qla", `dispatched_to`), its time, and
  its ratio to the fastest library's (`vs_fastest`; the fastest says "fastest", a ratio under `TIE` a percentage:
  "+0.09% (a tie)"); the heatmap's z is that ratio;
- `noisy`: the library's fastest run is unreliable (its stop rule did not converge): no ratio, and it is never the
  reference of the others (as the mode map, an unreliable point sets no headline);
- `pending`: no measured run yet, but points still queued or running there (a sweep in progress, or one whose other
  parts were imported): how many, so a library that has not been measured yet is not taken for one that cannot run;
- `skipped` / `failed`: the library has no measured run there, only skipped (failed) points: their reason (error),
  so a peer that cannot run a shape says why on the row where it is missing.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import (
    backend_label,
    base_layout,
    dispatched_to,
    empty_figure,
    facet_values,
    is_exact,
    measured,
    ran_label,
    run_W,
    tokens_label,
    unreliable,
)
from kernels.vocabulary import OUR_BACKENDS

NAME = "libraries"
TITLE = "Best of each library: fastest run per library at each shape, and how far behind the fastest library"
COLUMNS = ("op", "direction", "lb", "B", "T", "W", "library", "kind", "best_mode", "best_backend", "dispatched_to", "best_id",
           "best_ms", "p10_ms", "p90_ms", "n", "exact", "vs_fastest", "fastest", "why")  # fmt: skip
OURS = "ours"
LIBRARY_ORDER = (OURS, "fla", "fla_dispatch", "flash_qla")
KINDS = ("library", "noisy", "pending", "skipped", "failed")
GREY = {"noisy": "#9e9e9e", "pending": "#e8e8f4", "skipped": "#cfcfcf", "failed": "#e6a1a1"}
PENDING = ("queued", "running")
RATIO_COLORS = [[0.0, "#1a9850"], [0.5, "#fee08b"], [1.0, "#d73027"]]  # fastest green ... RATIO_CAP x or slower red
RATIO_CAP = 4.0
APPROX_MARK = "≈"
WRAP = 34  # characters per line of a reason in a cell (two lines; the hover holds it whole)
TIE = 1.005  # a ratio to the fastest below this prints as a percentage ("+0.09% (a tie)"), not as "1.00× slower"


def library(row: dict[str, Any]) -> str:
    """The library a row's backend belongs to: "ours" for our backends, else the backend's own name."""
    backend = str(row.get("backend"))
    return OURS if backend in OUR_BACKENDS else backend


def libraries(rows: list[dict[str, Any]]) -> list[str]:
    """The libraries of `rows`: LIBRARY_ORDER's first, then the others in order of appearance."""
    present = list(dict.fromkeys(library(r) for r in rows))
    return [x for x in LIBRARY_ORDER if x in present] + [x for x in present if x not in LIBRARY_ORDER]


def _shape(r: dict[str, Any]) -> tuple[Any, ...]:
    return r.get("op"), r.get("direction"), r["lb"], r["B"], r["T"], run_W(r)


def _first_reason(rows: list[dict[str, Any]], key: str) -> str:
    """The most frequent reason (error's last line) of `rows`, with how many others there are."""
    texts = [((r.get(key) or "").strip().splitlines() or ["(none recorded)"])[-1] for r in rows]
    counts: dict[str, int] = defaultdict(int)
    for t in texts:
        counts[t] += 1
    top = max(counts, key=lambda t: (counts[t], -texts.index(t)))
    return top if len(counts) == 1 else f"{top} (and {len(counts) - 1} other reason(s))"


def _cell(lib: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One library at one shape: its fastest run, or why it has none."""
    done = measured(rows)
    pending = [r for r in rows if r.get("status") in PENDING]
    if not done and pending:
        state = "running" if any(r.get("status") == "running" for r in pending) else "queued"
        return {"library": lib, "kind": "pending", "why": f"{len(pending)} {state}: not measured yet"}
    if not done:
        skipped = [r for r in rows if r.get("status") == "skipped"]
        failed = [r for r in rows if r.get("status") == "failed"]
        if not skipped and not failed:
            return {}
        kind = "skipped" if skipped else "failed"
        return {"library": lib, "kind": kind, "why": _first_reason(skipped or failed, "reason" if skipped else "error")}
    win = min(done, key=lambda r: r["median_ms"])
    why = unreliable(win)
    return {"library": lib, "kind": "noisy" if why else "library", "why": why, "best_mode": win["mode"],
            "best_backend": backend_label(win), "dispatched_to": dispatched_to(win), "best_id": win.get("id"),
            "best_ms": win["median_ms"],
            "p10_ms": win.get("p10_ms"), "p90_ms": win.get("p90_ms"), "n": win.get("n"), "exact": is_exact(win)}  # fmt: skip


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (shape, library) that has any point there; `vs_fastest` over the fastest reliable library."""
    by_cell: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("T") is not None and r.get("B") is not None and r.get("lb") is not None:
            by_cell[_shape(r)][library(r)].append(r)
    order = libraries(rows)
    out = []
    for shape in sorted(by_cell, key=lambda k: tuple(map(str, k[:2])) + k[2:]):
        cells = [c for lib in order if lib in by_cell[shape] and (c := _cell(lib, by_cell[shape][lib]))]
        ref = min((c["best_ms"] for c in cells if c["kind"] == "library"), default=None)
        for c in cells:
            ratio = c["best_ms"] / ref if c["kind"] == "library" and ref else None
            out.append({**dict(zip(("op", "direction", "lb", "B", "T", "W"), shape, strict=True)), **c,
                        "vs_fastest": ratio, "fastest": ratio == 1.0})  # fmt: skip
    return out


def _label(c: dict[str, Any]) -> str:
    if c["kind"] in ("pending", "skipped", "failed"):
        lines = textwrap.wrap(c["why"], WRAP)
        return "<br>".join([f"<b>{c['kind']}</b>", *lines[:2]]) + ("…" if len(lines) > 2 else "")
    who = c["best_mode"] if c["best_backend"] == c["library"] else f"{c['best_backend']} · {c['best_mode']}"
    if len(who) > WRAP:  # a long backend label ("fla_dispatch+bypass_hopper_guard") would run past the cell
        who = who.replace(" · ", "<br>· ", 1)
    mark = "" if c["exact"] else f" {APPROX_MARK}"
    ran = f"<br>ran {c['dispatched_to']}" if c.get("dispatched_to") else ""  # what FLA's dispatch ran, a line of its own
    if c["kind"] == "noisy":
        return f"<b>noisy</b><br>{who}{mark} {c['best_ms']:.3g} ms{ran}"
    return f"<b>{who}</b>{mark}{ran}<br>{c['best_ms']:.3g} ms<br>{behind(c)}"


def behind(c: dict[str, Any]) -> str:
    """How far a measured library cell is behind the fastest library: "fastest", "1.35× slower", or within `TIE` a
    percentage ("+0.09% (a tie)"), which "1.00× slower" would hide."""
    if c["fastest"]:
        return "fastest"
    if c["vs_fastest"] < TIE:
        return f"+{100 * (c['vs_fastest'] - 1):.1g}% (a tie)"
    return f"{c['vs_fastest']:.2f}× slower"


def _hover(c: dict[str, Any]) -> str:
    where = f"T={c['T']} W={c['W']} B={c['B']} lb={c['lb']:g}"
    if c["kind"] in ("pending", "skipped", "failed"):
        return f"<b>{c['library']}</b> at {where}: {c['kind']}<br>{c['why']}"
    spread = "" if c["p10_ms"] is None else f" (p10–p90 {c['p10_ms']:.4g}–{c['p90_ms']:.4g})"
    lines = [f"<b>{c['library']}</b> at {where}: {c['best_mode']} ({ran_label(c, c['best_backend'])})",
             f"{c['best_ms']:.4g} ms{spread}, n={c['n']}"]  # fmt: skip
    if c["kind"] == "noisy":
        lines.append(f"unreliable: {c['why']} (not compared)")
    else:
        lines.append("the fastest library here" if c["fastest"] else f"{c['vs_fastest']:.4g}× the fastest library's time")
    if not c["exact"]:
        lines.append(f"{APPROX_MARK} an approximate scheme (within its tolerance)")
    return "<br>".join(lines)


def _trace(
    kind: str, facet: dict[tuple[str, str], dict[str, Any]], xs: list[str], ys: list[str], *, scale: bool, **trace: Any
) -> go.Heatmap:
    grid = [[c if (c := facet.get((y, x))) and c["kind"] == kind else None for x in xs] for y in ys]
    if kind == "library":
        z = [[None if c is None else min(c["vs_fastest"], RATIO_CAP) for c in r] for r in grid]
        colors: dict[str, Any] = {"colorscale": RATIO_COLORS, "zmin": 1.0, "zmax": RATIO_CAP, "showscale": scale,
                                  "colorbar": {"title": {"text": "× fastest"}, "len": 0.6}}  # fmt: skip
    else:
        z = [[None if c is None else 1 for c in r] for r in grid]
        colors = {"colorscale": [[0, GREY[kind]], [1, GREY[kind]]], "showscale": False}
    return go.Heatmap(
        x=xs, y=ys, z=z, text=[["" if c is None else _label(c) for c in r] for r in grid], texttemplate="%{text}",
        textfont={"size": 11}, customdata=[[["", None] if c is None else [_hover(c), c.get("best_id")] for c in r] for r in grid],
        hovertemplate="%{customdata[0]}<extra></extra>", hoverongaps=False, xgap=2, ygap=2, **colors, **trace,
    )  # fmt: skip


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE)
    lbs, Bs = facet_values(table, "lb"), facet_values(table, "B")
    xs = libraries(rows)
    shapes = sorted({(c["W"], c["T"]) for c in table})
    ys = [f"T={tokens_label(T)} · W={W}" for W, T in shapes]
    titles = [" · ".join(t for t in (f"B={B}" if len(Bs) > 1 else "", f"lb={lb:g}" if len(lbs) > 1 else "") if t) or " "
              for B in Bs for lb in lbs]  # fmt: skip
    fig = make_subplots(rows=len(Bs), cols=len(lbs), subplot_titles=titles, horizontal_spacing=0.08,
                        vertical_spacing=0.12 if len(Bs) > 1 else 0.0)  # fmt: skip
    for i, B in enumerate(Bs, start=1):
        for j, lb in enumerate(lbs, start=1):
            facet = {
                (f"T={tokens_label(c['T'])} · W={c['W']}", c["library"]): c for c in table if c["B"] == B and c["lb"] == lb
            }
            for kind in KINDS:
                if any(c["kind"] == kind for c in facet.values()):
                    fig.add_trace(_trace(kind, facet, xs, ys, scale=(i, j) == (1, 1), name=kind, showlegend=False,
                                         meta={"kind": kind, "B": B, "lb": lb}), row=i, col=j)  # fmt: skip
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=xs, side="top")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=ys, autorange="reversed")
    height = max(260, len(Bs) * (70 * len(ys) + 60) + 80)
    return base_layout(fig, TITLE, height=height)
