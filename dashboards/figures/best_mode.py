"""Mode map: which CP mode to use for a shape, as a heatmap of T (rows, ascending) x CP size W (columns).
Points whose ranks spanned several hosts compete in columns of their own per topology, after the one-host column of
their W ("W=4 · 2x2 loopback+tcp/lo": `common.topology_tag`; CSV `topology`, "" on one host); their speedups are
over the same one-host `none`.

Rows in, figure out. The page slices the rows to one op and direction (and backend, H, K, V, dtype, layout); small
multiples pick lb (columns) and B (rows). Each cell names the fastest EXACT mode at (B, T, W, lb), its speedup over
`none` on one device, the runner-up exact mode and the runner-up's gap (how much slower it is); a "≈" mark says
that an approximate scheme (tail_exchange / warmup_correct within a tolerance, `common.is_exact`) was faster still,
and names it. A cell whose winner or whose `none` baseline is unreliable (its stop rule did not converge:
`common.unreliable`) names no winner and no speedup: it says "noisy" and why (`noisy`; one grey trace per facet,
`meta.kind == "noisy"`). Hover: the winner's p10-p90, sample count n, launch configs and collectives. One heatmap trace per
winning mode per facet (`meta.kind == "best"`), named after the mode; `customdata[...][1]` is the winner's point id.

Rows of several backends (the page's backend choice "all") compete in the same cells: each (mode, backend) is a
candidate, the cell names the (library, mode) of the winner, runner-up and faster approximate scheme as
"<backend> · <mode>" ("flash_qla · warmup_correct 3.10×"; the label carries peer options that are set,
`common.backend_label`, and, for FLA as dispatched, what its dispatch ran: "fla_dispatch · none → flash_qla",
`common.ran_label`), the winner's speedup is over `none` of its own backend, and the traces are per (mode,
backend), named "<mode> · <backend>" (`meta.backend`). How far apart the libraries are at each shape is the
`libraries` figure's.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import (
    backend_label,
    backend_labels,
    base_layout,
    baseline_key,
    empty_figure,
    facet_values,
    is_exact,
    measured,
    mode_color,
    mode_rank,
    noisy_baselines,
    none_medians,
    ran_label,
    run_W,
    series_key,
    series_name,
    shows_backend,
    speedup,
    topology_tag,
    unreliable,
    with_topology,
)

NAME = "best_mode"
TITLE = "Mode map: fastest exact mode per T × W (speedup over one device, runner-up and gap)"
COLUMNS = ("op", "direction", "lb", "B", "T", "W", "topology", "best_mode", "best_backend", "best", "best_id", "best_ms", "p10_ms", "p90_ms", "n",
           "speedup_vs_none", "noisy", "exact", "runner_up", "runner_up_ms", "gap", "faster_approx", "faster_approx_ms", "candidates",
           "configs", "collectives")
APPROX_MARK = "≈"
NOISY = "noisy"
NOISY_COLOR = "#9e9e9e"


def _fastest_per_mode(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fastest run of each (mode, backend) (repetitions and seeds compete), fastest first."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        k = (r["mode"], backend_label(r))
        if k not in best or r["median_ms"] < best[k]["median_ms"]:
            best[k] = r
    return sorted(best.values(), key=lambda r: (r["median_ms"], mode_rank(r["mode"])))


def _who(r: dict[str, Any] | None, named: bool) -> str | None:
    """A candidate as the map names it: its mode, after its backend label ("flash_qla · warmup_correct") when `named`."""
    if r is None:
        return None
    return ran_label(r, f"{backend_label(r)} · {r['mode']}" if named else r["mode"])


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (op, direction, lb, B, T, W, topology) cell that has at least one measured run."""
    done = measured(rows)
    base, noisy_base = none_medians(done), noisy_baselines(done)
    named = shows_backend(backend_labels(done))
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in done:
        cells[(r.get("op"), r.get("direction"), r["lb"], r["B"], r["T"], run_W(r), topology_tag(r))].append(r)
    out = []
    for (op, direction, lb, B, T, W, topo), cands in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0][:2])) + kv[0][2:]):
        ranked = _fastest_per_mode(cands)
        exact = [r for r in ranked if is_exact(r)]
        win = exact[0] if exact else ranked[0]
        runner = exact[1] if len(exact) > 1 else None
        approx = ranked[0] if exact and not is_exact(ranked[0]) else None
        noisy = _noisy(win, noisy_base)
        out.append({
            "op": op, "direction": direction, "lb": lb, "B": B, "T": T, "W": W, "topology": topo,
            "best_mode": win["mode"], "best_backend": backend_label(win), "best": _who(win, named),
            "best_id": win.get("id"), "best_ms": win["median_ms"],
            "p10_ms": win.get("p10_ms"), "p90_ms": win.get("p90_ms"), "n": win.get("n"),
            "speedup_vs_none": None if noisy else speedup(win, base), "noisy": noisy, "exact": bool(exact),
            "runner_up": _who(runner, named), "runner_up_ms": runner["median_ms"] if runner else None,
            "gap": runner["median_ms"] / win["median_ms"] - 1.0 if runner else None,
            "faster_approx": _who(approx, named),
            "faster_approx_ms": approx["median_ms"] if approx else None,
            "candidates": len(ranked), "configs": win.get("configs"), "collectives": win.get("collectives"),
        })
    return out


