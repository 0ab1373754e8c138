"""Best-mode map: for each (B, T) cell, the fastest mode, per CP size W (columns) and decay bound lb (rows).

Rows in, figure out. Each cell is a square marker coloured by the winning mode and labelled with its speedup over
`none`; one trace per winning mode per facet, named after the mode. The CSV lists every cell with its runner-up.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import (
    base_layout,
    cp_sizes,
    empty_figure,
    facet_title,
    facet_values,
    in_facet,
    measured,
    mode_color,
    mode_rank,
    single_value_log_range,
)

NAME = "best_mode"
TITLE = "Fastest mode per (B, T)"
COLUMNS = ("W", "lb", "B", "T", "best_mode", "best_ms", "runner_up", "runner_up_ms", "none_ms", "speedup_vs_none",
           "candidates")


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (lb, W, B, T) cell; the fastest run of each mode competes."""
    done = measured(rows)
    out = []
    for lb in facet_values(done, "lb"):
        for W in cp_sizes(done):
            cells: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
            for r in done:
                if in_facet(r, W=W, lb=lb):
                    best = cells[(r["B"], r["T"])]
                    best[r["mode"]] = min(best.get(r["mode"], float("inf")), r["median_ms"])
            for (B, T), by_mode in sorted(cells.items()):
                ranked = sorted(by_mode.items(), key=lambda kv: (kv[1], mode_rank(kv[0])))
                none_ms = by_mode.get("none")
                out.append({
                    "W": W, "lb": lb, "B": B, "T": T, "best_mode": ranked[0][0], "best_ms": ranked[0][1],
                    "runner_up": ranked[1][0] if len(ranked) > 1 else None,
                    "runner_up_ms": ranked[1][1] if len(ranked) > 1 else None,
                    "none_ms": none_ms, "speedup_vs_none": none_ms / ranked[0][1] if none_ms else None,
                    "candidates": len(ranked),
                })
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE)
    lbs, Ws = facet_values(table, "lb"), facet_values(table, "W")
    fig = make_subplots(rows=len(lbs), cols=len(Ws), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[facet_title(W, lb, len(lbs)) for lb in lbs for W in Ws],
                        horizontal_spacing=0.04, vertical_spacing=0.1)
    shown: set[str] = set()
    for i, lb in enumerate(lbs, start=1):
        for j, W in enumerate(Ws, start=1):
            by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for c in table:
                if c["W"] == W and c["lb"] == lb:
                    by_mode[c["best_mode"]].append(c)
            for mode in sorted(by_mode, key=mode_rank):
                cells = by_mode[mode]
                label = ["" if c["speedup_vs_none"] is None else f"{c['speedup_vs_none']:.2f}×" for c in cells]
                fig.add_trace(go.Scatter(
                    x=[c["T"] for c in cells], y=[str(c["B"]) for c in cells], name=mode, legendgroup=mode,
                    showlegend=mode not in shown, mode="markers+text", text=label, textposition="middle center",
                    textfont={"size": 9, "color": "white"},
                    marker={"symbol": "square", "size": 34, "color": mode_color(mode)},
                    customdata=[[c["best_ms"], c["runner_up"] or "—"] for c in cells],
                    hovertemplate=f"{mode} wins<br>B=%{{y}} T=%{{x}}<br>%{{customdata[0]:.4g}} ms"
                                  "<br>runner-up %{customdata[1]}<br>vs none %{text}<extra></extra>",
                    meta={"mode": mode, "W": W, "lb": lb, "kind": "best"},
                ), row=i, col=j)
                shown.add(mode)
    fig.update_xaxes(type="log", range=single_value_log_range(r["T"] for r in table))
    fig.update_yaxes(type="category")
    fig.update_xaxes(title_text="T (tokens)", row=len(lbs))
    fig.update_yaxes(title_text="B", col=1)
    return base_layout(fig, TITLE, height=max(320, 260 * len(lbs)))
