"""Communication per mode: collective calls and bytes per rank, measured by the profiler beside the cost model.

Rows in, figure out. Columns facet CP size W; the top row counts collective calls per step, the bottom row their
bytes (log). Measured traces are named after their mode ("<mode> · <backend>" when the rows hold several backends:
`common.series_name`; `meta.kind == "measured"`); the model of `dashboards.cost_model` is drawn as a line named
"<trace name> (model)" (`meta.kind == "model"`). A training step (`direction: fwd+bwd`) profiled per direction
(the profile's `by_direction`) is drawn as its forward (circles, dashed model) and its backward (triangles, dotted
model) apart, each beside the model of that direction; its table rows have `part` "fwd" / "bwd" (`meta.part`), a
step not split has `part` "step" (the model of its direction).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from dashboards.cost_model import comm_cost
from dashboards.figures.common import (
    backend_label,
    backend_labels,
    backend_marker,
    base_layout,
    cp_sizes,
    dtype_bytes,
    empty_figure,
    in_facet,
    log_t_axis,
    mode_color,
    mode_rank,
    mode_series,
    per_step_grid,
    series_name,
)
from kernels.vocabulary import PHASES, TAIL_EXCHANGE_WINDOW_CHUNKS


def _window(opts: dict) -> int:
    w = opts.get("window")
    return w if isinstance(w, int) and w > 0 else TAIL_EXCHANGE_WINDOW_CHUNKS  # the window when a point sets none


NAME = "comm"
TITLE = "Collectives per step: measured (markers) vs cost model (lines); a training step's fwd (●) and bwd (▼) apart"
COLUMNS = ("facet_W", "id", "mode", "W", "op", "backend", "B", "T", "H", "K", "V", "dtype", "part", "measured_calls",
           "model_calls", "measured_bytes", "model_bytes", "measured_by_kind", "model_by_kind")
# part of a step -> (marker symbol, model line dash)
PART_STYLE = {"step": ("circle", "dash"), "fwd": ("circle", "dash"), "bwd": ("triangle-down", "dot")}


def _parts(r: dict[str, Any]) -> list[tuple[str, str, dict[str, int], dict[str, int]]]:
    """(part, model direction, measured calls, measured bytes) of a row: its forward and backward when the profile
    split the step, else the whole step."""
    split = r.get("by_direction") or {}
    if all(d in split for d in PHASES):
        return [(d, d, split[d].get("collectives") or {}, split[d].get("collective_bytes") or {}) for d in PHASES]
    return [("step", r.get("direction") or "fwd", r.get("collectives") or {}, r.get("collective_bytes") or {})]


def frame(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per profiled point (per CP-size facet) and part of its step (`_parts`), with the model's calls and
    bytes beside the measured ones."""
    prof = [r for r in rows if r.get("status", "done") == "done" and r.get("collectives") is not None]
    out = []
    for W in cp_sizes(prof, none_is_reference=False):
        for r in sorted((r for r in prof if in_facet(r, W=W)), key=lambda r: (mode_rank(r["mode"]), r["B"], r["T"])):
            opts = (r.get("params") or {}).get("mode_options") or {}
            model_mode = "true_cp" if r["mode"] == "tail_exchange" and opts.get("fallback") == "true_cp" else r["mode"]
            for part, direction, calls, nbytes in _parts(r):
                model = comm_cost(model_mode, B=r["B"], T=r["T"], H=r["H"], K=r["K"], V=r["V"], W=r["W"] or 1,
                                  dtype_bytes=dtype_bytes(r.get("dtype")), op=r.get("op") or "gdn",
                                  layout=r.get("layout") or "contiguous", lengths=(r.get("params") or {}).get("lengths"),
                                  direction=direction, warmup_chunks=_window(opts))
                out.append({
                    **{c: r.get(c) for c in ("id", "mode", "W", "op", "backend", "B", "T", "H", "K", "V", "dtype")},
                    "facet_W": W, "part": part, "measured_calls": sum(calls.values()), "measured_bytes": sum(nbytes.values()),
                    "model_calls": None if model is None else model.count,
                    "model_bytes": None if model is None else model.total_payload_bytes,
                    "backend_label": backend_label(r), "measured_by_kind": dict(calls),
                    "model_by_kind": None if model is None else dict(model.collectives),
                })
    return out


def figure(rows: list[dict[str, Any]]) -> go.Figure:
    table = frame(rows)
    if not table:
        return empty_figure(TITLE, "no profiles yet")
    fig, Ws = per_step_grid(table)
    labels = backend_labels(table)
    shown: set[str] = set()
    for j, W in enumerate(Ws, start=1):
        for part, (symbol, dash) in PART_STYLE.items():
            for (mode, backend, B), pts in mode_series(r for r in table if r["facet_W"] == W and r["part"] == part):
                name = series_name(mode, backend, labels)
                first = name not in shown
                shown.add(name)
                T = [p["T"] for p in pts]
                what = "" if part == "step" else f" {part}"
                for i, (col, label) in enumerate((("calls", "calls"), ("bytes", "bytes")), start=1):
                    fig.add_trace(go.Scatter(
                        x=T, y=[p[f"measured_{col}"] for p in pts], name=name, legendgroup=name,
                        showlegend=first and i == 1, mode="markers", ids=[str(p["id"]) for p in pts],
                        marker={"color": mode_color(mode), "size": 9,
                                "symbol": backend_marker(symbol, backend, labels)},
                        customdata=[[B, str(p["measured_by_kind"])] for p in pts],
                        hovertemplate=f"{name}{what} measured<br>B=%{{customdata[0]}} T=%{{x}}<br>{label} %{{y:,}}"
                                      "<br>%{customdata[1]}<extra></extra>",
                        meta={"mode": mode, "backend": backend, "B": B, "W": W, "kind": "measured", "quantity": col,
                              "part": part},
                    ), row=i, col=j)
                    model = [p[f"model_{col}"] for p in pts]
                    if any(m is not None for m in model):
                        fig.add_trace(go.Scatter(
                            x=T, y=model, name=f"{name} (model)", legendgroup=name, showlegend=False, mode="lines",
                            line={"color": mode_color(mode), "dash": dash, "width": 1.5},
                            hovertemplate=f"{mode}{what} model<br>T=%{{x}}<br>{label} %{{y:,}}<extra></extra>",
                            meta={"mode": mode, "backend": backend, "B": B, "W": W, "kind": "model", "quantity": col,
                                  "part": part},
                        ), row=i, col=j)
    log_t_axis(fig, table)
    fig.update_yaxes(title_text="collective calls", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(type="log", row=2)
    fig.update_yaxes(title_text="bytes per rank", row=2, col=1)
    return base_layout(fig, TITLE, height=620)
