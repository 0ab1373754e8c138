"""Scaling per mode: speedup over one device t(1)/t(W) (top row) and parallel efficiency t(1)/(W t(W)) (bottom
row) against the CP size W, one column per sequence length T, measured beside the cost model's prediction.

Rows in, figure out. t(1) is `none` on one device at the same shape, lb and backend. Measured traces, one per
(mode, backend, B, lb), are named after their mode ("<mode> · <backend>" when the rows hold several backends:
`common.series_name`, a peer's markers open; `meta.kind == "measured"`, plotly `ids` = point ids; lb by line dash,
B by marker). Points whose ranks spanned several hosts are traces of their own per topology, named "<mode> · <topology>"
(`common.topology_tag`: "ring · 2x2 loopback+tcp/lo", larger markers, `meta.topology`; "" on one host), after the
one-host traces; their t(1) is the same one-host W=1 `none` of the shape, so that the one-host and the multi-host
points of a W are read off the same axes against the same baseline. A figure of one-host points looks as before.
`dashboards.cost_model.model_speedup` (compute only, collectives left out) is drawn per mode as a thin dashed line
named "<mode> (model)" (`meta.kind == "model"`). The ideal (speedup W, efficiency 1) is a dotted grey line.

No speedup or efficiency is ever taken over an unreliable `none` (its stop rule did not converge: `common.
none_medians` skips it); a CP run that is itself unreliable is kept but drawn hollow and grey-edged, with why in the
hover and its `unreliable` column. With nothing to draw, the placeholder says why (`empty_reason`): no `none` run,
only unreliable ones, or `none` done while the CP points failed or were skipped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.cost_model import model_speedup
from dashboards.figures.common import (
    backend_label,
    backend_labels,
    backend_marker,
    base_layout,
    empty_figure,
    facet_values,
    measured,
    mode_color,
    mode_rank,
    noisy_baselines,
    none_medians,
    run_W,
    series_key,
    series_name,
    speedup,
    symbol,
    topology_tag,
    unreliable,
    with_topology,
)

NAME = "scaling"
TITLE = "Speedup and parallel efficiency vs CP size W: measured (markers) vs cost model (dashed)"
COLUMNS = ("id", "mode", "backend", "backend_label", "op", "direction", "B", "T", "lb", "W", "topology", "median_ms", "none_ms", "speedup", "efficiency",
           "model_speedup", "model_efficiency", "unreliable")
_DASHES = ("solid", "dot", "dashdot", "longdash")
_EDGE = "#9e9e9e"  # the marker edge of an unreliable run


def _why(p: dict[str, Any]) -> str:
    return f"<br><b>unreliable</b>: {p['unreliable']}" if p["unreliable"] else ""


def _window(row: dict[str, Any]) -> int:
    w = ((row.get("params") or {}).get("mode_options") or {}).get("window")
    return w if isinstance(w, int) and w > 0 else 2


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured run of a mode other than `none` whose shape has a `none` baseline."""
    done = measured(rows)
    base = none_medians(done)
    out = []
    for r in sorted(done, key=lambda r: (mode_rank(r["mode"]), r["T"], r["B"], r["lb"], topology_tag(r), run_W(r))):
        s = speedup(r, base)
        if r["mode"] == "none" or s is None:
            continue
        W = run_W(r)
        model = model_speedup(r["mode"], W, T=r["T"] * r["B"], warmup_chunks=_window(r))
        out.append({**{c: r.get(c) for c in ("id", "mode", "backend", "op", "direction", "B", "T", "lb", "median_ms")},
                    "W": W, "topology": topology_tag(r), "backend_label": backend_label(r),
                    "none_ms": r["median_ms"] * s, "speedup": s, "efficiency": s / W,
                    "model_speedup": model, "model_efficiency": None if model is None else model / W,
                    "unreliable": unreliable(r)})
    return out


