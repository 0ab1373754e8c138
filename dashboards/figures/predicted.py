"""The scaling model held against the measurements: predicted against measured step time per point and scheme, and
the error, one column per topology: one for the points on one host (titled ONE_HOST; W, hence the ranks per host,
varies along the error row's x axis), one per multi-host topology, titled by its label (`common.topology_tag`,
"2x2 loopback+tcp/lo").

Rows in, figure out. The prediction is `dashboards.scaling_model.held_against`: kernel rates fitted on the rows' own
W=1 `none` points (per op, backend, dtype, H, K, V, direction), links from the `cpbench bench comm` JSON that
CPBENCH_COMM_PARAMS names (else the assumed `DEFAULT_PARAMS`). Top row: predicted ms (y) against measured ms (x),
log-log, one trace per mode (`meta.kind == "measured"`, plotly `ids` = point ids), and the y = x line
(`meta.kind == "ideal"`); bottom row: the error predicted / measured - 1 in percent against W, per point. Points
the model does not cover (warmup_correct, a family without a W=1 `none`) are left out and counted in the title.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import (
    backend_label,
    backend_labels,
    backend_marker,
    base_layout,
    empty_figure,
    mode_color,
    mode_rank,
    series_key,
    series_name,
    topology_tag,
)
from dashboards.links import load_params
from dashboards.scaling_model import HELD_COLUMNS, held_against

NAME = "predicted"
TITLE = "Scaling model vs measured: predicted step time against measured (top) and its error (bottom), per topology"
COLUMNS = (*HELD_COLUMNS, "facet", "backend_label")
ONE_HOST = "1 host"  # the column of every one-host point


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every finished point with a prediction (`held_against` with the configured links), by topology, mode, W."""
    params, _, _ = load_params()
    labels = {r.get("id"): backend_label(r) for r in rows}
    table = [
        {**r, "facet": topology_tag(r) or ONE_HOST, "backend_label": labels.get(r["id"], r["backend"])}
        for r in held_against(rows, params)
        if r["predicted_ms"] is not None
    ]
    return sorted(table, key=lambda r: (r["hosts"], r["facet"], mode_rank(r["mode"]), r["W"], r["T"], r["id"] or 0))


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "nothing to predict: no finished point with a W=1 `none` of its shape")
    facets = list(dict.fromkeys(r["facet"] for r in table))
    fig = make_subplots(rows=2, cols=len(facets), subplot_titles=facets, horizontal_spacing=0.05, vertical_spacing=0.12)
    shown: set[str] = set()
    labels = backend_labels(table)
    for j, label in enumerate(facets, start=1):
        cell = [r for r in table if r["facet"] == label]
        for mode, backend in sorted({(r["mode"], r["backend_label"]) for r in cell}, key=lambda k: series_key(*k, labels)):
            pts = [r for r in cell if (r["mode"], r["backend_label"]) == (mode, backend)]
            name = series_name(mode, backend, labels)
            hover = [
                [p["T"], p["W"], p["compute_ms"], p["comm_ms"], 100 * p["error"], p["median_ms"], p["predicted_ms"]]
                for p in pts
            ]
            common = {
                "name": name,
                "legendgroup": name,
                "ids": [str(p["id"]) for p in pts],
                "customdata": hover,
                "marker": {"color": mode_color(mode), "size": 8, "symbol": backend_marker("circle", backend, labels)},
                "mode": "markers",
            }
            text = (
                f"{name} · {label}<br>T=%{{customdata[0]}} W=%{{customdata[1]}}<br>measured %{{x:.4g}} ms"
                "<br>predicted %{y:.4g} ms (compute %{customdata[2]:.3g} + comm %{customdata[3]:.3g})"
                "<br>error %{customdata[4]:+.1f}%<extra></extra>"
            )
            fig.add_trace(
                go.Scatter(
                    x=[p["median_ms"] for p in pts],
                    y=[p["predicted_ms"] for p in pts],
                    showlegend=name not in shown,
                    hovertemplate=text,
                    meta={"mode": mode, "backend": backend, "kind": "measured", "quantity": "ms", "topology": label},
                    **common,
                ),
                row=1,
                col=j,
            )
            fig.add_trace(
                go.Scatter(
                    x=[p["W"] for p in pts],
                    y=[100 * p["error"] for p in pts],
                    showlegend=False,
                    hovertemplate=text,
                    meta={"mode": mode, "backend": backend, "kind": "measured", "quantity": "error", "topology": label},
                    **common,
                ),
                row=2,
                col=j,
            )
            shown.add(name)
        ms = [v for r in cell for v in (r["median_ms"], r["predicted_ms"]) if v and v > 0]
        lo, hi = min(ms), max(ms)
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="predicted = measured",
                showlegend=False,
                hoverinfo="skip",
                line={"color": "#bbbbbb", "dash": "dot", "width": 1},
                meta={"kind": "ideal", "topology": label},
            ),
            row=1,
            col=j,
        )
        fig.add_hline(y=0, line={"color": "#bbbbbb", "dash": "dot", "width": 1}, row=2, col=j)
    fig.update_xaxes(type="log", row=1)
    fig.update_yaxes(type="log", row=1)
    fig.update_xaxes(title_text="measured ms", row=1)
    fig.update_xaxes(type="log", title_text="CP size W", row=2)
    fig.update_yaxes(title_text="predicted ms", row=1, col=1)
    fig.update_yaxes(title_text="error % (predicted / measured - 1)", row=2, col=1)
    left = sum(1 for r in rows if r.get("status", "done") == "done" and r.get("median_ms")) - len(table)
    note = f" ({left} finished point{'s' if left != 1 else ''} not predicted)" if left else ""
    return base_layout(fig, TITLE + note, height=640)
