"""Hostile input to the API (issue 17 §4-6, §9): every bad input is a 4xx whose body is valid JSON, validation is
linear in the body, the public /healthz discloses nothing, and every answer carries the security headers.

Each test is named after the defect it guards. The store is the module's SQLite one (`conftest`); the fuzz tests
(`test_fuzz`) cover PostgreSQL's column ranges too.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from bench_server.core.hardening import CSP

VALID: dict[str, Any] = {"name": "ok", "ops": ["gdn"], "modes": ["none"], "axes": {"T": [64], "H": 2, "K": 16, "V": 16}}


def _post(client: httpx.Client, auth: dict[str, str], body: str) -> httpx.Response:
    return client.post("/api/v1/sweeps", content=body, headers={**auth, "Content-Type": "application/json"})


def _strict_json(text: str) -> Any:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def _with(path: str, value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(VALID))
    *parents, key = path.split(".")
    node = body
    for p in parents:
        node = node.setdefault(p, {})
    node[key] = value
    return body


@pytest.mark.parametrize("path, literal", [("axes.lb", "NaN"), ("axes.lb", "-Infinity"), ("timing.timeout_s", "Infinity"),
                                           ("timing.min_time_s", "NaN"), ("check.tol_none", "Infinity")])
def test_non_finite_numbers_get_422_with_valid_json(client: httpx.Client, auth: dict[str, str], path: str, literal: str) -> None:
    body = json.dumps(_with(path, "@@")).replace('"@@"', literal)
    r = _post(client, auth, body)
    assert r.status_code == 422
    assert "finite" in json.dumps(_strict_json(r.text))


@pytest.mark.parametrize("path", ["axes.B", "axes.T", "axes.H", "seeds", "repetitions", "timing.max_samples"])
def test_integers_past_int64_get_422(client: httpx.Client, auth: dict[str, str], path: str) -> None:
    r = _post(client, auth, json.dumps(_with(path, [2**64 + 5] if path != "repetitions" else 2**64 + 5)))
    assert r.status_code == 422, r.text
    _strict_json(r.text)


@pytest.mark.parametrize("params", [{"sweep": 2**64}, {"skip": 2**64}, {"B": 2**70}, {"T": 2**64}, {"lb": "nan"}])
def test_query_integers_past_the_columns_get_422(client: httpx.Client, params: dict[str, Any]) -> None:
    r = client.get("/api/v1/results", params=params)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("url", [f"/api/v1/sweeps/{2**64}", f"/api/v1/sweeps/{2**31}", f"/sweeps/{2**64}"])
def test_path_ids_past_the_columns_get_422(client: httpx.Client, url: str) -> None:
    assert client.get(url).status_code == 422


def test_int32_columns_are_range_checked_before_the_store(client: httpx.Client, auth: dict[str, str]) -> None:
    r = _post(client, auth, json.dumps(_with("axes.H", 2**40)))
    assert r.status_code == 422 and "H" in r.text


@pytest.mark.parametrize("path, value", [("name", "a\u0000b"), ("tags", ["x\u0000"]), ("mode_options", {"ring": {"x": "\u0000"}})])
def test_nul_in_text_gets_422(client: httpx.Client, auth: dict[str, str], path: str, value: Any) -> None:
    r = _post(client, auth, json.dumps(_with(path, value)))
    assert r.status_code == 422 and "NUL" in r.text


@pytest.mark.parametrize("query", ["status=a%00b", "device=%00", "tag=%00"])
def test_nul_in_the_url_gets_422(client: httpx.Client, query: str) -> None:
    path = "/api/v1/sweeps" if query.startswith("tag") else "/api/v1/results"
    r = client.get(f"{path}?{query}")
    assert r.status_code == 422 and "NUL" in r.text


@pytest.mark.parametrize("path, value", [("axes.T", True), ("axes.B", [True]), ("axes.lb", False), ("timing.min_samples", True),
                                         ("repetitions", True), ("seeds", [False])])
def test_booleans_are_not_numbers(client: httpx.Client, auth: dict[str, str], path: str, value: Any) -> None:
    assert _post(client, auth, json.dumps(_with(path, value))).status_code == 422


@pytest.mark.parametrize("path, value", [("axes.B", 10**6), ("axes.H", 5000), ("axes.K", 4096), ("axes.V", 4096),
                                         ("timing.min_time_s", 1e6), ("timing.timeout_s", 1e9), ("timing.max_samples", 10**9),
                                         ("timing.warmup_s", 1e5)])
def test_every_numeric_field_has_an_upper_bound(client: httpx.Client, auth: dict[str, str], path: str, value: Any) -> None:
    r = _post(client, auth, json.dumps(_with(path, value)))
    assert r.status_code == 422 and "limit" in r.text, r.text


@pytest.mark.timeout(60)
def test_duplicate_check_is_linear_not_quadratic(client: httpx.Client, auth: dict[str, str]) -> None:
    # 200k distinct values: quadratic checking would take hours; linear takes well under a second
    r = _post(client, auth, json.dumps(_with("axes.T", list(range(1, 200_001)))))
    assert r.status_code in (413, 422)
    r = _post(client, auth, json.dumps(_with("axes.T", [64] * 15_000)))  # under the points limit: checked value by value
    assert r.status_code == 422 and "twice" in r.text


def test_healthz_does_not_disclose_the_store_error(store_url: str) -> None:
    from fastapi.testclient import TestClient

    from bench_server.core.config import ServerSettings
    from bench_server.main import create_app
    from db.session import get_sessionmaker

    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN="t" * 24))
    app.state.sessionmaker = get_sessionmaker("postgresql+psycopg://spy:hunter2@127.0.0.1:9/secretdb?connect_timeout=1")
    with TestClient(app) as c:
        r = c.get("/healthz")
    assert r.status_code == 503
    assert r.json()["db"] == "store unavailable"
    for secret in ("127.0.0.1", ":9", "hunter2", "secretdb", "spy", "psycopg", "Error"):
        assert secret not in r.text


@pytest.mark.parametrize("path", ["/", "/docs", "/api/v1/sweeps", "/healthz", "/static/plotly.min.js", "/no-such-page"])
def test_security_headers_on_every_answer(client: httpx.Client, path: str) -> None:
    r = client.get(path)
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["content-security-policy"] == CSP
    assert "frame-ancestors 'none'" in CSP and "object-src 'none'" in CSP
