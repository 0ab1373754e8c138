"""The submit process (`bench_server.core.submit_pool`) over HTTP, on a real SQLite store.

- Every body answered through the submit process gets the same status and the same JSON as in the server's own
  process (two apps on one store: CPBENCH_SUBMIT_POOL_BYTES=0 and CPBENCH_SUBMIT_POOL=false): valid specs (a
  varlen one of ~0.3 MiB), a bad field, a missing one, text that is not JSON, a lone surrogate (refused by the
  store), a grid over the points limit (413);
- the default threshold sends a large body there and a small one not;
- the child killed with SIGKILL, idle or in the middle of a 10,000-list submit: the next answer, and the one in
  flight, are 201, from a new child, and the sweep is stored once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench_server.core.config import ServerSettings
from bench_server.core.submit_pool import SubmitPool
from bench_server.live import LiveServer
from bench_server.main import create_app
from tests.bench_server.conftest import AUTH, TOKEN
from tests.bench_server.test_api_sweeps import TINY, spec

JSON = {**AUTH, "Content-Type": "application/json"}
VOLATILE = ("id", "created_at")  # differ between two sweeps stored from one body


def _varlen(n_lists: int, length: int, name: str) -> dict[str, Any]:
    return spec(
        name=name,
        modes=["none"],
        axes={"H": 1, "K": 16, "V": 16, "lengths": [[i + 1] + [1] * (length - 1) for i in range(n_lists)]},
    )


@pytest.fixture(scope="module")
def two_servers(store_url: str) -> Iterator[tuple[LiveServer, LiveServer]]:
    """(every body in the submit process, every body in the server's process), on one store."""
    pooled = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN, SUBMIT_POOL_BYTES=0))
    local = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN, SUBMIT_POOL=False))
    assert local.state.submit_pool is None
    with LiveServer(pooled) as a, LiveServer(local) as b:
        yield a, b
    pooled.state.submit_pool.close()


def _pool(server: LiveServer) -> SubmitPool:
    return server.server.config.app.state.submit_pool  # type: ignore[no-any-return]


def _answer(server: LiveServer, body: bytes) -> tuple[int, Any]:
    r = httpx.post(server.url + "/api/v1/sweeps", content=body, headers=JSON, timeout=120)
    assert r.headers["content-type"] == "application/json", r.text
    content = r.json()
    if r.status_code == 201:
        content = {k: v for k, v in content.items() if k not in VOLATILE}
    return r.status_code, content


BODIES = {
    "valid": json.dumps(spec(name="same")),
    "valid varlen 0.3 MiB": json.dumps(_varlen(1, 100_000, "varlen")),
    "bad field": json.dumps(spec(modes=["none", "bogus"], axes={**TINY["axes"], "T": [128, -4]})),
    "missing field": json.dumps({k: v for k, v in TINY.items() if k != "ops"}),
    "not JSON": "name: tiny",
    "lone surrogate": json.dumps(spec(name="bad \ud800 name")),
    "over the points limit": json.dumps(
        spec(
            axes={**TINY["axes"], "T": list(range(64, 64 * 101, 64)), "lb": [-0.1 * i for i in range(1, 31)]},
            modes=["none", "true_cp", "ring", "all_gather"],
        )
    ),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_the_submit_process_answers_as_the_server_does(two_servers: tuple[LiveServer, LiveServer], name: str) -> None:
    pooled, local = two_servers
    raw = BODIES[name].encode("utf-8", "surrogatepass")
    got, expected = _answer(pooled, raw), _answer(local, raw)
    assert got == expected
    assert got[0] == {"valid": 201, "valid varlen 0.3 MiB": 201, "over the points limit": 413}.get(name, 422), got
    assert _pool(pooled).pid is not None  # it was the child that answered


def test_the_default_threshold_sends_only_large_bodies(store_url: str) -> None:
    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN))
    pool = app.state.submit_pool
    assert pool.min_bytes == 128 << 10
    try:
        with LiveServer(app) as live:
            assert _answer(live, json.dumps(spec(name="small")).encode())[0] == 201
            assert pool.pid is None  # small: in the server's process, and nothing started it (no lifespan here)
            big = json.dumps(_varlen(1, 60_000, "big")).encode()
            assert len(big) >= pool.min_bytes
            assert _answer(live, big)[0] == 201
            assert pool.pid is not None
    finally:
        pool.close()
    assert pool.pid is None


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True  # a zombie: dead, not yet reaped
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def _stored(server: LiveServer, name: str) -> int:
    sweeps = httpx.get(server.url + "/api/v1/sweeps", params={"limit": 500}, timeout=60).json()["data"]
    return sum(s["name"] == name for s in sweeps)


def test_a_killed_child_is_replaced_and_no_request_hangs(two_servers: tuple[LiveServer, LiveServer]) -> None:
    pooled, _ = two_servers
    pool = _pool(pooled)
    assert _answer(pooled, json.dumps(spec(name="warm")).encode())[0] == 201
    idle = pool.pid
    assert idle is not None
    os.kill(idle, signal.SIGKILL)  # idle: the next body starts a new child
    assert _gone(idle)
    assert _answer(pooled, json.dumps(spec(name="after-idle-kill")).encode())[0] == 201
    busy = pool.pid
    assert busy not in (None, idle)

    restarts = pool.restarts
    body = json.dumps(_varlen(10_000, 32, "killed-mid-submit")).encode()  # about 1 s of the child's work
    answer: list[tuple[int, Any]] = []
    poster = threading.Thread(target=lambda: answer.append(_answer(pooled, body)))
    idle_ticks = _cpu_ticks(busy)
    poster.start()
    deadline = time.monotonic() + 60
    while _cpu_ticks(busy) < idle_ticks + 5 and time.monotonic() < deadline:  # 50 ms of CPU into the body
        time.sleep(0.005)
    os.kill(busy, signal.SIGKILL)
    poster.join(timeout=120)
    assert not poster.is_alive()
    assert answer and answer[0][0] == 201, answer
    assert answer[0][1]["n_points"] == 10_000
    assert pool.restarts == restarts + 1 and pool.pid not in (None, busy)
    assert _stored(pooled, "killed-mid-submit") == 1
