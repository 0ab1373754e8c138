"""Accuracy vs decay bound: relative L2 error of each mode's output against `none` and the fp32 reference.

Rows in, figure out. `warmup_correct` is the one mode whose error depends on the gate decay (lb): it truncates the
state to its last warmup chunks. The exact modes sit at bf16 noise and serve as the floor. Top row: error vs
`none` on the full shape; bottom row: error vs the fp32 reference on the reduced shape; one column per CP size W,
so that runs at W=1 and W=2 are distinct series and never share a column; points across hosts get a column of their
own per topology ("W=4 · 2x2 loopback+tcp/lo": `common.topology_tag`, `meta.topology`). One trace per (mode, backend, W) per row
(`meta.W`), named after the mode ("<mode> · <backend>" when the rows hold several backends: `common.series_name`, a
peer's markers open; each backend's errors are against its own `none`); each point's hover shows the scheme report (warmup chunks, fallback fraction). An exact 0
(bitwise-equal outputs) is drawn on a separate shaded band at the bottom, ticked "exact (0)" (`zero_level`, two
decades under the smallest non-zero error); hover and CSV keep the 0. Every point sits at its true lb; modes differ
by marker symbol (half-transparent), so that equal errors stay visible without any shift along x.

`grad_frame(rows)`: a training step's (fwd+bwd) error of each input gradient vs `none` (the report's
`grad_errors_vs_none`), one row per point: the sweep page's per-gradient table.
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
    run_W,
    series_key,
    series_name,
    symbol,
    topology_tag,
    with_topology,
)

NAME = "accuracy"
TITLE = "Error vs decay bound lb (relative L2)"
COLUMNS = ("mode", "lb", "op", "backend", "backend_label", "B", "T", "H", "K", "V", "W", "topology", "dtype", "err_vs_none",
           "err_vs_reference", "report")
_ROWS = (("err_vs_none", "vs none"), ("err_vs_reference", "vs fp32 reference"))
# an error of exactly 0 (bitwise equal outputs) has no place on a log axis: it is drawn on a band this many decades
# under the smallest non-zero error (ZERO_FLOOR when there is none), ticked "exact (0)"; hover and CSV keep the 0
ZERO_DECADES = 2
ZERO_FLOOR = 1e-10
ZERO_LABEL = "exact (0)"
GRAD_KEY = "grad_errors_vs_none"  # the report's per-gradient errors of a training step (runners.execute)


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = [r for r in rows if r.get("status", "done") == "done"
            and (r.get("err_vs_none") is not None or r.get("err_vs_reference") is not None)]
    done.sort(key=lambda r: (mode_rank(r["mode"]), r["lb"], r["T"], r["B"], r["W"]))
    return [{**{c: r.get(c) for c in COLUMNS}, "backend_label": backend_label(r), "W": run_W(r), "topology": topology_tag(r)}
            for r in done]


def grad_frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per finished point whose report holds its per-gradient errors vs `none`: the point's fields, the gate's
    `err_vs_none` and one key per gradient (the report's names: dq, dk, dv, dg, dbeta), in mode, T, W order."""
    out = []
    for r in rows:
        grads = (r.get("report") or {}).get(GRAD_KEY)
        if r.get("status", "done") == "done" and isinstance(grads, dict) and grads:
            out.append({**{c: r.get(c) for c in ("id", "idx", "mode", "backend", "direction", "T", "W", "lb", "err_vs_none")},
                        **grads})
    return sorted(out, key=lambda r: (mode_rank(r["mode"]), r["T"], r["W"] or 1, r["lb"]))


def grad_names(table: list[dict[str, Any]]) -> list[str]:
    """The gradients a `grad_frame` table holds, in the order the reports list them."""
    fixed = {"id", "idx", "mode", "backend", "direction", "T", "W", "lb", "err_vs_none"}
    return list(dict.fromkeys(k for r in table for k in r if k not in fixed))


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
    Ws = sorted({(r["W"], r["topology"]) for r in table})
    fig = make_subplots(rows=2, cols=len(Ws), shared_xaxes=True, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{label} · {with_topology(f'W={W}', topo)}" if len(Ws) > 1 else label
                                        for _, label in _ROWS for W, topo in Ws],
                        vertical_spacing=0.1)
    zero = zero_level(table)
    labels = backend_labels(table)
    series = sorted({(r["mode"], r["backend_label"]) for r in table}, key=lambda s: series_key(*s, labels))
    modes = list(dict.fromkeys(mode for mode, _ in series))
    shown: set[str] = set()
    for j, (W, topo) in enumerate(Ws, start=1):
        for mode, backend in series:
            pts = sorted((r for r in table if (r["mode"], r["backend_label"], r["W"], r["topology"]) == (mode, backend, W, topo)),
                         key=lambda r: (r["lb"], r["T"]))
            if not pts:
                continue
            name = series_name(mode, backend, labels)
            for i, (col, _label) in enumerate(_ROWS, start=1):
                fig.add_trace(go.Scatter(
                    x=[p["lb"] for p in pts], y=[_drawn(p[col], zero) for p in pts], name=name, legendgroup=name,
                    showlegend=i == 1 and name not in shown, mode="markers+lines" if mode == "warmup_correct" else "markers",
                    marker={"color": mode_color(mode), "size": 9, "opacity": 0.6, "line": {"width": 1, "color": "white"},
                            "symbol": backend_marker(symbol(modes.index(mode)), backend, labels)},
                    line={"color": mode_color(mode)},
                    customdata=[[p["T"], p["B"], p["W"], _report_text(p["report"]), _shown(p[col]), p["lb"]] for p in pts],
                    hovertemplate=f"{name}<br>lb=%{{customdata[5]}} T=%{{customdata[0]}} B=%{{customdata[1]}} W=%{{customdata[2]}}"
                                  "<br>rel. L2 %{customdata[4]}%{customdata[3]}<extra></extra>",
                    meta={"mode": mode, "backend": backend, "W": W, "topology": topo, "kind": "measured", "quantity": col},
                ), row=i, col=j)
            shown.add(name)
    fig.update_xaxes(title_text="decay lower bound lb (g ≥ lb)", row=2)
    top = max([zero * 10] + [r[c] for r in table for c, _ in _ROWS if r.get(c)])
    decades = list(range(round(math.log10(zero)) + 1, math.ceil(math.log10(top)) + 1))
    fig.update_yaxes(type="log", tickvals=[zero] + [10.0**d for d in decades],
                     ticktext=[ZERO_LABEL] + [f"1e{d}" for d in decades],
                     range=[math.log10(zero) - 0.5, math.log10(top) + 0.3])
    for i in (1, 2):  # the exact-0 band, apart from the measured errors
        for j in range(1, len(Ws) + 1):
            fig.add_hrect(y0=zero / 10**0.45, y1=zero * 10**0.45, fillcolor="#e8f4e8", line_width=0, layer="below",
                          row=i, col=j)
    return base_layout(fig, TITLE, height=560)
