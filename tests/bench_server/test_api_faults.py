"""The API under faults and hostile bodies, over real HTTP.

Scenarios:
- `cpbench serve`'s listening socket (`bench_server.serve._bind`): the connection uvicorn accepted from a kept-alive
  client has TCP_NODELAY (without it each kept-alive answer waits ~40 ms on Nagle and delayed ACKs);
- an SQLite write lock held by another process: a POST waits at most CPBENCH_STORE_WAIT_S, then gets 503 JSON with
  Retry-After (not 30 s and a 500 text/plain); reads go on (WAL);
- a real PostgreSQL stop (a cluster of the test's own): every data route and /healthz answer 503 JSON with
  Retry-After, and 200 again once it is back;
- a lone surrogate ("\\ud800") anywhere in a POSTed spec is a 422 JSON, never a 500;
- a valid 1 MiB spec (one long varlen length list) is accepted, and /healthz answers while it is validated.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.live import LiveServer
from bench_server.main import create_app
from bench_server.serve import _bind
from db.session import dispose_engine, sqlite_path
from tests.bench_server.conftest import AUTH, TOKEN

TINY = {
    "name": "tiny",
    "ops": ["gdn"],
    "modes": ["none"],
    "backends": ["torch"],
    "axes": {"T": [64], "H": 1, "K": 16, "V": 16},
}


def _data_routes(sweep_id: int) -> list[tuple[str, str]]:
    return [
        ("GET", "/api/v1/results"),
        ("GET", "/api/v1/sweeps"),
        ("GET", f"/api/v1/sweeps/{sweep_id}"),
        ("GET", "/api/v1/workers"),
        ("POST", "/api/v1/sweeps"),
        ("POST", f"/api/v1/sweeps/{sweep_id}/cancel"),
    ]


def _assert_503(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.request.method, r.request.url.path, r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json" and int(r.headers["retry-after"]) > 0
    assert r.json() in (
        {"detail": "store unavailable; retry later"},
        {"status": "degraded", "db": "store unavailable", "version": r.json().get("version")},
    )


def test_accepted_connections_have_tcp_nodelay(store_url: str) -> None:
    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN))
    with LiveServer(app, sock=_bind("127.0.0.1", 0)) as live, httpx.Client(base_url=live.url) as client:
        for _ in range(3):  # one kept-alive connection
            assert client.get("/healthz").status_code == 200
        connections = list(live.server.server_state.connections)
        assert len(connections) == 1
        sock = connections[0].transport.get_extra_info("socket")  # the server's end, as accepted
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.fixture
def quick_store(tmp_path: Path, migrated_sqlite: Callable[[Path], str]) -> Iterator[str]:
    url = migrated_sqlite(tmp_path / "locked")
    yield url
    dispose_engine(url)


def test_post_during_a_held_sqlite_lock_is_503_after_the_bounded_wait(quick_store: str) -> None:
    app = create_app(ServerSettings(DATABASE_URL=quick_store, API_TOKEN=TOKEN, STORE_WAIT_S=0.5))
    path = sqlite_path(quick_store)
    assert path is not None
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        conn.execute("ROLLBACK")
        conn.close()

    holder = threading.Thread(target=hold, daemon=True)
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        created = client.post("/api/v1/sweeps", json=TINY, headers=AUTH)
        assert created.status_code == 201, created.text
        holder.start()
        try:
            assert locked.wait(10)
            started = time.monotonic()
            r = client.post("/api/v1/sweeps", json=TINY, headers=AUTH)
            waited = time.monotonic() - started
            _assert_503(r)
            assert waited < 10.0, waited  # bounded by STORE_WAIT_S (0.5 s), not SQLite's 30 s busy timeout
            _assert_503(client.post(f"/api/v1/sweeps/{created.json()['id']}/cancel", headers=AUTH))
            assert client.get("/api/v1/results").status_code == 200  # WAL: reads go on under the write lock
        finally:
            release.set()
            holder.join(10)
        assert client.post("/api/v1/sweeps", json=TINY, headers=AUTH).status_code == 201


@pytest.mark.postgres
def test_every_data_route_is_503_json_during_a_postgres_stop() -> None:
    from db.migrate import upgrade
    from tests.utils.pg_cluster import ScratchCluster

    cluster = ScratchCluster()
    try:
        upgrade(cluster.url)
        app = create_app(ServerSettings(DATABASE_URL=cluster.url, API_TOKEN=TOKEN, STORE_WAIT_S=2))
        with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=60) as client:
            created = client.post("/api/v1/sweeps", json=TINY, headers=AUTH)
            assert created.status_code == 201, created.text
            routes = _data_routes(created.json()["id"])
            cluster.stop("fast")
            for method, path in routes:
                _assert_503(client.request(method, path, headers=AUTH, json=TINY if method == "POST" else None))
            _assert_503(client.get("/healthz"))
            cluster.start()
            assert client.get("/healthz").status_code == 200
            for method, path in routes:
                r = client.request(method, path, headers=AUTH, json=TINY if method == "POST" else None)
                assert r.status_code in (200, 201), (path, r.status_code, r.text[:200])
    finally:
        dispose_engine(cluster.url)
        cluster.destroy()


@pytest.mark.parametrize("where", ["name", "tag", "mode", "mode_option", "unknown_field"])
def test_lone_surrogate_in_a_body_is_422_json(client: httpx.Client, auth: dict[str, str], where: str) -> None:
    body = json.dumps({**TINY, "tags": ["t"]})
    target = {"name": '"tiny"', "tag": '"t"', "mode": '"none"', "mode_option": None, "unknown_field": None}[where]
    if target is not None:
        text = body.replace(target, '"\\ud800"', 1)
    elif where == "mode_option":
        text = body[:-1] + ', "mode_options": {"\\ud800": {"x": "\\udfff"}}}'
    else:
        text = body[:-1] + ', "\\ud800": 1}'
    r = client.post("/api/v1/sweeps", content=text.encode(), headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json" and r.json()["detail"]


def test_one_mib_spec_is_accepted_while_healthz_answers(client: httpx.Client, auth: dict[str, str]) -> None:
    lengths = [1] * 340_000  # one varlen batch of 340,000 one-token sequences: ~1 MiB of JSON
    body = json.dumps({**TINY, "axes": {**TINY["axes"], "T": None, "lengths": [lengths]}}).encode()
    assert 0.9 * 2**20 < len(body) <= 2**20
    answers: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as other:
            while not done.is_set():
                started = time.monotonic()
                assert other.get("/healthz").status_code == 200
                answers.append(time.monotonic() - started)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        r = client.post("/api/v1/sweeps", content=body, headers={**auth, "Content-Type": "application/json"})
    finally:
        done.set()
        prober.join(30)
    assert r.status_code == 201, r.text[:300]
    assert r.json()["n_points"] == 1 and answers  # /healthz was answered meanwhile (its latency: benchmarks/)
