"""A worker paying a peer's long first call shows it (issue 27): a real `cpbench run` of a peer whose first forward
compiles for a few seconds (`tests.plugins.compiling_peer`, announcing it as FlashQLA's adapter does); meanwhile
`cpbench status` lists the worker "busy: compiling stand-in kernels, N s" (the rank's notice, carried to the worker's row
by its heartbeat), the point is not taken for a hang, its report stores the first call's cost, and once it is over the
notice is gone from the row.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runners.engine_fixtures import REPO, store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

COMPILE_S = 8.0


def test_status_shows_a_long_first_call_while_it_is_paid(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path, backends=["tests.plugins.compiling_peer:PEER"], axes={"T": 16, "K": 8, "V": 8})
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(REPO),
        "CPBENCH_HEARTBEAT_S": "0.3",
        "CPBENCH_PLUGIN_MODULES": "tests.plugins.",
        "CPBENCH_TEST_COMPILE_S": str(COMPILE_S),
        "CPBENCH_ARTIFACT_DIR": str(tmp_path / "art"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench_server", "run", str(spec), "--db", store_url, "--cpu", "--devices", "1"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = None
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            code, out, _ = _cli("status", "--db", store_url)
            found = re.search(r"busy: compiling stand-in kernels, (\d+) s", out) if code == 0 else None
            if found:
                seen = int(found.group(1))
                break
            time.sleep(0.3)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen is not None and 0 <= seen <= COMPILE_S, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    from runners.cli.common import fetch_results

    (row,) = fetch_results(store_url, 1)
    assert row["status"] == "done", row
    assert row["report"]["first_call_s"]["fwd"] >= COMPILE_S
    code, out, _ = _cli("status", "--db", store_url)
    assert code == 0 and "compiling" not in out
    from db import crud
    from db.session import session_scope

    with session_scope(store_url) as s:
        assert all("activity" not in (w.devices or {}) for w in crud.list_workers(s))
