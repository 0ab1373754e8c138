"""The worker process (runners.worker) under SIGTERM: the running point is released, not lost, and finished later.

Scenario: a `cpbench worker` subprocess claims a slow point (its timing runs into the stop rule's timeout);
SIGTERM arrives while the point runs, to the worker alone or to its whole process group (as GNU `timeout` and
systemd send it: the rank processes get it too and ignore it); the worker aborts the gang job, releases the point (queued again, no
attempt used, no lease, no measurement), marks itself stopped and exits 0. A second worker then completes the
point. Also: `detect_devices` on the CPU and the environment facts a worker registers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runners.engine_fixtures import REPO, store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc


def _point(url: str) -> dict:
    from db import crud
    from db.session import session_scope

    with session_scope(url) as s:
        (row,), _ = crud.list_results(s)
        return row


@pytest.mark.parametrize("to_group", [False, True], ids=["worker", "process-group"])
def test_worker_sigterm_releases_point(tmp_path: Path, store_url: str, to_group: bool) -> None:  # noqa: F811
    from db import crud
    from db.models import Point
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec
    from runners.worker import run_worker

    slow = write_spec(tmp_path, timing={"min_samples": 100000, "max_samples": 1000000, "max_rel_iqr": 1e-12, "timeout_s": 3.0})
    with session_scope(store_url) as s:
        submit_spec(s, load_spec(slow))
    env = {**os.environ, "CPBENCH_STOP_GRACE_S": "0", "CPBENCH_ARTIFACT_DIR": str(tmp_path / "art")}
    log = open(tmp_path / "worker.log", "w+")  # noqa: SIM115 - read back after the process ends
    proc = subprocess.Popen(
        [sys.executable, "-m", "runners.cli", "worker", "--db", store_url, "--cpu", "--devices", "1"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while _point(store_url)["status"] != "running":
            assert proc.poll() is None, "worker exited early"
            assert time.monotonic() < deadline, "the worker never claimed the point"
            time.sleep(0.2)
        time.sleep(1.0)
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)  # the worker's own session: its ranks and nothing else
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log.seek(0)
    output = log.read()
    assert "1 released" in output, output[-2000:]
    with session_scope(store_url) as s:
        point = s.query(Point).one()
        assert (point.status, point.attempts, point.lease_owner, point.measurement) == ("queued", 0, None, None)
        (worker,) = crud.list_workers(s)
        assert worker.status == "stopped" and worker.points_done == 0

    stats = run_worker(store_url, once=True, devices=1, device_kind="cpu", artifact_dir=tmp_path / "art")
    assert (stats.done, stats.failed, stats.released) == (1, 0, 0)
    row = _point(store_url)
    assert row["status"] == "done" and row["attempts"] == 1 and row["stop_reason"] == "timeout" and row["n"] >= 1


def test_detect_devices_and_facts() -> None:
    from runners.worker import detect_devices, environment_facts

    info = detect_devices(3, kind="cpu")
    assert (info.kind, info.count) == ("cpu", 3)
    facts = environment_facts(info)
    assert facts["device_name"] == "cpu" and facts["device_count"] == 3
    for key in ("torch", "python", "cpbench", "host"):
        assert facts[key]
    assert facts["git_sha"] is None or len(facts["git_sha"]) >= 40
