"""Host syncs and kernel launches per step, per mode, vs sequence length, faceted by CP size W.

Rows in, figure out. DESIGN.md §2 asks every scheme to show zero host syncs in its steady-state step; this figure is
where a regression shows. One trace per (mode, backend, B) per panel, named after its mode ("<mode> · <backend>" when
the rows hold several backends: `common.series_name`); a facet of W holds only the runs at W (plotly `ids` = point
ids).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from dashboards.figures.common import (
    backend_label,
    backend_labels,
    backend_marker,
    base_layout,
    cp_sizes,
    empty_figure,
    in_facet,
    log_t_axis,
    mode_color,
    mode_rank,
    mode_series,
    per_step_grid,
    series_name,
)

NAME = "syncs"
TITLE = "Host syncs and kernel launches per step"
COLUMNS = ("facet_W", "id", "mode", "W", "op", "backend", "B", "T", "H", "K", "V", "host_syncs", "kernel_launches", "peak_memory_bytes")


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prof = [r for r in rows if r.get("status", "done") == "done" and r.get("host_syncs") is not None]
    out = []
    for W in cp_sizes(prof, none_is_reference=False):
        for r in sorted((r for r in prof if in_facet(r, W=W)), key=lambda r: (mode_rank(r["mode"]), r["B"], r["T"])):
            out.append({**{c: r.get(c) for c in COLUMNS}, "facet_W": W, "backend_label": backend_label(r)})
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no profiles yet")
    fig, Ws = per_step_grid(table)
    labels = backend_labels(table)
    shown: set[str] = set()
    for j, W in enumerate(Ws, start=1):
        for (mode, backend, B), pts in mode_series(r for r in table if r["facet_W"] == W):
            name = series_name(mode, backend, labels)
            for i, col in enumerate(("host_syncs", "kernel_launches"), start=1):
                fig.add_trace(go.Scatter(
                    x=[p["T"] for p in pts], y=[p[col] for p in pts], name=name, legendgroup=name,
                    showlegend=name not in shown and i == 1, mode="lines+markers", line={"color": mode_color(mode)},
                    marker={"symbol": backend_marker("circle", backend, labels)},
                    customdata=[B] * len(pts), ids=[str(p["id"]) for p in pts],
                    hovertemplate=f"{name}<br>B=%{{customdata}} T=%{{x}}<br>{col.replace('_', ' ')} %{{y}}<extra></extra>",
                    meta={"mode": mode, "backend": backend, "B": B, "W": W, "kind": "measured", "quantity": col},
                ), row=i, col=j)
            shown.add(name)
    log_t_axis(fig, table)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="host syncs / step", row=1, col=1)
    fig.update_yaxes(title_text="kernel launches / step", row=2, col=1)
    return base_layout(fig, TITLE, height=560)
