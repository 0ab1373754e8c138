"""Tuning trials: every config tried per kernel and shape key, timed relative to the best of its key.

Rows in (tuning trials as `dashboards.data.tuning_rows` gives them), figure out. x is the trial's order within its
(kernel, key, device), y its median over the best valid median of that key (1.0 = the winner), log scale. One trace
per kernel, named after it (`meta.kind == "trials"`); configs that were invalid, disqualified or failed have no
time: they are drawn apart from the timed ones, as crosses in a lane of their own under the chart (one "rejected"
trace on the second y axis, `yaxis2`, labelled "rejected"), never at a timed height; the chosen config of each key
is ringed ("chosen" trace). Trials are counted in whole numbers: the x ticks are integers.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import base_layout, empty_figure

NAME = "tuning"
TITLE = "Tuning trials: median relative to the best config of each key"
COLUMNS = ("kernel", "key", "device_name", "trial", "strategy", "rung", "status", "median_ms", "rel_to_best", "chosen",
           "config", "error")
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["kernel"], r["key_str"], r.get("device_name") or "")].append(r)
    out = []
    for (kernel, key, device), trials in sorted(groups.items()):
        trials.sort(key=lambda r: (r.get("created_at") or "", r.get("id") or 0))
        valid = [t["median_ms"] for t in trials if t["status"] == "ok" and t.get("median_ms")]
        best = min(valid) if valid else None
        for n, t in enumerate(trials, start=1):
            ok = t["status"] == "ok" and t.get("median_ms") and best
            out.append({
                "kernel": kernel, "key": key, "device_name": device, "trial": n, "strategy": t.get("strategy"),
                "rung": t.get("rung"), "status": t["status"], "median_ms": t.get("median_ms"),
                "rel_to_best": t["median_ms"] / best if ok else None, "chosen": bool(t.get("chosen")),
                "config": t.get("config"), "error": t.get("error"),
            })
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no tuning trials yet")
    rejected = [r for r in table if r["status"] != "ok"]
    fig = make_subplots(rows=2 if rejected else 1, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[0.85, 0.15] if rejected else None)
    kernels = sorted({r["kernel"] for r in table})
    for k, kernel in enumerate(kernels):
        pts = [r for r in table if r["kernel"] == kernel and r["rel_to_best"] is not None]
        fig.add_trace(go.Scatter(
            x=[p["trial"] for p in pts], y=[p["rel_to_best"] for p in pts], name=kernel, mode="markers",
            marker={"color": _PALETTE[k % len(_PALETTE)], "size": 7, "opacity": 0.8},
            customdata=[[p["key"], json.dumps(p["config"]), p["median_ms"], p["strategy"], p["rung"]] for p in pts],
            hovertemplate=f"{kernel}<br>%{{customdata[0]}}<br>%{{customdata[1]}}<br>%{{customdata[2]:.4g}} ms "
                          "(×%{y:.3f} of best)<br>%{customdata[3]} rung %{customdata[4]}<extra></extra>",
            meta={"kernel": kernel, "kind": "trials"},
        ), row=1, col=1)
    if rejected:
        fig.add_trace(go.Scatter(
            x=[p["trial"] for p in rejected], y=["rejected"] * len(rejected), name="rejected", mode="markers",
            marker={"symbol": "x", "color": "#444", "size": 8},
            customdata=[[p["kernel"], p["key"], p["status"], (p["error"] or "")[:120], json.dumps(p["config"])]
                        for p in rejected],
            hovertemplate="%{customdata[0]} %{customdata[1]}<br>%{customdata[2]}: %{customdata[3]}<br>"
                          "%{customdata[4]}<extra></extra>",
            meta={"kind": "rejected"},
        ), row=2, col=1)
    chosen = [r for r in table if r["chosen"] and r["rel_to_best"] is not None]
    if chosen:
        fig.add_trace(go.Scatter(
            x=[p["trial"] for p in chosen], y=[p["rel_to_best"] for p in chosen], name="chosen", mode="markers",
            marker={"symbol": "circle-open", "color": "black", "size": 14, "line": {"width": 2}}, hoverinfo="skip",
            meta={"kind": "chosen"},
        ), row=1, col=1)
    last = max(r["trial"] for r in table)
    fig.update_xaxes(tick0=1, dtick=max(1, math.ceil(last / 12)), tickformat="d", range=[0.5, last + 0.5])
    fig.update_xaxes(title_text="trial (order within its kernel and key)", row=2 if rejected else 1, col=1)
    fig.update_yaxes(type="log", title_text="median / best median", row=1, col=1)
    if rejected:
        fig.update_yaxes(type="category", title_text="", row=2, col=1)
    base_layout(fig, TITLE, height=460)
    fig.update_layout(legend={"title": {"text": "kernel"}})
    return fig
