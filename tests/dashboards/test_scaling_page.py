"""The /scaling page through the real app (no sweep needed): the predicted best scheme per (T, W, hosts) from the
H200 anchors, and where its parameters came from.

Scenarios: without a sweep the page uses the H200 kernel-rate anchors and the assumed links, and labels every cell
with `best_schemes`' winner; `exact=true` leaves the approximate tail_exchange out of every cell; a `cpbench bench
comm` JSON named by CPBENCH_COMM_PARAMS is used (its source in the links table, its collectives held against the
model in a table) and an unreadable one is named in a banner, the assumed links used; another op and the training
step take their own anchor; an unknown family says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench_server.core.config import ServerSettings
from bench_server.main import create_app
from dashboards.links import DEFAULT_PARAMS, PARAMS_ENV, CommParams
from dashboards.scaling_model import DEFAULT_RATES, SCALING_HOSTS, SCALING_TS, SCALING_WS, best_schemes, cp_modes
from tests.dashboards.seed import Seeded


@pytest.fixture(scope="module")
def client(seeded_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(DATABASE_URL=seeded_url, API_TOKEN="scaling-page-token-0123456789"))) as c:
        yield c


def heatmaps(html: str) -> list[dict[str, Any]]:
    m = re.search(r'Plotly\.newPlot\(\s*"fig-scaling_map",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{"displaylogo"', html, re.S)
    assert m, "no scaling map"
    return json.loads(m.group(1))


def labels(maps: list[dict[str, Any]]) -> dict[tuple[int, str, str], str]:
    return {
        (h["meta"]["hosts"], y, x): h["text"][i][j] for h in maps for i, y in enumerate(h["y"]) for j, x in enumerate(h["x"])
    }


def expected(op: str = "gdn", direction: str = "fwd", params: CommParams = DEFAULT_PARAMS, **kw: Any) -> dict:
    rate = DEFAULT_RATES[(op, "triton", "bfloat16", 16, 128, 128, direction)]
    cells = best_schemes(
        Ts=SCALING_TS,
        Ws=SCALING_WS,
        hosts=SCALING_HOSTS,
        rate=rate,
        params=params,
        op=op,
        direction=direction,
        max_ranks_per_host=8,
        **kw,
    )
    label = {8192: "8K", 32768: "32K", 131072: "128K", 524288: "512K", 1 << 20: "1024K", 2 << 20: "2048K", 4 << 20: "4096K"}
    return {(c["hosts"], label[c["T"]], str(c["W"])): f"{c['best']}<br>{c['best_ms']:.3g} ms" for c in cells}


def test_scaling_page_labels_every_cell(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARAMS_ENV, raising=False)
    html = client.get("/scaling").text
    got = {k: v for k, v in labels(heatmaps(html)).items() if v}
    assert got == expected()
    assert {v.split("<br>")[0] for v in got.values()} >= {"none", "tail_exchange"}
    assert html.count("assumed (DEFAULT_PARAMS)") == 2 and "benchmarks/results/cp_h200.md (H200)" in html
    exact = {k: v for k, v in labels(heatmaps(client.get("/scaling?exact=true").text)).items() if v}
    assert exact == expected(modes=cp_modes(exact_only=True))
    assert not any("tail_exchange" in v for v in exact.values())
    kda = {k: v for k, v in labels(heatmaps(client.get("/scaling?op=kda&direction=fwd%2Bbwd").text)).items() if v}
    assert (
        kda == expected("kda", "fwd+bwd") and "kernels_train_h200.md" in client.get("/scaling?op=kda&direction=fwd%2Bbwd").text
    )
    assert "no kernel rate for gdn fwd" not in html


def test_scaling_page_uses_the_measured_links_and_says_where_from(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = {
        "links": {"intra": {"alpha_s": 3e-6, "beta_s_per_byte": 2e-12}, "inter": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-10}},
        "measured": ["inter", "intra"],
        "source": "cpbench bench comm on the test cluster",
        "topology": {"hosts": 2, "ranks_per_host": 2},
        "samples": [{"kind": "all_gather", "bytes": 1 << 20, "seconds": 1e-3, "peer": None, "link": None}],
    }
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(PARAMS_ENV, str(path))
    html = client.get("/scaling").text
    links = re.search(r'<table id="links">.*?</table>', html, re.S)
    assert links and links.group(0).count("cpbench bench comm on the test cluster") == 2
    assert {k: v for k, v in labels(heatmaps(html)).items() if v} == expected(params=CommParams.from_json(doc))
    check = re.search(r'<table id="comm-check">.*?</table>', html, re.S)
    predicted = 3 * 1e-4 + (1 << 20) * (2e-12 + 2 * 1e-10)  # 3 steps over 2 hosts: 1 block from the host, 2 off it
    assert check and f"<td>{predicted * 1e3:.4g}</td>" in check.group(0)
    path.write_text("{broken")
    banner = client.get("/scaling").text
    assert (
        re.search(r'id="params-problem".*unusable \(JSONDecodeError', banner) and banner.count("assumed (DEFAULT_PARAMS)") == 2
    )


def test_scaling_page_fits_the_rate_on_a_sweep_or_says_it_has_none(client: TestClient, seeded: Seeded) -> None:
    """The seeded sweep holds gdn points only: its W=1 `none` gives gdn a rate; kda has none there."""
    gdn = client.get(f"/scaling?sweep={seeded.sweep_id}&backend=torch&H=4&K=32&V=32")
    assert gdn.status_code == 200 and f"sweep {seeded.sweep_id}: its W=1 `none` points" in gdn.text
    kda = client.get(f"/scaling?sweep={seeded.sweep_id}&op=kda")
    assert kda.status_code == 200 and f"no kernel rate for kda fwd in sweep {seeded.sweep_id}" in kda.text
    assert not any(t for h in heatmaps(kda.text) for row in h.get("text", []) for t in row)
