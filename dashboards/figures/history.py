"""Per benchmark key, its median latency across nightly runs, with regression verdicts marked.

Rows in (`dashboards.data.history_rows`: one row per (key, sweep) with the verdict of the regression run that used
that sweep, if any), figure out. One line per key (`meta.kind == "history"`, `meta.mode` its mode), p10–p90 as
error bars; verdicts other than SAME are drawn on top, one trace per verdict (`meta.kind == "verdict"`): SLOW as a
red triangle, FAST green, CHANGED (a deterministic signal moved) orange, INCONCLUSIVE grey. A night whose
measurement is unreliable (its stop rule did not converge) is an open marker, with why in the hover and the CSV.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go

from dashboards.figures.common import base_layout, empty_figure, ms_ticks

NAME = "history"
TITLE = "Nightly history per benchmark key"
COLUMNS = ("key", "mode", "device_name", "sweep_id", "sweep_name", "at", "median_ms", "p10_ms", "p90_ms", "verdict",
           "ratio", "q_value", "run_id", "baseline_ref", "unreliable")
VERDICT_STYLE = {
    "SLOW": {"symbol": "triangle-up", "color": "#d62728"},
    "FAST": {"symbol": "triangle-down", "color": "#2ca02c"},
    "CHANGED": {"symbol": "diamond", "color": "#ff7f0e"},
    "INCONCLUSIVE": {"symbol": "circle-open", "color": "#7f7f7f"},
}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [{c: r.get(c) for c in COLUMNS} for r in rows if r.get("median_ms") is not None]
    out.sort(key=lambda r: (r["key"], str(r["at"]), r["sweep_id"] or 0))
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no nightly runs yet")
    fig = go.Figure()
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in table:
        series[r["key"]].append(r)
    for n, (key, pts) in enumerate(sorted(series.items())):
        fig.add_trace(go.Scatter(
            x=[p["at"] for p in pts], y=[p["median_ms"] for p in pts], name=key, mode="lines+markers",
            line={"color": _PALETTE[n % len(_PALETTE)]},
            marker={"symbol": ["circle-open" if p["unreliable"] else "circle" for p in pts], "size": 8},
            error_y={"type": "data", "symmetric": False, "thickness": 1, "width": 2,
                     "array": [(p["p90_ms"] - p["median_ms"]) if p["p90_ms"] is not None else 0 for p in pts],
                     "arrayminus": [(p["median_ms"] - p["p10_ms"]) if p["p10_ms"] is not None else 0 for p in pts]},
            customdata=[[p["sweep_id"], p["sweep_name"], p["verdict"] or "—",
                         f"<br><b>unreliable</b>: {p['unreliable']}" if p["unreliable"] else ""] for p in pts],
            hovertemplate=f"{key}<br>%{{x}}<br>%{{y:.4g}} ms<br>sweep %{{customdata[0]}} %{{customdata[1]}}"
                          "<br>verdict %{customdata[2]}%{customdata[3]}<extra></extra>",
            meta={"key": key, "mode": pts[0]["mode"], "kind": "history"},
        ))
    for verdict, style in VERDICT_STYLE.items():
        marks = [r for r in table if r["verdict"] == verdict]
        if marks:
            fig.add_trace(go.Scatter(
                x=[m["at"] for m in marks], y=[m["median_ms"] for m in marks], name=verdict, mode="markers",
                marker={**style, "size": 15, "line": {"width": 1, "color": "black"}},
                customdata=[[m["key"], m["ratio"], m["q_value"], m["baseline_ref"]] for m in marks],
                hovertemplate=f"{verdict}<br>%{{customdata[0]}}<br>ratio %{{customdata[1]:.3f}} q %{{customdata[2]:.2g}}"
                              "<br>baseline %{customdata[3]}<extra></extra>",
                meta={"verdict": verdict, "kind": "verdict"},
            ))
    fig.update_xaxes(title_text="run")
    fig.update_yaxes(type="log", title_text="median ms", **ms_ticks(v for r in table for v in (r["median_ms"], r["p10_ms"], r["p90_ms"])))
    base_layout(fig, TITLE, height=520)
    fig.update_layout(legend={"title": {"text": "key"}})
    return fig
