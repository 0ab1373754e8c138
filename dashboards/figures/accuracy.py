"""Accuracy vs decay bound: relative L2 error of each mode's output against `none` and the fp32 reference.

Rows in, figure out. `warmup_correct` is the one mode whose error depends on the gate decay (lb): it truncates the
state to its last warmup chunks. The exact modes sit at bf16 noise and serve as the floor. Top row: error vs
`none` on the full shape; bottom row: error vs the fp32 reference on the reduced shape. One trace per mode per row,
named after the mode; each point's hover shows the scheme report (warmup chunks, fallback fraction). An exact 0
(bitwise-equal outputs) is drawn at ZERO_FLOOR; hover and CSV keep the 0.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import base_layout, empty_figure, mode_color, mode_rank, sort_modes

NAME = "accuracy"
TITLE = "Error vs decay bound lb (relative L2)"
COLUMNS = ("mode", "lb", "op", "backend", "B", "T", "H", "K", "V", "W", "dtype", "err_vs_none", "err_vs_reference",
           "report")
_ROWS = (("err_vs_none", "vs none"), ("err_vs_reference", "vs fp32 reference"))
# an error of exactly 0 (bitwise equal outputs) has no place on a log axis: it is drawn at this floor, and the hover
# and the CSV keep the true value
ZERO_FLOOR = 1e-10


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = [r for r in rows if r.get("status", "done") == "done"
            and (r.get("err_vs_none") is not None or r.get("err_vs_reference") is not None)]
    done.sort(key=lambda r: (mode_rank(r["mode"]), r["lb"], r["T"], r["B"], r["W"]))
    return [{c: r.get(c) for c in COLUMNS} for r in done]


def _report_text(report: Any) -> str:
    if not isinstance(report, dict) or not report:
        return ""
    flat = {k: v for k, v in report.items() if isinstance(v, (int, float, str, bool)) and k != "floors"}
    return "<br>" + json.dumps(flat)[:200] if flat else ""


def _drawn(err: float | None) -> float | None:
    if err is None:
        return None
    return max(err, ZERO_FLOOR)


def _shown(err: float | None) -> str:
    return "—" if err is None else ("0 (exact)" if err == 0 else f"{err:.3e}")


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no correctness checks yet")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=[label for _, label in _ROWS],
                        vertical_spacing=0.1)
    for mode in sort_modes(r["mode"] for r in table):
        pts = sorted((r for r in table if r["mode"] == mode), key=lambda r: (r["lb"], r["T"]))
        for i, (col, _label) in enumerate(_ROWS, start=1):
            fig.add_trace(go.Scatter(
                x=[p["lb"] for p in pts], y=[_drawn(p[col]) for p in pts], name=mode, legendgroup=mode,
                showlegend=i == 1, mode="markers+lines" if mode == "warmup_correct" else "markers",
                marker={"color": mode_color(mode), "size": 8 if mode == "warmup_correct" else 6},
                line={"color": mode_color(mode)},
                customdata=[[p["T"], p["B"], p["W"], _report_text(p["report"]), _shown(p[col])] for p in pts],
                hovertemplate=f"{mode}<br>lb=%{{x}} T=%{{customdata[0]}} B=%{{customdata[1]}} W=%{{customdata[2]}}"
                              "<br>rel. L2 %{customdata[4]}%{customdata[3]}<extra></extra>",
                meta={"mode": mode, "kind": "measured", "quantity": col},
            ), row=i, col=1)
    fig.update_xaxes(title_text="decay lower bound lb (g ≥ lb)", row=2)
    fig.update_yaxes(type="log", exponentformat="e")
    return base_layout(fig, TITLE, height=560)
