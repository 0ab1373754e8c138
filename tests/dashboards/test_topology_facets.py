"""The sweep figures facet by topology: points whose ranks spanned two hosts are drawn apart from the one-host points
of the same W, named by the one topology label, against the same one-host W=1 `none` baseline.

The store is a real migrated SQLite file seeded through `db.crud` (`tests.dashboards.seed.seed_topologies`): none at
W=1, true_cp and ring at W=2 and 4 on one host, and the same W=4 shapes on two "hosts" of 2 ranks
("2x2 loopback+tcp/lo"), each measurement with its topology columns; rows are read back with `db.crud.list_results`
(`dashboards.data.sweep_rows`), and the sweep page from the real app over HTTP (uvicorn on 127.0.0.1).

Scenarios: scaling draws "true_cp" at W = 2, 4 and "true_cp · 2x2 loopback+tcp/lo" at W=4, their speedups over the
one-host `none` of the shape; the one-host traces are those of a figure of the one-host rows alone, which carries no
topology anywhere; latency, accuracy and the mode map give the two-host points a column of their own titled
"W=4 · 2x2 loopback+tcp/lo", holding exactly those points (and `none` as the latency's reference); the predicted
figure's columns are "1 host" and the label; the page over HTTP draws the same traces, and the scaling CSV says each
point's topology.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from dashboards.data import sweep_rows
from dashboards.figures import accuracy, best_mode, latency, predicted, scaling
from db.session import get_sessionmaker
from tests.dashboards.seed import TOPO_2X2, TOPO_MS, TOPO_TS, Topologies, page_figure, seed_topologies

LABEL = "2x2 loopback+tcp/lo"
TOKEN = "topology-facets-token-0123456789"


@pytest.fixture(scope="module")
def topologies(seeded_url: str) -> Topologies:
    return seed_topologies(seeded_url)


@pytest.fixture(scope="module")
def rows(seeded_url: str, topologies: Topologies) -> list[dict[str, Any]]:
    with get_sessionmaker(seeded_url)() as s:
        return sweep_rows(s, topologies.sweep_id, limit=1000)


def by_name(fig: dict[str, Any], kind: str = "measured", quantity: str | None = None) -> dict[tuple[str, int], Any]:
    """{(trace name, T): trace} of the traces of `kind` (and `quantity`)."""
    return {
        (t["name"], t["meta"]["T"]): t
        for t in fig["data"]
        if t["meta"].get("kind") == kind and (quantity is None or t["meta"].get("quantity") == quantity)
    }


def column_titles(fig: dict[str, Any]) -> list[str]:
    return [a["text"] for a in fig["layout"]["annotations"] if a.get("xref") == "paper" and a["text"].strip()]


def test_rows_carry_the_topology_as_recorded(rows: list[dict[str, Any]], topologies: Topologies) -> None:
    two = {r["id"] for r in rows if r["hosts"] == 2}
    assert two == {i for (_, _, hosts, _), i in topologies.ids.items() if hosts == 2}
    assert {(r["ranks_per_host"], r["interconnect"]) for r in rows if r["id"] in two} == {(2, TOPO_2X2.interconnect)}


def test_scaling_draws_two_host_points_apart_over_the_one_host_baseline(
    rows: list[dict[str, Any]], topologies: Topologies
) -> None:
    fig = scaling.figure(rows).to_plotly_json()
    speed = by_name(fig, quantity="speedup")
    assert sorted({name for name, _ in speed}) == ["ring", f"ring · {LABEL}", "true_cp", f"true_cp · {LABEL}"]
    for (name, T), t in speed.items():
        mode, _, label = name.partition(" · ")
        hosts = 2 if label else 1
        Ws = [4] if label else [2, 4]
        assert (list(t["x"]), t["meta"]["topology"]) == (Ws, label)
        assert [int(i) for i in t["ids"]] == [topologies.ids[(mode, W, hosts, T)] for W in Ws]
        none_ms = TOPO_MS[("none", 1, 1)]  # the one-host W=1 none of the shape, for both topologies
        assert list(t["y"]) == pytest.approx([none_ms / TOPO_MS[(mode, W, hosts)] for W in Ws])
    eff = by_name(fig, quantity="efficiency")
    assert list(eff[(f"true_cp · {LABEL}", 256)]["y"]) == pytest.approx([1.0 / 0.5 / 4])

    alone = scaling.figure([r for r in rows if r["hosts"] == 1]).to_plotly_json()
    one_host = by_name(alone)
    assert one_host.keys() == {k for k, t in by_name(fig).items() if not t["meta"]["topology"]}
    for k, t in one_host.items():
        assert (t["x"], t["y"], t["ids"]) == (by_name(fig)[k]["x"], by_name(fig)[k]["y"], by_name(fig)[k]["ids"])
    assert LABEL not in str(alone) and "topology': ''" in str(alone)
    assert column_titles(alone) == column_titles(fig) == [f"T={T}" for T in TOPO_TS]


def test_latency_accuracy_and_mode_map_give_the_topology_a_column(rows: list[dict[str, Any]], topologies: Topologies) -> None:
    two = {i for (_, _, hosts, _), i in topologies.ids.items() if hosts == 2}
    none = {i for (mode, _, _, _), i in topologies.ids.items() if mode == "none"}

    lat = latency.figure(rows).to_plotly_json()
    assert column_titles(lat) == ["W=2", "W=4", f"W=4 · {LABEL}"]
    cols = {title: f"x{j}" if j > 1 else "x" for j, title in enumerate(column_titles(lat), start=1)}
    drawn: dict[tuple[str, str], set[int]] = {}
    for t in lat["data"]:
        drawn.setdefault((t["xaxis"], t["meta"]["kind"]), set()).update(int(i) for i in t["ids"])
    in_two = {k: v for k, v in drawn.items() if k[0] == cols[f"W=4 · {LABEL}"]}
    assert set().union(*(v for (_, kind), v in in_two.items() if kind == "measured")) == two
    assert set().union(*(v for (_, kind), v in in_two.items() if kind == "reference")) == none
    measured_elsewhere = set().union(
        *(v for (ax, kind), v in drawn.items() if kind == "measured" and ax != cols[f"W=4 · {LABEL}"])
    )
    assert not measured_elsewhere & two
    latency_csv = latency.frame(rows)
    assert {r["id"] for r in latency_csv if r["facet_topology"] == LABEL and r["role"] == "measured"} == two

    acc = accuracy.figure(rows).to_plotly_json()
    assert f"vs none · W=4 · {LABEL}" in column_titles(acc)
    assert {(t["meta"]["mode"], t["meta"]["W"]) for t in acc["data"] if t["meta"]["topology"] == LABEL} == {
        ("true_cp", 4),
        ("ring", 4),
    }
    for t in (t for t in acc["data"] if t["meta"]["topology"] == LABEL and t["meta"]["quantity"] == "err_vs_none"):
        want = [r for r in rows if r["id"] in two and r["mode"] == t["meta"]["mode"]]
        assert sorted(c[0] for c in t["customdata"]) == sorted(r["T"] for r in want)  # its points: the two-host ones
        assert list(t["y"]) == pytest.approx([r["err_vs_none"] for r in want])

    mode_map = best_mode.figure(rows).to_plotly_json()
    best = [t for t in mode_map["data"] if t["meta"]["kind"] == "best"]
    assert list(best[0]["x"]) == ["W=1", "W=2", "W=4", f"W=4 · {LABEL}"]
    winners = {
        (y, x): t["customdata"][i][j][1]
        for t in best
        for i, y in enumerate(t["y"])
        for j, x in enumerate(t["x"])
        if t["text"][i][j]
    }
    for T in TOPO_TS:
        assert winners[(f"T={T}", f"W=4 · {LABEL}")] == topologies.ids[("true_cp", 4, 2, T)]
        assert winners[(f"T={T}", "W=4")] == topologies.ids[("true_cp", 4, 1, T)]


def test_predicted_columns_are_one_host_and_the_label(rows: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CPBENCH_COMM_PARAMS", raising=False)
    fig = predicted.figure(rows).to_plotly_json()
    assert column_titles(fig) == [predicted.ONE_HOST, LABEL]


@pytest.fixture(scope="module")
def client(seeded_url: str, topologies: Topologies) -> Iterator[httpx.Client]:
    app = create_app(ServerSettings(DATABASE_URL=seeded_url, API_TOKEN=TOKEN))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def test_the_page_over_http_draws_the_same_traces(
    client: httpx.Client, rows: list[dict[str, Any]], topologies: Topologies
) -> None:
    r = client.get(f"/sweeps/{topologies.sweep_id}")
    assert r.status_code == 200, r.text[:300]
    page = by_name(page_figure(r.text, "fig-scaling"))
    pure = by_name(scaling.figure(rows).to_plotly_json())
    assert page.keys() == pure.keys() and (f"true_cp · {LABEL}", 1024) in page
    for k, t in page.items():
        assert (t["x"], t["ids"]) == (list(pure[k]["x"]), list(pure[k]["ids"]))
        assert t["y"] == pytest.approx(list(pure[k]["y"]))
    got = client.get(f"/dash/{topologies.sweep_id}/scaling.csv")
    assert got.status_code == 200
    table = list(csv.DictReader(io.StringIO(got.text)))
    two = {str(i) for (_, _, hosts, _), i in topologies.ids.items() if hosts == 2}
    assert {row["id"] for row in table if row["topology"] == LABEL} == two
    assert {row["topology"] for row in table if row["id"] not in two} == {""}
