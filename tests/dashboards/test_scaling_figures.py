"""The scaling model's figures, pure (rows in, figure out): what they draw.

Scenarios: the predicted-vs-measured figure puts every point of the stored CPU sweep (benchmarks/results/
cp_w48_cpu.csv) in the column of its topology: the single-host rows in "1 host", the same rows recorded as run on
2 hosts of 4 over InfiniBand (the fields the multi-host worker stores) in "2x4 ib" (`db.topology.Topology.label`); each trace's x are the
measured medians and y the model's predictions on that topology (the 2-host ones differ: they cross the inter-host
link), the error row 100 x (predicted / measured - 1); the scaling map writes each cell's predicted best scheme.
"""

from __future__ import annotations

from typing import Any

import pytest

from dashboards.figures import predicted, scaling_map
from dashboards.links import DEFAULT_PARAMS
from dashboards.scaling_model import KernelRate, best_schemes, held_against
from tests.dashboards.test_scaling_model import stored_rows


def two_host_rows() -> list[dict[str, Any]]:
    rows = stored_rows("cp_w48_cpu.csv")
    moved = [{**r, "id": 1000 + r["id"], "hosts": 2, "ranks_per_host": 4, "interconnect": "ib"} for r in rows if r["W"] == 8]
    return rows + moved


def test_predicted_figure_facets_by_topology_and_draws_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CPBENCH_COMM_PARAMS", raising=False)
    rows = two_host_rows()
    fig = predicted.figure(rows).to_plotly_json()
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert titles == ["1 host", "2x4 ib"]
    want = {t["id"]: t for t in held_against(rows, DEFAULT_PARAMS)}
    columns = {"x": "1 host", "x2": "2x4 ib", "x3": "1 host", "x4": "2x4 ib"}
    seen: set[int] = set()
    for t in (t for t in fig["data"] if t["meta"]["kind"] == "measured"):
        ids = [int(i) for i in t["ids"]]
        assert t["meta"]["topology"] == columns[t["xaxis"]]
        assert {want[i]["hosts"] for i in ids} == {2 if t["meta"]["topology"].startswith("2") else 1}
        if t["meta"]["quantity"] == "ms":
            seen |= set(ids)
            assert list(t["x"]) == pytest.approx([want[i]["median_ms"] for i in ids])
            assert list(t["y"]) == pytest.approx([want[i]["predicted_ms"] for i in ids])
        else:
            assert list(t["y"]) == pytest.approx([100 * want[i]["error"] for i in ids])
    assert seen == {r["id"] for r in rows if r["status"] == "done"}
    # the same W=8 point on 2 hosts pays the inter-host link: a different prediction
    for r in rows:
        if r["id"] >= 1000 and r["mode"] in ("headwise", "all_gather", "true_cp", "ring"):
            assert want[r["id"]]["comm_ms"] > want[r["id"] - 1000]["comm_ms"], r["mode"]


def test_scaling_map_writes_the_best_scheme_of_each_cell() -> None:
    rate = KernelRate(2e-5, 1e-9)
    cells = best_schemes(Ts=[8192, 1 << 20], Ws=[1, 8, 16], hosts=[1, 2], rate=rate, max_ranks_per_host=8)
    fig = scaling_map.figure(cells).to_plotly_json()
    maps = [t for t in fig["data"] if t["meta"]["kind"] == "best"]
    assert [m["meta"]["hosts"] for m in maps] == [1, 2]
    for m in maps:
        at = {(c["T"], c["W"]): c for c in cells if c["hosts"] == m["meta"]["hosts"]}
        Ws = sorted({W for _, W in at})
        assert list(m["x"]) == [str(W) for W in Ws] and list(m["y"]) == ["8K", "1024K"]
        assert [list(row) for row in m["text"]] == [
            [f"{at[(T, W)]['best']}<br>{at[(T, W)]['best_ms']:.3g} ms" for W in Ws] for T in (8192, 1 << 20)
        ]
        assert [list(row) for row in m["z"]] == [
            [m["meta"]["modes"].index(at[(T, W)]["best"]) for W in Ws] for T in (8192, 1 << 20)
        ]
