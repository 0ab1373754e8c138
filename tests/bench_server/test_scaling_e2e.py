"""The scaling model held against a real gloo sweep at W = 1, 2, 4, over HTTP (issue 29, Test 3 and the figures).

Scenario: POST a spec (every multi-device scheme and `none`, W in (1, 2, 4), contiguous and zigzag, forward and
training step) -> a real
worker (`runners.worker.run_worker`, gloo ranks on the CPU) runs it -> every W=2/4 point's stored collective bytes
equal the cost model's of its direction, kind by kind and to the byte -> the sweep page's "predicted" figure draws, per scheme, the
measured medians of its points (x) against `dashboards.scaling_model.held_against`'s predictions (y) and their
errors, in one "1 host" column -> /scaling?sweep= fits the kernel rate on that sweep's W=1 `none` and labels each
(T, W, hosts) cell with the scheme `best_schemes` predicts fastest; its tables name the links used and their source.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from dashboards.cost_model import comm_cost
from dashboards.figures.common import tokens_label
from dashboards.links import DEFAULT_PARAMS
from dashboards.scaling_model import (
    SCALING_HOSTS,
    SCALING_TS,
    SCALING_WS,
    best_schemes,
    fit_rates,
    held_against,
)
from runners.worker import run_worker

pytestmark = pytest.mark.multiproc

SHAPE = {"B": 1, "T": 256, "H": 4, "K": 16, "V": 16}
SPEC: dict[str, Any] = {
    "name": "scaling-e2e",
    "ops": ["gdn"],
    "modes": ["none", "headwise", "all_gather", "ring", "true_cp", "tail_exchange"],
    "backends": ["torch"],
    "axes": {
        **SHAPE,
        "lb": -1.0,
        "W": [1, 2, 4],
        "layout": ["contiguous", "zigzag"],
        "dtype": "float32",
        "direction": ["fwd", "fwd+bwd"],
    },
    "timing": {"min_samples": 2, "max_samples": 3, "min_time_s": 0, "warmup_s": 0, "flush_l2": False, "max_rel_iqr": 10},
    "check": {"reference_tokens": 64, "tol_none": 1.0, "tol_reference": 1.0},  # tail_exchange is approximate
}


def figure_data(html: str, div: str) -> list[dict[str, Any]]:
    m = re.search(rf'Plotly\.newPlot\(\s*"{div}",\s*(\[.*?\]),\s*(\{{.*?\}}),\s*\{{"displaylogo"', html, re.S)
    assert m, f"no figure {div}"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def sweep(client: httpx.Client, store_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    auth = {"Authorization": "Bearer test-token-0123456789abcdef"}
    r = client.post("/api/v1/sweeps", json=SPEC, headers=auth)
    assert r.status_code == 201, r.text
    s = r.json()
    run_worker(
        store_url,
        once=True,
        until_sweep=s["id"],
        device_kind="cpu",
        devices=4,
        artifact_dir=tmp_path_factory.mktemp("art"),
        lease_s=300,
        heartbeat_s=5,
    )
    rows = client.get("/api/v1/results", params={"sweep": s["id"], "limit": 1000}).json()["data"]
    failed = [(r["mode"], r["W"], r["error"]) for r in rows if r["status"] == "failed"]
    assert not failed, failed
    return {"id": s["id"], "rows": [r for r in rows if r["status"] == "done"]}


def test_model_bytes_equal_the_profiled_bytes_at_w2_and_w4(sweep: dict[str, Any]) -> None:
    cp = [r for r in sweep["rows"] if r["W"] in (2, 4)]
    assert {(r["mode"], r["W"], r["direction"]) for r in cp} == {
        (m, W, d) for m in SPEC["modes"][1:] for W in (2, 4) for d in ("fwd", "fwd+bwd")
    }
    for r in cp:
        window = ((r.get("params") or {}).get("mode_options") or {}).get("window")
        cost = comm_cost(
            r["mode"],
            **SHAPE,
            W=r["W"],
            dtype_bytes=4,
            layout=r["layout"],
            direction=r["direction"],
            warmup_chunks=window if isinstance(window, int) else 2,
        )
        key = (r["mode"], r["W"], r["layout"], r["direction"])
        assert cost is not None and r["collective_bytes"], key
        assert r["collective_bytes"] == cost.payload_bytes, key
        assert r["collectives"] == cost.collectives, key


def test_predicted_figure_draws_measured_against_the_model(client: httpx.Client, sweep: dict[str, Any]) -> None:
    html = client.get(f"/sweeps/{sweep['id']}", params={"layout": "contiguous", "direction": "fwd"}).text
    traces = [t for t in figure_data(html, "fig-predicted") if t["meta"]["kind"] == "measured"]
    rows = [r for r in sweep["rows"] if (r["layout"] == "contiguous" or r["mode"] == "none") and r["direction"] == "fwd"]
    want = {t["id"]: t for t in held_against(rows, DEFAULT_PARAMS)}
    assert {t["meta"]["topology"] for t in traces} == {"1 host"}
    assert {t["meta"]["mode"] for t in traces} == set(SPEC["modes"])
    drawn: set[int] = set()
    for t in traces:
        ids = [int(i) for i in t["ids"]]
        drawn |= set(ids)
        assert all(want[i]["mode"] == t["meta"]["mode"] for i in ids)
        if t["meta"]["quantity"] == "ms":
            assert t["x"] == pytest.approx([want[i]["median_ms"] for i in ids])
            assert t["y"] == pytest.approx([want[i]["predicted_ms"] for i in ids])
        else:
            assert t["x"] == [want[i]["W"] for i in ids]
            assert t["y"] == pytest.approx([100 * want[i]["error"] for i in ids])
    assert drawn == set(want)
    csv_text = client.get(f"/dash/{sweep['id']}/predicted.csv", params={"layout": "contiguous", "direction": "fwd"}).text
    assert len(csv_text.splitlines()) == 1 + len(want)


def test_scaling_page_labels_each_cell_with_the_predicted_best(client: httpx.Client, sweep: dict[str, Any]) -> None:
    q: dict[str, Any] = {"sweep": sweep["id"], "op": "gdn", "backend": "torch", "dtype": "float32"}
    q.update(H=4, K=16, V=16, max_ranks_per_host=8)
    r = client.get("/scaling", params=q)
    assert r.status_code == 200, r.text
    rate = fit_rates(sweep["rows"])[("gdn", "torch", "float32", 4, 16, 16, "fwd")]
    grid = {"Ts": SCALING_TS, "Ws": SCALING_WS, "hosts": SCALING_HOSTS}
    cells = best_schemes(rate=rate, params=DEFAULT_PARAMS, dtype_bytes=4, max_ranks_per_host=8, H=4, K=16, V=16, **grid)
    heatmaps = figure_data(r.text, "fig-scaling_map")
    assert [h["meta"]["hosts"] for h in heatmaps] == list(SCALING_HOSTS)
    for h in heatmaps:
        mine = {(c["T"], c["W"]): c for c in cells if c["hosts"] == h["meta"]["hosts"]}
        assert h["x"] == [str(W) for W in sorted({W for _, W in mine})]
        assert h["y"] == [tokens_label(T) for T in SCALING_TS]
        for i, T in enumerate(SCALING_TS):
            for j, W in enumerate(int(x) for x in h["x"]):
                assert h["text"][i][j] == f"{mine[(T, W)]['best']}<br>{mine[(T, W)]['best_ms']:.3g} ms"
    assert {c["best"] for c in cells} >= {"none"}
    links = re.search(r'<table id="links">.*?</table>', r.text, re.S)
    assert links and links.group(0).count("assumed (DEFAULT_PARAMS)") == 2
    rate_table = re.search(r'<table id="rate">.*?</table>', r.text, re.S)
    assert rate_table and f"sweep {sweep['id']}: its W=1 `none` points" in rate_table.group(0)
    assert client.get("/scaling", params={**q, "sweep": 999999}).status_code == 404
    assert client.get("/scaling", params={**q, "H": 0}).status_code == 422
