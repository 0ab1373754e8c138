"""Query parameters over HTTP: the `direction` filter of /api/v1/results, and 422 (never a silent 200) for a
parameter a route does not take or a value outside the vocabulary, on every API route and /healthz.

Scenarios: a sweep holding fwd and fwd+bwd points filtered by direction keeps exactly the matching rows; `foo=`,
`modes=`, `direction=` on a route without them are 422 naming the parameter and the route's own ones; `mode=nosuch`
is a 422 naming the allowed modes; an empty or unknown op / direction / status is 422.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from db import crud
from db.session import session_scope
from kernels.vocabulary import MODES
from tests.dashboards.seed import point


@pytest.fixture(scope="module")
def two_directions(store_url: str, server: Any) -> int:
    with session_scope(store_url) as s:
        pts = []
        for idx, direction in enumerate(("fwd", "fwd+bwd", "fwd", "fwd+bwd", "fwd")):
            p = {**point(idx, mode="none", W=1, T=256 * (idx + 1), B=1, lb=-1.0), "direction": direction}
            p["key"] += f"/dir={direction}"
            pts.append(p)
        return crud.create_sweep(s, name="dirs", tags=[], spec={"name": "dirs"}, points=pts).id


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_results_direction_filter(client: httpx.Client, two_directions: int, direction: str) -> None:
    every = client.get("/api/v1/results", params={"sweep": two_directions}).json()["data"]
    expected = [r["id"] for r in every if r["direction"] == direction]
    assert len(every) == 5 and 0 < len(expected) < 5
    page = client.get("/api/v1/results", params={"sweep": two_directions, "direction": direction}).json()
    assert page["count"] == len(expected) and [r["id"] for r in page["data"]] == expected
    assert {r["direction"] for r in page["data"]} == {direction}


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("GET", "/api/v1/results", "foo"),
        ("GET", "/api/v1/results", "modes"),
        ("GET", "/api/v1/sweeps", "direction"),
        ("GET", "/api/v1/sweeps/1", "verbose"),
        ("GET", "/api/v1/workers", "all"),
        ("GET", "/api/v1/configs/export", "kernel"),
        ("GET", "/healthz", "deep"),
        ("POST", "/api/v1/sweeps/1/cancel", "force"),
    ],
)
def test_unknown_query_parameter_is_422(
    client: httpx.Client, auth: dict[str, str], two_directions: int, method: str, path: str, name: str
) -> None:
    r = client.request(method, path, params={name: "1"}, headers=auth)
    assert r.status_code == 422 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    [error] = r.json()["detail"]
    assert error["loc"] == ["query", name] and error["type"] == "extra_forbidden"
    assert f"unknown query parameter '{name}'" in error["msg"]


def test_unknown_query_parameter_names_the_routes_own(client: httpx.Client) -> None:
    r = client.get("/api/v1/results", params={"modes": "ring", "foo": ""})
    assert r.status_code == 422
    errors = r.json()["detail"]
    assert [e["loc"] for e in errors] == [["query", "modes"], ["query", "foo"]]
    assert "mode" in errors[0]["msg"] and "direction" in errors[0]["msg"]


def test_unknown_mode_names_the_allowed_values(client: httpx.Client) -> None:
    r = client.get("/api/v1/results", params={"mode": "nosuch"})
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["query", "mode", 0] and error["input"] == "nosuch"
    assert all(f"'{m}'" in error["msg"] for m in MODES), error["msg"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("direction", ""),
        ("direction", "bwd"),
        ("op", "nosuch"),
        ("status", "lost"),
        ("op", ""),
        ("format", "xml"),
        ("limit", "0"),
    ],
)
def test_invalid_value_is_422(client: httpx.Client, name: str, value: str) -> None:
    r = client.get("/api/v1/results", params={name: value})
    assert r.status_code == 422, (name, value, r.status_code, r.text[:200])
    assert r.json()["detail"][0]["loc"][:2] == ["query", name]


def test_known_parameters_still_answer(client: httpx.Client, two_directions: int) -> None:
    params = [
        ("sweep", two_directions),
        ("mode", "none"),
        ("mode", "ring"),
        ("op", "gdn"),
        ("backend", "torch"),
        ("status", "queued"),
        ("direction", "fwd"),
        ("skip", 0),
        ("limit", 10),
        ("format", "json"),
    ]
    r = client.get("/api/v1/results", params=params)
    assert r.status_code == 200 and r.json()["count"] == 3
    assert client.get("/api/v1/sweeps", params={"tag": "x", "skip": 0, "limit": 5}).status_code == 200
    assert client.get("/healthz").status_code == 200
