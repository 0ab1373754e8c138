"""The sweeps API over HTTP (uvicorn on 127.0.0.1): submit, list with pagination, read with progress, cancel; the
token on writes (401 without, 403 wrong); bad specs (422 naming the field); body and grid limits (413); health,
OpenAPI, and the app's refusal of an unmigrated store; the cyclic collector held off while a submit runs.
"""

from __future__ import annotations

import copy
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from db.errors import StoreNotMigratedError
from db.migrate import upgrade
from db.session import dispose_engine
from runners.spec import SweepSpec, grid_size
from tests.bench_server.conftest import TOKEN

TINY: dict[str, Any] = {
    "name": "tiny",
    "tags": ["test"],
    "ops": ["gdn"],
    "modes": ["none", "true_cp"],
    "backends": ["torch"],
    "axes": {"B": 1, "T": [128, 256], "H": 2, "K": 16, "V": 16, "lb": -1.0, "W": [1, 2], "dtype": "float32"},
    "timing": {"min_samples": 2, "max_samples": 3, "min_time_s": 0, "warmup_s": 0},
}


def spec(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(TINY)
    out.update(changes)
    return out


def test_create_sweep(client: httpx.Client, auth: dict[str, str]) -> None:
    r = client.post("/api/v1/sweeps", json=spec(), headers=auth)
    assert r.status_code == 201, r.text
    body = r.json()
    n = grid_size(SweepSpec.model_validate(TINY))
    assert body["id"] > 0 and body["name"] == "tiny" and body["tags"] == ["test"]
    assert body["n_points"] == n and body["progress"]["total"] == n
    assert body["progress"]["queued"] + body["progress"]["skipped"] == n
    assert body["spec"]["modes"] == ["none", "true_cp"]
    again = client.get(f"/api/v1/sweeps/{body['id']}").json()
    assert again["progress"] == body["progress"] and again["status"] in ("queued", "done")


def test_a_submit_holds_the_cyclic_collector_off_until_it_is_answered(
    client: httpx.Client, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a submit runs (its body parsed, its points stored) the collector is off; after it, on again; overlapping
    pauses turn it back on once, at the last one's end, and never turn on a collector that was off before."""
    import gc

    from bench_server.api.routes import sweeps
    from runners import engine

    during: list[bool] = []
    real = engine.submit_spec
    monkeypatch.setattr(sweeps, "submit_spec", lambda *a, **k: during.append(gc.isenabled()) or real(*a, **k))
    assert gc.isenabled()
    assert client.post("/api/v1/sweeps", json=spec(name="paused"), headers=auth).status_code == 201
    deadline = time.monotonic() + 10  # the dependency ends just after the answer is sent
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert during == [False] and gc.isenabled()
    pause = sweeps.CollectorPause()
    with pause:
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer submit still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with pause:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_create_sweep_refused_without_token(client: httpx.Client) -> None:
    before = client.get("/api/v1/sweeps").json()["count"]
    r = client.post("/api/v1/sweeps", json=spec())
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post("/api/v1/sweeps", json=spec(), headers={"Authorization": "Bearer not-the-token-at-all"})
    assert r.status_code == 403
    r = client.post("/api/v1/sweeps", json=spec(), headers={"Authorization": f"Basic {TOKEN}"})
    assert r.status_code == 401
    assert client.get("/api/v1/sweeps").json()["count"] == before


@pytest.mark.parametrize(("body", "loc"), [
    pytest.param(spec(modes=["none", "bogus"]), ["body", "modes"], id="unknown-mode"),
    pytest.param(spec(axes={**TINY["axes"], "T": [128, -4]}), ["body", "axes", "T", 1], id="negative-T"),
    pytest.param(spec(axes={**TINY["axes"], "lb": 0.5}), ["body", "axes", "lb"], id="positive-lb"),
    pytest.param({k: v for k, v in TINY.items() if k != "ops"}, ["body", "ops"], id="missing-ops"),
    pytest.param(spec(colour="red"), ["body", "colour"], id="unknown-field"),
    pytest.param(spec(timing={"min_samples": 10, "max_samples": 2}), ["body", "timing"], id="timing-order"),
])
def test_create_sweep_bad_spec_names_the_field(client: httpx.Client, auth: dict[str, str], body: dict[str, Any],
                                               loc: list[Any]) -> None:
    r = client.post("/api/v1/sweeps", json=body, headers=auth)
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert any(got[: len(loc)] == loc for got in locs), locs


def test_create_sweep_not_json(client: httpx.Client, auth: dict[str, str]) -> None:
    r = client.post("/api/v1/sweeps", content=b"name: tiny", headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 422


def test_create_sweep_limits(client: httpx.Client, auth: dict[str, str]) -> None:
    huge = spec(tags=["x" * 1000] * 1100)  # ~1.1 MB of body, over the 1 MiB default
    r = client.post("/api/v1/sweeps", json=huge, headers=auth)
    assert r.status_code == 413 and "CPBENCH_MAX_BODY_BYTES" in r.json()["detail"]
    grid = spec(axes={**TINY["axes"], "T": list(range(64, 64 * 101, 64)), "lb": [-0.1 * i for i in range(1, 31)]},
                modes=["none", "true_cp", "ring", "all_gather"])  # 100 T x 30 lb x 4 modes x 2 W = 24000 points
    r = client.post("/api/v1/sweeps", json=grid, headers=auth)
    assert r.status_code == 413 and "24000" in r.json()["detail"]


def test_read_sweeps_pagination(client: httpx.Client, auth: dict[str, str]) -> None:
    ids = [client.post("/api/v1/sweeps", json=spec(name=f"page-{i}", tags=["paging"]), headers=auth).json()["id"]
           for i in range(3)]
    page = client.get("/api/v1/sweeps", params={"tag": "paging", "limit": 2}).json()
    assert page["count"] == 3 and [s["id"] for s in page["data"]] == ids[::-1][:2]  # newest first
    rest = client.get("/api/v1/sweeps", params={"tag": "paging", "skip": 2, "limit": 2}).json()
    assert [s["id"] for s in rest["data"]] == [ids[0]]
    assert all(s["progress"]["total"] == s["n_points"] for s in page["data"])
    assert client.get("/api/v1/sweeps", params={"limit": 0}).status_code == 422


def test_read_sweep_not_found(client: httpx.Client) -> None:
    r = client.get("/api/v1/sweeps/999999")
    assert r.status_code == 404 and r.json() == {"detail": "Sweep not found"}


def test_cancel_sweep(client: httpx.Client, auth: dict[str, str]) -> None:
    sweep = client.post("/api/v1/sweeps", json=spec(name="to-cancel"), headers=auth).json()
    assert client.post(f"/api/v1/sweeps/{sweep['id']}/cancel").status_code == 401
    r = client.post(f"/api/v1/sweeps/{sweep['id']}/cancel", headers=auth)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "cancelled" and body["cancelled_points"] == sweep["progress"]["queued"]
    assert body["progress"]["queued"] == 0 and body["progress"]["cancelled"] == sweep["progress"]["queued"]
    assert client.post("/api/v1/sweeps/999999/cancel", headers=auth).status_code == 404


def test_healthz_and_openapi(client: httpx.Client) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["db"] == "ok"
    schema = client.get("/api/v1/openapi.json").json()
    ops = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {"sweeps-create_sweep", "sweeps-read_sweeps", "sweeps-read_sweep", "sweeps-cancel_sweep",
            "results-read_results", "configs-export_configs", "workers-read_workers"} <= ops
    assert client.get("/docs").status_code == 200


def test_create_app_refuses_unmigrated_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(StoreNotMigratedError, match="cpbench db upgrade"):
        create_app(ServerSettings(DATABASE_URL=url, API_TOKEN=TOKEN))
    dispose_engine(url)


def test_token_generated_once_and_reused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'cpbench.db'}"
    upgrade(url)
    settings = ServerSettings(DATABASE_URL=url, API_TOKEN=None)
    with caplog.at_level(logging.WARNING, logger="bench_server.core.security"):
        app = create_app(settings)
    token = app.state.api_token
    path = tmp_path / "db" / ".cpbench" / "api_token"
    assert app.state.token_source == "generated" and path.read_text().strip() == token and len(token) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sum(token in rec.getMessage() for rec in caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bench_server.core.security"):
        again = create_app(settings)
    assert again.state.api_token == token and again.state.token_source == "file"
    assert not any(token in rec.getMessage() for rec in caplog.records)
    with LiveServer(again) as live:
        r = httpx.post(f"{live.url}/api/v1/sweeps", json=spec(), headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201
    dispose_engine(url)


def test_reads_closed(store_url: str) -> None:
    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN, READS_OPEN=False))
    with LiveServer(app) as live, httpx.Client(base_url=live.url) as c:
        assert c.get("/api/v1/sweeps").status_code == 401
        assert c.get("/api/v1/results").status_code == 401
        assert c.get("/").status_code == 401
        assert c.get("/api/v1/sweeps", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/healthz").status_code == 200
