"""Security and disclosure of the API, over HTTP where it is served.

Scenarios:
- the token file: a token shorter than CPBENCH_API_TOKEN's minimum (or an empty file) is refused in one line that
  does not show it; a file other users can read is refused with the `chmod 600` that fixes it;
- a too-short CPBENCH_API_TOKEN is refused without echoing it;
- /api/v1/results (JSON and CSV) hides the worker (host:pid) and the host from anonymous readers, as /workers does,
  and shows them with the token;
- a failed point's error over the API is its summary and the exception's last line: no frames, no install paths;
- the OpenAPI schema says reads are open (the token optional on GETs) unless CPBENCH_READS_OPEN=false, and gives
  the grid limit.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bench_server.core.config import ServerSettings
from bench_server.core.security import TokenFileError
from bench_server.live import LiveServer
from bench_server.main import create_app
from db import crud
from db.session import dispose_engine, session_scope
from runners.settings import get_worker_settings
from tests.bench_server.conftest import TOKEN
from tests.dashboards.seed import point

TRACEBACK = (
    "rank 1: ValueError: the chunk size must divide T, got T=100\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/venvs/cpbench-4f2a/lib/python3.11/site-packages/runners/gang.py", line 131, in _serve\n'
    "    out = job(rank)\n"
    '  File "/home/alice/src/cpbench/kernels/cp/true_cp.py", line 88, in forward\n'
    "    raise ValueError(msg)\n"
    "ValueError: the chunk size must divide T, got T=100"
)


@pytest.fixture
def fresh_url(tmp_path: Path, migrated_sqlite: Callable[[Path], str]) -> str:
    return migrated_sqlite(tmp_path / "db")


def _token_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "api_token"
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize(
    ("text", "what"),
    [("zq\n", "holds a token of 2 characters"), ("\n", "is empty"), ("Qz" * 7 + "Q", "holds a token of 15 characters")],
)
def test_short_token_file_is_refused_in_one_line(tmp_path: Path, fresh_url: str, text: str, what: str) -> None:
    path = _token_file(tmp_path, text, 0o600)
    with pytest.raises(TokenFileError) as err:
        create_app(ServerSettings(DATABASE_URL=fresh_url, TOKEN_FILE=path))
    message = str(err.value)
    assert "\n" not in message and what in message and "at least 16" in message
    assert text.strip() == "" or text.strip() not in message.replace(str(path), "")
    dispose_engine(fresh_url)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_token_file_readable_by_others_is_refused_with_the_chmod(tmp_path: Path, fresh_url: str, mode: int) -> None:
    token = "k" * 40
    path = _token_file(tmp_path, token, mode)
    with pytest.raises(TokenFileError, match=r"run `chmod 600 .*api_token`") as err:
        create_app(ServerSettings(DATABASE_URL=fresh_url, TOKEN_FILE=path))
    assert token not in str(err.value) and f"mode {mode:o}" in str(err.value)
    os.chmod(path, 0o600)
    assert create_app(ServerSettings(DATABASE_URL=fresh_url, TOKEN_FILE=path)).state.api_token == token
    dispose_engine(fresh_url)


def test_short_env_token_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPBENCH_API_TOKEN", "hunter2-secret")
    with pytest.raises(ValidationError) as err:
        ServerSettings()
    assert "at least 16 characters, got 14" in str(err.value) and "hunter2" not in str(err.value)


@pytest.fixture(scope="module")
def measured(store_url: str, server: Any) -> int:
    with session_scope(store_url) as s:
        env = crud.get_or_create_environment(
            s,
            facts={
                "device_name": "cpu",
                "torch": "2.13.0",
                "python": "3.11",
                "cpbench": "0.1.0",
                "host": "gpu-node-17.internal",
            },
        )
        s.flush()
        pts = [point(0, mode="none", W=1, T=256, B=1, lb=-1.0), point(1, mode="ring", W=2, T=256, B=1, lb=-1.0)]
        sweep = crud.create_sweep(s, name="disclosure", tags=[], spec={"name": "disclosure"}, points=pts)
        done, failed = sweep.points
        crud.store_measurement(
            s,
            point_id=done.id,
            environment_id=env.id,
            worker="gpu-node-17.internal:4242",
            clock="wall",
            samples=[1.0, 1.1],
            stop_reason="converged",
            err_vs_none=None,
            err_vs_reference=1e-3,
            summary={
                "median_ms": 1.05,
                "p10_ms": 1.0,
                "p90_ms": 1.1,
                "iqr_ms": 0.1,
                "mean_ms": 1.05,
                "min_ms": 1.0,
                "max_ms": 1.1,
                "n": 2,
            },
        )
        done.status, failed.status, failed.error = "done", "failed", TRACEBACK
        return sweep.id


def _rows(client: httpx.Client, sweep_id: int, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return client.get("/api/v1/results", params={"sweep": sweep_id}, headers=headers).json()["data"]


def test_results_hide_worker_and_host_from_anonymous_readers(
    client: httpx.Client, auth: dict[str, str], measured: int
) -> None:
    [anonymous, _] = _rows(client, measured)
    assert anonymous["status"] == "done" and anonymous["worker"] is None and anonymous["host"] is None
    [trusted, _] = _rows(client, measured, auth)
    assert trusted["worker"] == "gpu-node-17.internal:4242" and trusted["host"] == "gpu-node-17.internal"
    text = client.get("/api/v1/results", params={"sweep": measured, "format": "csv"}).text
    assert "gpu-node-17" not in text and "4242" not in text
    [row, _] = list(csv.DictReader(io.StringIO(text)))
    assert row["worker"] == "" and row["host"] == ""
    wrong = _rows(client, measured, {"Authorization": "Bearer not-the-token-0123456789"})
    assert wrong[0]["worker"] is None


def test_failed_point_error_has_no_traceback(client: httpx.Client, auth: dict[str, str], measured: int) -> None:
    for headers in (None, auth):
        [_, failed] = _rows(client, measured, headers)
        assert failed["error"] == ("rank 1: ValueError: the chunk size must divide T, got T=100")
        assert "File " not in failed["error"] and "site-packages" not in failed["error"]
    assert crud.short_error(
        'rank 0: RuntimeError: boom\nTraceback (most recent call last):\n  File "/x.py", line 1\n'
        "KeyError: 'k'\n\nDuring handling of the above exception, another exception occurred:\n\n"
        "RuntimeError: boom (while cleaning up)"
    ) == ("rank 0: RuntimeError: boom\nRuntimeError: boom (while cleaning up)")
    assert crud.short_error("the gang did not start in 60 s") == "the gang did not start in 60 s"


@pytest.mark.parametrize("reads_open", [True, False])
def test_openapi_says_the_read_policy_and_the_grid_limit(store_url: str, reads_open: bool) -> None:
    app = create_app(ServerSettings(DATABASE_URL=store_url, API_TOKEN=TOKEN, READS_OPEN=reads_open))
    with LiveServer(app) as live:
        schema = httpx.get(f"{live.url}/api/v1/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    description = schema["info"]["description"]
    assert "CPBENCH_READS_OPEN=false" in description
    assert f"at most {get_worker_settings().MAX_POINTS_PER_SWEEP} points" in description
    reads = schema["paths"]["/api/v1/results"]["get"]["security"]
    assert ({} in reads) is reads_open and {"HTTPBearer": []} in reads
    assert {} not in schema["paths"]["/api/v1/sweeps"]["post"]["security"]
    assert "CPBENCH_MAX_POINTS_PER_SWEEP" in schema["paths"]["/api/v1/sweeps"]["post"]["responses"]["413"]["description"]
    assert schema["paths"]["/api/v1/sweeps"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SweepSpec"
    }
    assert "axes" in schema["components"]["schemas"]["SweepSpec"]["properties"]
