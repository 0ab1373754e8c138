"""Latency vs sequence length per mode (log-log), faceted by CP size W (columns) and decay bound lb (rows).
Points across hosts get a column of their own per topology, after the one-host column of their W, titled
"W=4 · 2x2 loopback+tcp/lo" (`common.cp_facets`; CSV `facet_topology`, `meta.topology`; "" on one host).

Rows in, figure out. A facet of W holds only the runs at W: one trace per (mode, backend, B), named after its mode
(plotly `ids` = point ids). Rows of several backends (the page's backend choice "all") share the axes: each trace
is named "<mode> · <backend>" (`common.series_name`; the backend label carries peer options that are set, e.g.
`fla+bypass_hopper_guard`), a peer's markers are open, and `meta.backend` holds the label. `none` (one device) is
also drawn in every other facet as a dashed reference line named REFERENCE_NAME (" · <backend>" added likewise;
`meta.kind == "reference"`, CSV `role` = reference); each point's hover and CSV row carry its speedup over `none` of
the same shape and backend (none over an unreliable `none`, `common.none_medians`); an unreliable run (its stop
rule did not converge) says so and why in its hover and its CSV `unreliable` column.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import (
    REFERENCE_NAME,
    backend_label,
    backend_labels,
    backend_marker,
    base_layout,
    cp_facets,
    empty_figure,
    facet_title,
    facet_values,
    in_facet,
    is_reference,
    measured,
    mode_color,
    mode_rank,
    mode_series,
    ms_ticks,
    none_medians,
    series_name,
    single_value_log_range,
    speedup,
    symbol,
    t_ticks,
)

NAME = "latency"
TITLE = "Latency vs T per mode (median, p10–p90)"
COLUMNS = ("facet_W", "facet_topology", "role", "id", "lb", "mode", "W", "op", "backend", "backend_label", "layout", "B", "T", "H", "K", "V",
           "dtype", "direction", "median_ms", "p10_ms", "p90_ms", "n", "speedup_vs_none", "unreliable")


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per plotted point, in facet, mode, B, T order."""
    done = measured(rows)
    base = none_medians(done)
    out = []
    for lb in facet_values(done, "lb"):
        for W, topo in cp_facets(done):
            pts = [r for r in done if in_facet(r, W=W, lb=lb, topology=topo) or (is_reference(r, W=W) and r["lb"] == lb)]
            for r in sorted(pts, key=lambda r: (mode_rank(r["mode"]), r["B"], r["T"])):
                out.append({**{c: r.get(c) for c in COLUMNS}, "facet_W": W, "facet_topology": topo,
                            "speedup_vs_none": speedup(r, base),
                            "backend_label": backend_label(r),
                            "role": "reference" if is_reference(r, W=W) else "measured"})
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE)
    lbs, facets = facet_values(table, "lb"), sorted({(r["facet_W"], r["facet_topology"]) for r in table})
    Bs, labels = facet_values(table, "B"), backend_labels(measured(rows))
    fig = make_subplots(rows=len(lbs), cols=len(facets), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[facet_title(W, lb, len(lbs), topo) for lb in lbs for W, topo in facets],
                        horizontal_spacing=0.04, vertical_spacing=0.08)
    shown: set[str] = set()
    for i, lb in enumerate(lbs, start=1):
        for j, (W, topo) in enumerate(facets, start=1):
            for role in ("reference", "measured"):
                for (mode, label, B), pts in mode_series(r for r in table if (r["facet_W"], r["facet_topology"]) == (W, topo)
                                                         and r["lb"] == lb and r["role"] == role):
                    name = series_name(REFERENCE_NAME if role == "reference" else mode, label, labels)
                    fig.add_trace(_trace(mode, label, B, pts, Bs, labels, W=W, lb=lb, topology=topo, role=role,
                                         showlegend=name not in shown), row=i, col=j)
                    shown.add(name)
    fig.update_xaxes(type="log", range=single_value_log_range(r["T"] for r in table), **t_ticks(r["T"] for r in table))
    fig.update_yaxes(type="log", **ms_ticks(v for r in table for v in (r["median_ms"], r.get("p10_ms"), r.get("p90_ms"))))
    fig.update_xaxes(title_text="T (tokens)", row=len(lbs))
    fig.update_yaxes(title_text="ms", col=1)
    return base_layout(fig, TITLE, height=max(380, 320 * len(lbs)))


def _trace(mode: str, label: str, B: int, pts: list[dict[str, Any]], Bs: list[int], labels: list[str], *, W: int,
           lb: float, topology: str, role: str, showlegend: bool) -> go.Scatter:
    ref = role == "reference"
    name = series_name(REFERENCE_NAME if ref else mode, label, labels)
    med = [p["median_ms"] for p in pts]
    up = [(p["p90_ms"] - p["median_ms"]) if p.get("p90_ms") is not None else 0.0 for p in pts]
    down = [(p["median_ms"] - p["p10_ms"]) if p.get("p10_ms") is not None else 0.0 for p in pts]
    speed = ["—" if p["speedup_vs_none"] is None else f"{p['speedup_vs_none']:.2f}×" for p in pts]
    return go.Scatter(
        x=[p["T"] for p in pts], y=med, name=name, legendgroup=name, showlegend=showlegend,
        mode="lines" if ref else "lines+markers", ids=[str(p["id"]) for p in pts],
        line={"color": mode_color(mode), "dash": "dash" if ref else ("dot" if mode == "none" else
                                                                     "solid" if labels.index(label) == 0 else "dashdot"),
              "width": 1.5 if ref else 2},
        marker={"symbol": backend_marker(symbol(Bs.index(B)), label, labels), "size": 7}, opacity=0.7 if ref else 1.0,
        error_y={"visible": not ref, "type": "data", "symmetric": False, "array": up, "arrayminus": down, "thickness": 1, "width": 2},
        customdata=[[B, s, f"<br><b>unreliable</b>: {p['unreliable']}" if p.get("unreliable") else ""]
                    for s, p in zip(speed, pts, strict=True)],
        hovertemplate=f"{name}<br>B=%{{customdata[0]}} T=%{{x}}<br>%{{y:.4g}} ms<br>speedup vs none %{{customdata[1]}}"
                      "%{customdata[2]}<extra></extra>",
        meta={"mode": mode, "backend": label, "B": B, "W": W, "lb": lb, "topology": topology, "kind": role},
    )
