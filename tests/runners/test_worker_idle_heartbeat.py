"""A live worker with nothing to do stays `idle`, never `lost` (issue 28, item 5).

Scenario: a real `cpbench worker` process on an empty queue, its lease (the "lost" threshold) made 1.5 s through the
settings (`CPBENCH_LEASE_S`, `CPBENCH_HEARTBEAT_S`); after three lease lengths of idling, `cpbench status` lists it
`idle` and its heartbeat is younger than the lease; once SIGTERM stops it, it is `stopped`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.runners.engine_fixtures import REPO, store_url  # noqa: F401
from tests.utils.cli import cpbench as _cli

LEASE_S = 1.5


def _worker_states(url: str) -> list[tuple[str, float]]:
    """(state, heartbeat age in s) of every registered worker, as `cpbench status` and the API compute them."""
    from db import crud
    from db.clock import store_now
    from db.session import session_scope

    with session_scope(url) as s:
        now = store_now(s)
        return [(crud.worker_state(w, now, LEASE_S), (now - w.last_heartbeat).total_seconds()) for w in crud.list_workers(s)]


def test_idle_worker_heartbeats_and_shows_idle_past_the_lost_threshold(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(REPO),
        "CPBENCH_LEASE_S": str(LEASE_S),
        "CPBENCH_HEARTBEAT_S": "0.3",
        "CPBENCH_POLL_S": "0.2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench_server", "worker", "--cpu", "--devices", "1", "--name", "idler", "--db", store_url],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _worker_states(store_url):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        time.sleep(3 * LEASE_S)  # idle for three lease lengths: without heartbeats it would be `lost`
        ((state, age),) = _worker_states(store_url)
        assert (state, proc.poll()) == ("idle", None) and age < LEASE_S, (state, age)
        code, out, err = _cli("status", "--db", store_url)
        assert code == 0, err
        row = next(line for line in out.splitlines() if "idler" in line)
        assert " idle " in row and "lost" not in row, row
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert [s for s, _ in _worker_states(store_url)] == ["stopped"]
