"""Accuracy vs decay bound: relative L2 error of each mode's output against `none` and the fp32 reference.

Rows in, figure out. `warmup_correct` is the one mode whose error depends on the gate decay (lb): it truncates the
state to its last warmup chunks. The exact modes sit at bf16 noise and serve as the floor. Top row: error vs
`none` on the full shape; bottom row: error vs the fp32 reference on the reduced shape. One trace per (mode, backend)
per row, named after the mode ("<mode> · <backend>" when the rows hold several backends: `common.series_name`, a
peer's markers open; each backend's errors are against its own `none`); each point's hover shows the scheme report (warmup chunks, fallback fraction). An exact 0
(bitwise-equal outputs) is drawn on a separate shaded band at the bottom, ticked "exact (0)" (`zero_level`, two
decades under the smallest non-zero error); hover and CSV keep the 0. Modes are spread a little along x (`x_offset`)
so that equal errors do not hide each other; the hover gives the true lb.
"""

from __future__ import annotations

import json
import math
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
    symbol,
)

NAME = "accuracy"
TITLE = "Error vs decay bound lb (relative L2)"
COLUMNS = ("mode", "lb", "op", "backend", "backend_label", "B", "T", "H", "K", "V", "W", "dtype", "err_vs_none", "err_vs_reference",
           "report")
_ROWS = (("err_vs_none", "vs none"), ("err_vs_reference", "vs fp32 reference"))
# an error of exactly 0 (bitwise equal outputs) has no place on a log axis: it is drawn on a band this many decades
# under the smallest non-zero error (ZERO_FLOOR when there is none), ticked "exact (0)"; hover and CSV keep the 0
ZERO_DECADES = 2
ZERO_FLOOR = 1e-10
ZERO_LABEL = "exact (0)"


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = [r for r in rows if r.get("status", "done") == "done"
            and (r.get("err_vs_none") is not None or r.get("err_vs_reference") is not None)]
    done.sort(key=lambda r: (mode_rank(r["mode"]), r["lb"], r["T"], r["B"], r["W"]))
    return [{**{c: r.get(c) for c in COLUMNS}, "backend_label": backend_label(r)} for r in done]


def _report_text(report: Any) -> str:
    if not isinstance(report, dict) or not report:
        return ""
    flat = {k: v for k, v in report.items() if isinstance(v, (int, float, str, bool)) and k != "floors"}
    return "<br>" + json.dumps(flat)[:200] if flat else ""


def zero_level(table: list[dict[str, Any]]) -> float:
    """Where an error of 0 is drawn: ZERO_DECADES decades under the smallest non-zero error, on a whole decade."""
    nonzero = [r[c] for r in table for c, _ in _ROWS if r.get(c)]
    if not nonzero:
        return ZERO_FLOOR
    return 10.0 ** (math.floor(math.log10(min(nonzero))) - ZERO_DECADES)


def x_offset(i: int, n: int, lbs: list[float]) -> float:
    """The x shift of the i-th of n modes: 1.5% of the lb span (or of 1) per mode, centred on the true lb."""
    span = (max(lbs) - min(lbs)) if len(lbs) > 1 else 1.0
    return (i - (n - 1) / 2) * 0.015 * span


def _drawn(err: float | None, zero: float) -> float | None:
    if err is None:
        return None
    return zero if err == 0 else err


def _shown(err: float | None) -> str:
    return "—" if err is None else (ZERO_LABEL if err == 0 else f"{err:.3e}")


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no correctness checks yet")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=[label for _, label in _ROWS],
                        vertical_spacing=0.1)
    zero = zero_level(table)
    labels = backend_labels(table)
    series = sorted({(r["mode"], r["backend_label"]) for r in table}, key=lambda s: series_key(*s, labels))
    modes = list(dict.fromkeys(mode for mode, _ in series))
    lbs = sorted({r["lb"] for r in table})
    for k, (mode, backend) in enumerate(series):
        pts = sorted((r for r in table if (r["mode"], r["backend_label"]) == (mode, backend)), key=lambda r: (r["lb"], r["T"]))
        dx = x_offset(k, len(series), lbs)
        name = series_name(mode, backend, labels)
        for i, (col, _label) in enumerate(_ROWS, start=1):
            fig.add_trace(go.Scatter(
                x=[p["lb"] + dx for p in pts], y=[_drawn(p[col], zero) for p in pts], name=name, legendgroup=name,
                showlegend=i == 1, mode="markers+lines" if mode == "warmup_correct" else "markers",
                marker={"color": mode_color(mode), "size": 8, "opacity": 0.85, "line": {"width": 1, "color": "white"},
                        "symbol": backend_marker(symbol(modes.index(mode)), backend, labels)},
                line={"color": mode_color(mode)},
                customdata=[[p["T"], p["B"], p["W"], _report_text(p["report"]), _shown(p[col]), p["lb"]] for p in pts],
                hovertemplate=f"{name}<br>lb=%{{customdata[5]}} T=%{{customdata[0]}} B=%{{customdata[1]}} W=%{{customdata[2]}}"
                              "<br>rel. L2 %{customdata[4]}%{customdata[3]}<extra></extra>",
                meta={"mode": mode, "backend": backend, "kind": "measured", "quantity": col},
            ), row=i, col=1)
    fig.update_xaxes(title_text="decay lower bound lb (g ≥ lb)", row=2)
    top = max([zero * 10] + [r[c] for r in table for c, _ in _ROWS if r.get(c)])
    decades = list(range(round(math.log10(zero)) + 1, math.ceil(math.log10(top)) + 1))
    fig.update_yaxes(type="log", tickvals=[zero] + [10.0**d for d in decades],
                     ticktext=[ZERO_LABEL] + [f"1e{d}" for d in decades],
                     range=[math.log10(zero) - 0.5, math.log10(top) + 0.3])
    for i in (1, 2):  # the exact-0 band, apart from the measured errors
        fig.add_hrect(y0=zero / 10**0.45, y1=zero * 10**0.45, fillcolor="#e8f4e8", line_width=0, layer="below",
                      row=i, col=1)
    return base_layout(fig, TITLE, height=560)
