"""Results, configs export and workers over HTTP, on a store seeded through `db.crud` (tests.dashboards.seed).

Scenarios: each filter (sweep, op, mode, backend, B, T, W, lb, device, status) keeps exactly the matching points
and the count says how many match; pagination walks the same ordered list; CSV carries the same page with a header
and the total in X-Total-Count; the autotune export is served for a device (CPU only when asked), 404 for an
unknown one; workers list with `alive`; a training step's per-direction profile comes with its row; a repeated page
comes from the per-revision cache until a step of a point's life (claim, release, done) changes it.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import httpx
import pytest

from db import crud
from db.session import session_scope
from tests.dashboards.seed import Seeded, point, seed_store


@pytest.fixture(scope="module")
def seeded(store_url: str, server: Any) -> Seeded:
    return seed_store(store_url)


def all_rows(client: httpx.Client, sweep_id: int) -> list[dict[str, Any]]:
    page = client.get("/api/v1/results", params={"sweep": sweep_id, "limit": 1000}).json()
    assert page["count"] == len(page["data"])
    return page["data"]


@pytest.mark.parametrize(("name", "value"), [
    ("mode", "true_cp"), ("op", "gdn"), ("backend", "torch"), ("B", 2), ("T", 1024), ("W", 4), ("lb", -4.0),
    ("device", "cpu"), ("status", "failed"),
])
def test_read_results_filter(client: httpx.Client, seeded: Seeded, name: str, value: Any) -> None:
    rows = all_rows(client, seeded.sweep_id)
    column = "device_name" if name == "device" else name
    expected = [r["id"] for r in rows if r[column] == value]
    assert expected, f"the seed has no point with {name}={value}"
    page = client.get("/api/v1/results", params={"sweep": seeded.sweep_id, name: value, "limit": 1000}).json()
    assert page["count"] == len(expected) and [r["id"] for r in page["data"]] == expected


def test_read_results_combined_filters_and_fields(client: httpx.Client, seeded: Seeded) -> None:
    page = client.get("/api/v1/results", params={"sweep": seeded.sweep_id, "mode": "ring", "W": 2, "T": 256, "lb": -1.0}).json()
    assert page["count"] == 2  # B in (1, 2)
    row = page["data"][0]
    assert row["status"] == "done" and row["median_ms"] > 0 and row["p10_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert row["collectives"] == {"send": 1, "recv": 1} and row["device_name"] == "cpu"
    several = client.get("/api/v1/results", params=[("sweep", seeded.sweep_id), ("mode", "ring"), ("mode", "none")]).json()
    assert {r["mode"] for r in several["data"]} == {"ring", "none"}
    assert client.get("/api/v1/results", params={"sweep": 10**6}).json() == {"data": [], "count": 0}
    assert client.get("/api/v1/results", params={"T": "long"}).status_code == 422


def test_read_results_pagination(client: httpx.Client, seeded: Seeded) -> None:
    ids = [r["id"] for r in all_rows(client, seeded.sweep_id)]
    walked = []
    for skip in range(0, len(ids), 7):
        page = client.get("/api/v1/results", params={"sweep": seeded.sweep_id, "skip": skip, "limit": 7}).json()
        assert page["count"] == len(ids)
        walked += [r["id"] for r in page["data"]]
    assert walked == ids == sorted(ids)



def test_read_results_per_direction_profile(client: httpx.Client, store_url: str, seeded: Seeded) -> None:
    """A training step's profile per direction is served with the point's row (null for a forward point)."""
    split = {"fwd": {"collectives": {"all_gather": 1}, "collective_bytes": {"all_gather": 4096}, "host_syncs": 0},
             "bwd": {"collectives": {"all_gather": 1}, "collective_bytes": {"all_gather": 4096}, "host_syncs": 0}}
    with session_scope(store_url) as s:
        p = {**point(0, mode="true_cp", W=2, T=1024, B=1, lb=-1.0), "direction": "fwd+bwd"}
        sweep = crud.create_sweep(s, name="train", tags=[], spec={"name": "train"}, points=[{**p, "key": p["key"] + "/dir=fwd+bwd"}])
        crud.store_profile(s, point_id=sweep.points[0].id, collectives={"all_gather": 2}, collective_bytes={"all_gather": 8192},
                           host_syncs=0, sync_events={}, kernel_launches=0, peak_memory_bytes=None, by_direction=split)
        sweep_id = sweep.id
    [row] = all_rows(client, sweep_id)
    assert row["direction"] == "fwd+bwd" and row["collectives"] == {"all_gather": 2} and row["by_direction"] == split
    assert all(r["by_direction"] is None for r in all_rows(client, seeded.sweep_id))


def test_read_results_csv(client: httpx.Client, seeded: Seeded) -> None:
    r = client.get("/api/v1/results", params={"sweep": seeded.sweep_id, "mode": "true_cp", "limit": 5, "format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    total = client.get("/api/v1/results", params={"sweep": seeded.sweep_id, "mode": "true_cp"}).json()["count"]
    assert r.headers["x-total-count"] == str(total) == "17" and "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 5 and list(rows[0]) == list(crud.RESULT_FIELDS)
    assert {row["mode"] for row in rows} == {"true_cp"} and all(float(row["median_ms"]) > 0 for row in rows)
    assert rows[0]["collectives"] == '{"all_gather": 1}'


def test_export_configs(client: httpx.Client, seeded: Seeded) -> None:
    assert client.get("/api/v1/configs/export", params={"device": "cpu"}).status_code == 400  # CPU timings refused
    r = client.get("/api/v1/configs/export", params={"device": "cpu", "allow_cpu": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["device"]["name"] == "cpu" and body["schema_version"]
    assert {name: len(k["entries"]) for name, k in body["kernels"].items()} == dict.fromkeys(seeded.kernels, 2)
    r = client.get("/api/v1/configs/export", params={"device": "NVIDIA H9000"})
    assert r.status_code == 404 and "NVIDIA H9000" in r.json()["detail"]


def test_read_workers(client: httpx.Client, auth: dict[str, str], store_url: str, seeded: Seeded) -> None:
    with session_scope(store_url) as session:
        crud.register_worker(session, name="host:1:abcd", host="host", pid=1, devices={"kind": "cpu", "count": 1},
                             environment_id=None)
        crud.register_worker(session, name="host:2:dead", host="host", pid=2, devices={"kind": "cpu"}, environment_id=None)
        crud.touch_worker(session, name="host:2:dead", status="stopped")
    body = client.get("/api/v1/workers", headers=auth).json()
    by_name = {w["name"]: w for w in body["data"]}
    assert body["count"] >= 2
    assert by_name["host:1:abcd"]["alive"] is True and by_name["host:2:dead"]["alive"] is False
    assert by_name["host:1:abcd"]["state"] == "idle" and by_name["host:2:dead"]["state"] == "stopped"
    assert by_name["host:1:abcd"]["host"] == "host" and by_name["host:1:abcd"]["pid"] == 1


def test_workers_hide_host_and_pid_without_the_token(client: httpx.Client, store_url: str, seeded: Seeded) -> None:
    with session_scope(store_url) as session:
        crud.register_worker(session, name="secret-host:77:beef", host="secret-host", pid=77, devices={"kind": "cpu"},
                             environment_id=None)
    text = client.get("/api/v1/workers").text
    assert "secret-host" not in text and '"pid":77' not in text
    rows = client.get("/api/v1/workers").json()["data"]
    assert all(w["host"] is None and w["pid"] is None and w["name"] == f"worker-{w['id']}" for w in rows)


def test_a_results_page_is_served_from_cache_until_its_rows_change(
    client: httpx.Client, store_url: str, seeded: Seeded, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated request is answered from `RESULT_PAGES` (the page not built again) while nothing it shows changed;
    each step of a point's life through the real queue (claim, release, claim again, done with a measurement) is a
    new revision and shows at once; the token's page (with the worker) is kept apart from the anonymous one."""
    from bench_server.api.routes import results
    from db import queue

    with session_scope(store_url) as s:  # an owned sweep: only a claim with its owner token takes its points
        sweep_id = crud.create_sweep(s, name="cached", tags=[], spec={}, owner="cache-test",
                                     points=[point(0, mode="none", W=1, T=256, B=1, lb=-1.0)]).id  # fmt: skip
    built: list[int] = []
    real = results._page
    monkeypatch.setattr(results, "_page", lambda *a, **k: built.append(1) or real(*a, **k))

    def row(headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = client.get("/api/v1/results", params={"sweep": sweep_id}, headers=headers)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json" and r.json()["count"] == 1
        return r.json()["data"][0]

    first = row()
    assert (first["status"], first["attempts"], first["claimed_at"]) == ("queued", 0, None)
    assert row() == first and len(built) == 1  # the same revision: from the cache
    with session_scope(store_url) as s:
        point_id = queue.claim_point(s, worker="w1", lease_s=60, owner="cache-test").id
    assert (row()["status"], row()["attempts"], len(built)) == ("running", 1, 2)
    with session_scope(store_url) as s:
        assert queue.release_point(s, point_id=point_id, worker="w1")
    released = row()  # queued with no attempt used again, as at first, but claimed once: not the first page
    assert (released["status"], released["attempts"]) == ("queued", 0) and released["claimed_at"] is not None
    with session_scope(store_url) as s:
        assert queue.claim_point(s, worker="w2", lease_s=60, owner="cache-test").id == point_id
        summary = dict.fromkeys(("p10_ms", "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms"), 1.5)
        crud.store_measurement(s, point_id=point_id, environment_id=None, worker="host:42", clock="wall",
                               samples=[1.5] * 3, summary={**summary, "median_ms": 1.5, "n": 3}, stop_reason="noise",
                               err_vs_none=None, err_vs_reference=1e-6)  # fmt: skip
        assert queue.complete_point(s, point_id=point_id, worker="w2")
    done = row()
    assert (done["status"], done["median_ms"], done["worker"]) == ("done", 1.5, None)
    assert row(auth)["worker"] == "host:42" and row()["worker"] is None  # the token's page is another entry
    assert len(built) == 5  # first, claimed, released, done; done with the token
