"""Every sweep figure's facets hold only their own points, read from the figure's JSON (as the browser gets it).

The data is the case that once went wrong: the multi-rank modes also run at W=1 (as in the demo), beside `none` and
warmup_correct, with W in {1, 2, 4} and two lb values. Each trace's subplot title (W=.., lb=.., B=.., T=..) is found
from its axes' domains; each point is identified by its point id (plotly `ids`, or `customdata[..][1]` in the mode
map) and must be a run of that facet with the value drawn. `none` may appear in a facet of another W only as the
labelled dashed reference line (no markers).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from dashboards.cost_model import comm_cost
from dashboards.figures import SWEEP_FIGURES
from dashboards.figures.common import REFERENCE_NAME
from tests.dashboards.seed import model_ms, point

MULTI = ("headwise", "ring", "true_cp")


def rows_all_W() -> list[dict[str, Any]]:
    rng, rows = random.Random(1), []
    for lb in (-1.0, -0.05):
        for T in (256, 512):
            for B in (1, 2):
                runs = [("none", 1), ("warmup_correct", 1)] + [(m, W) for m in MULTI for W in (1, 2, 4)]
                for mode, W in runs:
                    p = point(len(rows), mode=mode, W=W, T=T, B=B, lb=lb)
                    ms = model_ms(p, rng)
                    cost = comm_cost(mode, B=B, T=T, H=4, K=32, V=32, W=W, dtype_bytes=2)
                    assert cost is not None
                    rows.append({**p, "id": 1000 + len(rows), "status": "done", "median_ms": ms, "p10_ms": ms * 0.9,
                                 "p90_ms": ms * 1.1, "n": 10, "collectives": cost.collectives,
                                 "collective_bytes": cost.payload_bytes, "host_syncs": W - 1, "kernel_launches": 3 + W,
                                 "err_vs_none": None if mode == "none" else 1e-6, "err_vs_reference": 2e-6,
                                 "report": {}, "configs": {}})
    return rows


def facet_of(fig: dict[str, Any], trace: dict[str, Any]) -> dict[str, float]:
    """The facet a trace is drawn in, parsed from the subplot title over its axes (empty: the only facet)."""
    lay = fig["layout"]
    xa, ya = trace.get("xaxis", "x"), trace.get("yaxis", "y")
    xd = lay["xaxis" + xa[1:]].get("domain", [0, 1])
    yd = lay["yaxis" + ya[1:]].get("domain", [0, 1])
    titles = [a for a in lay.get("annotations", []) if a.get("xref") == "paper" and abs(a["x"] - (xd[0] + xd[1]) / 2) < 1e-6]
    exact = [a for a in titles if abs(a["y"] - yd[1]) < 1e-6]
    # a grid titled over its top row only (one title per column) titles the whole column
    title = exact[0] if exact else (titles[0] if len(titles) == 1 else None)
    return {} if title is None else {k: float(v) for k, v in re.findall(r"\b(W|lb|B|T)=(-?[\d.]+)", title["text"])}


def belongs(row: dict[str, Any], facet: dict[str, float]) -> bool:
    return all(row[k] == v for k, v in facet.items())


@pytest.mark.parametrize("name", [n for n in SWEEP_FIGURES if n not in ("accuracy", "libraries")])  # libraries: its own test
def test_every_point_in_its_facet(name: str) -> None:
    rows = rows_all_W()
    by_id = {str(r["id"]): r for r in rows}
    fig = json.loads(SWEEP_FIGURES[name].figure(rows).to_json())
    checked = 0
    for trace in fig["data"]:
        meta = trace.get("meta") or {}
        kind = meta.get("kind")
        facet = facet_of(fig, trace)
        if trace["type"] == "heatmap":  # mode map: the cell's winner ran at the cell's W and T, in the facet's B, lb
            for y_label, line in zip(trace["y"], trace["customdata"], strict=True):
                for x_label, (_, pid) in zip(trace["x"], line, strict=True):
                    if pid is None:
                        continue
                    r = by_id[str(pid)]
                    assert (f"W={r['W']}", f"T={r['T']}") == (x_label, y_label), (name, r["key"])
                    assert belongs(r, facet) and r["mode"] == meta["mode"], (name, facet, r["key"])
                    checked += 1
            continue
        if kind not in ("measured", "reference"):
            continue
        assert trace.get("ids"), f"{name}: a {kind} trace without point ids"
        for pid, y in zip(trace["ids"], trace["y"], strict=True):
            r = by_id[pid]
            assert r["mode"] == meta["mode"], (name, r["key"])
            if kind == "reference":
                assert r["mode"] == "none" and r["W"] == 1 and facet.get("W", 1) != 1
                assert trace["name"] == REFERENCE_NAME and trace["line"]["dash"] == "dash" and trace["mode"] == "lines"
                assert belongs(r, {k: v for k, v in facet.items() if k != "W"}), (name, facet, r["key"])
            else:
                assert belongs(r, facet), (name, facet, r["key"])
                if name == "predicted" and meta["quantity"] == "ms":  # measured ms on the x axis, W in the hover
                    assert r["median_ms"] in trace["x"]
                elif "W" not in facet:  # the scaling figure (the predicted figure's error row): W on the x axis
                    assert r["W"] in trace["x"]
            if name == "latency":
                assert y == pytest.approx(r["median_ms"])
            checked += 1
    assert checked > 0, f"{name}: no point checked"


def test_facets_cover_every_run() -> None:
    """No run is dropped by the facets: every measured run is drawn in the latency figure and in the mode map
    (as the winner, or inside a cell that lists its mode among the candidates)."""
    rows = rows_all_W()
    fig = SWEEP_FIGURES["latency"].figure(rows)
    drawn = {pid for t in fig.data if (t.meta or {}).get("kind") == "measured" for pid in t.ids}
    assert drawn == {str(r["id"]) for r in rows}
    cells = SWEEP_FIGURES["best_mode"].frame(rows)
    assert {(c["lb"], c["B"], c["T"], c["W"]) for c in cells} == {(r["lb"], r["B"], r["T"], r["W"]) for r in rows}
