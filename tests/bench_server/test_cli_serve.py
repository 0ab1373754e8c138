"""`cpbench serve` as a user runs it (a subprocess on 127.0.0.1, port 0).

Scenarios: an unmigrated store is refused with one line and exit 1; the first start prints the generated token
once and later starts reuse it silently; the printed dashboard URL answers /healthz and accepts writes with that
token; `--demo` on an empty store queues the demo sweep, starts a worker that registers itself, and SIGTERM stops
the server together with its worker; the submit process starts with the server, answers a large body, and SIGTERM
leaves no child behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from bench_server.serve import DEMO_SPEC
from db.migrate import upgrade
from db.session import dispose_engine

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPBENCH_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from bench_server.cli import main; main()", "serve", "--host", "127.0.0.1", "--port", "0", *args]


@contextmanager
def serving(*args: str, cwd: Path) -> Iterator[tuple[str, list[str]]]:
    """Start `cpbench serve`; yield (base URL, stdout lines so far); SIGTERM and wait at the end."""
    proc = subprocess.Popen(_cmd(*args), cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        base = None
        while base is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if m := re.match(r"dashboard: (http://127\.0\.0\.1:\d+)/", line):
                base = m.group(1)
        assert base is not None, "\n".join(lines)
        for _ in range(200):
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def test_serve_refuses_unmigrated_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    done = subprocess.run(_cmd("--db", url), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "cpbench db upgrade" in done.stderr and "Traceback" not in done.stderr


def test_serve_prints_generated_token_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'cpbench.db'}"
    upgrade(url)
    dispose_engine(url)
    with serving("--db", url, cwd=tmp_path) as (base, lines):
        printed = [ln for ln in lines if ln.startswith("API token")]
        assert len(printed) == 1
        token = printed[0].rsplit(" ", 1)[1]
        assert (tmp_path / "store" / ".cpbench" / "api_token").read_text().strip() == token
        r = httpx.post(base + "/api/v1/sweeps/1/cancel", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 404  # authorised; there is no sweep 1
        assert httpx.post(base + "/api/v1/sweeps/1/cancel").status_code == 401
    with serving("--db", url, cwd=tmp_path) as (_, lines):
        assert not any(ln.startswith("API token") for ln in lines)


@pytest.mark.skipif(not DEMO_SPEC.is_file(), reason="runners/suites/demo.yaml not shipped yet")
def test_serve_demo_queues_sweep_and_starts_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)
    dispose_engine(url)
    with serving("--db", url, "--demo", cwd=tmp_path) as (base, lines):
        assert any(re.match(r"demo: sweep \d+ queued", ln) for ln in lines), lines
        sweeps = httpx.get(base + "/api/v1/sweeps").json()
        assert sweeps["count"] == 1 and sweeps["data"][0]["n_points"] > 0
        deadline = time.monotonic() + 60
        while not httpx.get(base + "/api/v1/workers").json()["count"] and time.monotonic() < deadline:
            time.sleep(0.5)
        workers = httpx.get(base + "/api/v1/workers").json()["data"]
        assert len(workers) == 1 and workers[0]["alive"]
    # the server stopped its worker on the way out
    from db import crud
    from db.session import session_scope

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with session_scope(url) as s:
            if [w.status for w in crud.list_workers(s)] == ["stopped"]:
                break
        time.sleep(0.5)
    with session_scope(url) as s:
        assert [w.status for w in crud.list_workers(s)] == ["stopped"]
    dispose_engine(url)


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of each child of `pid`."""
    out = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            pass
    return out


def _gone(pids: Iterable[int], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(Path(f"/proc/{p}").exists() for p in pids)


def test_serve_starts_the_submit_process_and_stops_it(tmp_path: Path) -> None:
    """The submit process starts with the server, answers a large body, and is gone when SIGTERM has stopped it
    (with multiprocessing's resource tracker, the server's other child)."""
    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)
    dispose_engine(url)
    env = {**_env(), "CPBENCH_API_TOKEN": "serve-token-0123456789abcdef"}
    proc = subprocess.Popen(_cmd("--db", url), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        assert proc.stdout is not None
        base = next((m.group(1) for line in proc.stdout if (m := re.match(r"dashboard: (http://[^/]+)/", line))), None)
        assert base is not None
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain its log
        deadline = time.monotonic() + 60
        while not (kids := _children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        submitters = [pid for pid, cmd in kids.items() if "spawn_main" in cmd]
        assert len(submitters) == 1, kids  # started with the server, before any body
        body = {"name": "big", "ops": ["gdn"], "modes": ["none"], "axes": {"H": 1, "K": 16, "V": 16, "lengths": [[1] * 80_000]}}
        r = httpx.post(base + "/api/v1/sweeps", json=body, timeout=120,
                       headers={"Authorization": "Bearer serve-token-0123456789abcdef"})
        assert r.status_code == 201 and r.json()["n_points"] == 1
        assert _children(proc.pid) == kids
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0
    assert _gone(kids)