def _noisy(win: dict[str, Any], noisy_base: dict[tuple[Any, ...], str]) -> str | None:
    """Why a cell names no winner: its fastest run, or the `none` baseline its speedup would use, is unreliable."""
    if why := unreliable(win):
        return f"winner {win['mode']} ({backend_label(win)}): {why}"
    if why := noisy_base.get(baseline_key(win)):
        return f"baseline none ({backend_label(win)}): {why}"
    return None


def _label(c: dict[str, Any]) -> str:
    if c["noisy"]:
        return f"<b>{NOISY}</b><br>{c['noisy'].split()[0]} unreliable"
    mark = "" if c["exact"] else f" {APPROX_MARK}"
    speed = "" if c["speedup_vs_none"] is None else f" {c['speedup_vs_none']:.2f}×"
    lines = [f"<b>{c['best']}</b>{mark}{speed}"]
    if c["runner_up"]:
        lines.append(f"2nd {c['runner_up']} +{100 * c['gap']:.0f}%")
    if c["faster_approx"]:
        lines.append(f"{APPROX_MARK} {c['faster_approx']} {c['best_ms'] / c['faster_approx_ms']:.2f}×")
    return "<br>".join(lines)


def _hover(c: dict[str, Any]) -> str:
    where = with_topology(f"W={c['W']}", c["topology"])
    if c["noisy"]:
        spread = "" if c["p10_ms"] is None else f" (p10–p90 {c['p10_ms']:.4g}–{c['p90_ms']:.4g})"
        return "<br>".join([f"<b>{NOISY}</b> at B={c['B']} T={c['T']} {where} lb={c['lb']:g}: no winner named",
                            f"fastest {c['best']} {c['best_ms']:.4g} ms{spread}, n={c['n']}",
                            f"unreliable: {c['noisy']}"])
    spread = "" if c["p10_ms"] is None else f" (p10–p90 {c['p10_ms']:.4g}–{c['p90_ms']:.4g})"
    own = f" ({c['best_backend']})" if c["best"] != c["best_mode"] else ""  # its own backend's none
    lines = [f"<b>{c['best']}</b> fastest exact at B={c['B']} T={c['T']} {where} lb={c['lb']:g}",
             f"{c['best_ms']:.4g} ms{spread}, n={c['n']}",
             f"speedup vs none{own}: " + ("—" if c["speedup_vs_none"] is None else f"{c['speedup_vs_none']:.2f}×")]
    if c["runner_up"]:
        lines.append(f"runner-up {c['runner_up']} {c['runner_up_ms']:.4g} ms (+{100 * c['gap']:.1f}%)")
    if c["faster_approx"]:
        lines.append(f"{APPROX_MARK} approximate {c['faster_approx']} faster: {c['faster_approx_ms']:.4g} ms")
    if not c["exact"]:
        lines.append(f"{APPROX_MARK} no exact mode measured here")
    for key in ("collectives", "configs"):
        if c[key]:
            lines.append(f"{key}: {json.dumps(c[key], sort_keys=True)[:160]}")
    return "<br>".join(lines)