def empty_reason(rows: list[dict[str, Any]]) -> str:
    """Why `frame(rows)` is empty, in the words the placeholder shows."""
    done = measured(rows)
    if not any(r["mode"] == "none" for r in done):
        return "no run of `none` (the one-device baseline) finished yet"
    if not none_medians(done):
        why = next(iter(noisy_baselines(done).values()))
        return f"no reliable `none` baseline: every `none` run is unreliable ({why})"
    cp = [r for r in rows if r["mode"] != "none"]
    counts = {st: sum(r.get("status") == st for r in cp) for st in ("done", "failed", "skipped", "queued", "running", "cancelled")}
    said = ", ".join(f"{n} {st}" for st, n in counts.items() if n)
    if not counts["done"]:
        return f"`none` is done but no CP point finished: {said or 'the slice holds none'}"
    return f"`none` is done but no finished CP point has a reliable `none` of its shape ({said})"


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, empty_reason(rows))
    Ts, Ws = facet_values(table, "T"), facet_values(table, "W")
    lbs, Bs = facet_values(table, "lb"), facet_values(table, "B")
    labels = backend_labels(measured(rows))
    fig = make_subplots(rows=2, cols=len(Ts), shared_xaxes=True, subplot_titles=[f"T={T}" for T in Ts],
                        horizontal_spacing=0.04, vertical_spacing=0.08)
    shown: set[str] = set()
    for j, T in enumerate(Ts, start=1):
        series: dict[tuple[str, str, int, float, str], list[dict[str, Any]]] = defaultdict(list)
        for r in table:
            if r["T"] == T:
                series[(r["mode"], r["backend_label"], r["B"], r["lb"], r["topology"])].append(r)
        order = sorted(series.items(), key=lambda kv: (kv[0][4], *series_key(kv[0][0], kv[0][1], labels), *kv[0][2:4]))
        for (mode, backend, B, lb, topo), pts in order:
            pts.sort(key=lambda p: p["W"])
            name = with_topology(series_name(mode, backend, labels), topo)
            for i, col in enumerate(("speedup", "efficiency"), start=1):
                fig.add_trace(go.Scatter(
                    x=[p["W"] for p in pts], y=[p[col] for p in pts], name=name, legendgroup=name,
                    showlegend=name not in shown and i == 1, mode="lines+markers", ids=[str(p["id"]) for p in pts],
                    line={"color": mode_color(mode), "dash": _DASHES[lbs.index(lb) % len(_DASHES)]},
                    marker={"symbol": backend_marker(symbol(Bs.index(B)), backend, labels), "size": 11 if topo else 8,
                            "line": {"color": [_EDGE if p["unreliable"] else mode_color(mode) for p in pts], "width": 2}},
                    customdata=[[B, lb, p["median_ms"], p["none_ms"], _why(p)] for p in pts],
                    hovertemplate=f"{name}<br>B=%{{customdata[0]}} T={T} lb=%{{customdata[1]}} W=%{{x}}<br>{col} %{{y:.3f}}"
                                  "<br>%{customdata[2]:.4g} ms vs none %{customdata[3]:.4g} ms%{customdata[4]}<extra></extra>",
                    meta={"mode": mode, "backend": backend, "B": B, "lb": lb, "T": T, "topology": topo, "kind": "measured",
                          "quantity": col},
                ), row=i, col=j)
            shown.add(name)
        for mode in sorted({r["mode"] for r in table if r["T"] == T}, key=mode_rank):
            pts = sorted({r["W"]: r for r in table if r["T"] == T and r["mode"] == mode}.values(), key=lambda p: p["W"])
            if all(p["model_speedup"] is None for p in pts):
                continue
            for i, col in enumerate(("model_speedup", "model_efficiency"), start=1):
                fig.add_trace(go.Scatter(
                    x=[p["W"] for p in pts], y=[p[col] for p in pts], name=f"{mode} (model)", legendgroup=mode,
                    showlegend=False, mode="lines", line={"color": mode_color(mode), "dash": "dash", "width": 1},
                    hovertemplate=f"{mode} model (compute only)<br>W=%{{x}}<br>%{{y:.3f}}<extra></extra>",
                    meta={"mode": mode, "T": T, "kind": "model", "quantity": col.removeprefix("model_")},
                ), row=i, col=j)
        for i, ideal in enumerate(([float(W) for W in Ws], [1.0] * len(Ws)), start=1):
            fig.add_trace(go.Scatter(x=Ws, y=ideal, name="ideal", mode="lines", showlegend=False, hoverinfo="skip",
                                     line={"color": "#bbbbbb", "dash": "dot", "width": 1}, meta={"kind": "ideal"}),
                          row=i, col=j)
    fig.update_xaxes(type="log", tickvals=Ws, ticktext=[str(W) for W in Ws])
    fig.update_xaxes(title_text="CP size W", row=2)
    fig.update_yaxes(title_text="speedup vs none", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="efficiency t(1)/(W·t(W))", row=2, col=1, rangemode="tozero")
    note = " · ".join(f"lb={lb:g}: {_DASHES[k % len(_DASHES)]}" for k, lb in enumerate(lbs)) if len(lbs) > 1 else ""
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=1, y=-0.08, xanchor="right", showarrow=False,
                           font={"size": 11})
    return base_layout(fig, TITLE, height=600)
