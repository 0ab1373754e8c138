"""`cpbench run` beside a live worker on the same store: the run works all of its own points, and the live worker
never claims them (the run owns its sweep); the live worker still works an open sweep submitted meanwhile.

The live worker is a `cpbench worker` process polling every 0.1 s, so without ownership it would take points of the
run's sweep as soon as they are queued.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runners.engine_fixtures import REPO, store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli

pytestmark = pytest.mark.multiproc


def _wait(what: str, ok, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_run_beside_live_worker(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    from db import crud
    from db.session import session_scope

    def live_worker(name: str | None) -> bool:  # a worker's identity is its --name plus a pid and a random suffix
        return bool(name) and name.split(":")[0] == "live-worker"

    def workers() -> set[str]:
        with session_scope(store_url) as s:
            return {w.name for w in crud.list_workers(s)}

    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "CPBENCH_POLL_S": "0.1"}
    live = subprocess.Popen([sys.executable, "-m", "runners.cli", "worker", "--db", store_url, "--cpu", "--devices", "1",
                             "--name", "live-worker"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait("the live worker", lambda: any(live_worker(n) for n in workers()))
        spec = write_spec(tmp_path, axes={"T": [64, 128, 192, 256], "H": 1, "K": 16, "V": 16})
        code, out, err = _cli("run", str(spec), "--db", store_url, "--cpu", "--devices", "1", "--format", "json")
        assert code == 0, err
        rows = json.loads(out)
        assert len(rows) == 4 and {r["status"] for r in rows} == {"done"}
        assert not any(live_worker(r["worker"]) for r in rows)  # every point timed by the run's own worker
        # the live worker is alive and claims open sweeps
        code, out, err = _cli("submit", str(write_spec(tmp_path, "open.yaml", axes={"T": 64, "H": 1, "K": 16, "V": 16})),
                              "--db", store_url)
        assert code == 0, err
        open_id = int(out.split()[-1])  # the id is the last line

        def open_done() -> bool:
            with session_scope(store_url) as s:
                return crud.get_sweep(s, sweep_id=open_id).status == "done"

        _wait("the open sweep", open_done)
        with session_scope(store_url) as s:
            got, _ = crud.list_results(s, sweep_id=open_id)
        assert len(got) == 1 and live_worker(got[0]["worker"])
    finally:
        live.terminate()
        try:
            live.wait(60)
        except subprocess.TimeoutExpired:
            live.kill()