def _cells(grid: list[list[dict[str, Any] | None]], xs: list[str], ys: list[str], color: str, **trace: Any) -> go.Heatmap:
    """One heatmap trace of the cells in `grid` (rows T, columns W; None: not this trace's), each labelled and
    hovered, in one colour; `trace` adds the name, legend and meta."""
    return go.Heatmap(
        x=xs, y=ys, z=[[None if c is None else 1 for c in r] for r in grid],
        text=[["" if c is None else _label(c) for c in r] for r in grid], texttemplate="%{text}",
        textfont={"size": 12, "color": "white"},
        customdata=[[["", None] if c is None else [_hover(c), c["best_id"]] for c in r] for r in grid],
        hovertemplate="%{customdata[0]}<extra></extra>", hoverongaps=False,
        colorscale=[[0, color], [1, color]], showscale=False, xgap=2, ygap=2, **trace)


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE)
    lbs, Bs = facet_values(table, "lb"), facet_values(table, "B")
    Ws, Ts = sorted({(c["W"], c["topology"]) for c in table}), facet_values(table, "T")
    xs, ys = [with_topology(f"W={W}", topo) for W, topo in Ws], [f"T={T}" for T in Ts]
    titles = [" · ".join(t for t in (f"B={B}" if len(Bs) > 1 else "", f"lb={lb:g}" if len(lbs) > 1 else "") if t) or " "
              for B in Bs for lb in lbs]
    fig = make_subplots(rows=len(Bs), cols=len(lbs), subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.12 if len(Bs) > 1 else 0.0)
    labels = backend_labels(measured(rows))  # every candidate's, as `frame` names them
    shown: set[str] = set()
    for i, B in enumerate(Bs, start=1):
        for j, lb in enumerate(lbs, start=1):
            facet = {(c["T"], (c["W"], c["topology"])): c for c in table if c["B"] == B and c["lb"] == lb}
            winners = {(c["best_mode"], c["best_backend"]) for c in facet.values() if not c["noisy"]}
            for mode, backend in sorted(winners, key=lambda w: series_key(*w, labels)):
                won = {k: c for k, c in facet.items() if (c["best_mode"], c["best_backend"]) == (mode, backend) and not c["noisy"]}
                name = series_name(mode, backend, labels)
                grid = [[won.get((T, W)) for W in Ws] for T in Ts]
                fig.add_trace(_cells(grid, xs, ys, mode_color(mode), name=name, legendgroup=name, showlegend=name not in shown,
                                     meta={"mode": mode, "backend": backend, "B": B, "lb": lb, "kind": "best"}), row=i, col=j)
                shown.add(name)
            noisy = {k: c for k, c in facet.items() if c["noisy"]}
            if noisy:  # the cells that name no winner: one grey trace, why in the hover
                grid = [[noisy.get((T, W)) for W in Ws] for T in Ts]
                fig.add_trace(_cells(grid, xs, ys, NOISY_COLOR, name=f"{NOISY} (unreliable timing)", legendgroup=NOISY,
                                     showlegend=NOISY not in shown, meta={"B": B, "lb": lb, "kind": "noisy"}), row=i, col=j)
                shown.add(NOISY)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=xs)
    fig.update_xaxes(title_text="CP size", row=len(Bs))
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=ys)
    fig.update_yaxes(title_text="tokens", col=1)
    fig.add_annotation(text=f"{APPROX_MARK}: an approximate scheme (within a tolerance) is faster than the exact "
                            "winner (named, with how much faster) · 2nd +x%: how much slower the runner-up is<br>"
                            f"{NOISY}: the winner or its none baseline did not converge (stopped on max_samples / timeout "
                            "or below min_samples): no winner or speedup named",
                       xref="paper", yref="paper", x=0, y=0, yshift=-52, yanchor="top", showarrow=False,
                       font={"size": 11})
    height = max(300, len(Bs) * (90 * len(Ts) + 60) + 90)
    return base_layout(fig, TITLE, height=height).update_layout(margin={"b": 90})
