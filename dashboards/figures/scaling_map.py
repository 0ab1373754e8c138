"""The predicted best CP scheme per (T, W, hosts): a heatmap per host count (x: CP size W, y: sequence length T),
each cell named after the fastest scheme with its predicted ms (the /scaling page).

Cells in, figure out: the cells are `dashboards.scaling_model.best_schemes` dicts (T, W, hosts, ranks_per_host,
best, best_ms, ms per scheme). A cell's colour is its best scheme's (`common.mode_color`); `text` holds
"<best><br><ms> ms"; `meta.kind == "best"`, `meta.hosts`; `customdata` every scheme's ms for the hover.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import base_layout, empty_figure, facet_values, mode_color, sort_modes, tokens_label

NAME = "scaling_map"
TITLE = "Predicted fastest CP scheme per sequence length T and CP size W, one panel per number of hosts"
COLUMNS = ("T", "W", "hosts", "ranks_per_host", "best", "best_ms", "ms")


def frame(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in cells if c.get("best")]


def _hover(c: dict[str, Any]) -> str:
    return "<br>".join(f"{m}: {ms:.4g} ms" for m, ms in sorted(c["ms"].items(), key=lambda kv: kv[1]))


def figure(cells: list[dict[str, Any]]) -> go.Figure:
    table = frame(cells)
    if not table:
        return empty_figure(TITLE, "no cell to predict")
    hosts = facet_values(table, "hosts")
    modes = sort_modes(c["best"] for c in table)
    Ts = facet_values(table, "T")
    fig = make_subplots(
        rows=1,
        cols=len(hosts),
        subplot_titles=[f"{h} host{'s' if h > 1 else ''}" for h in hosts],
        horizontal_spacing=0.04,
        shared_yaxes=True,
    )
    scale = (
        [[i / max(1, len(modes) - 1), mode_color(m)] for i, m in enumerate(modes)]
        if len(modes) > 1
        else [[0, mode_color(modes[0])], [1, mode_color(modes[0])]]
    )
    for j, h in enumerate(hosts, start=1):
        mine = [c for c in table if c["hosts"] == h]
        Ws = facet_values(mine, "W")
        at = {(c["T"], c["W"]): c for c in mine}
        x = [str(W) for W in Ws]
        y = [tokens_label(T) for T in Ts]
        z = [[modes.index(at[(T, W)]["best"]) if (T, W) in at else None for W in Ws] for T in Ts]
        text = [[f"{at[(T, W)]['best']}<br>{at[(T, W)]['best_ms']:.3g} ms" if (T, W) in at else "" for W in Ws] for T in Ts]
        hover = [[_hover(at[(T, W)]) if (T, W) in at else "" for W in Ws] for T in Ts]
        fig.add_trace(
            go.Heatmap(
                x=x,
                y=y,
                z=z,
                text=text,
                customdata=hover,
                texttemplate="%{text}",
                colorscale=scale,
                zmin=0,
                zmax=max(1, len(modes) - 1),
                showscale=False,
                xgap=2,
                ygap=2,
                hovertemplate=f"{h} host(s) · W=%{{x}} · T=%{{y}}<br>%{{customdata}}<extra></extra>",
                meta={"kind": "best", "hosts": h, "modes": modes},
            ),
            row=1,
            col=j,
        )
        fig.update_xaxes(type="category", title_text="CP size W", row=1, col=j)
    fig.update_yaxes(type="category", title_text="T (tokens)", row=1, col=1)
    return base_layout(fig, TITLE, height=140 + 48 * len(Ts))
