"""`cpbench tune` as a user meets it, a real process on the CPU (Triton interpreter, wall clock).

Scenarios: a tiny GDN shape with a random budget of 2 on one kernel: the first line names the op, direction, shape,
strategy, budget, device and the store; a line says how many configs were left out as invalid for the shape (BV > V)
before the budget was drawn, and one line per rung reports its trials; each kernel's result line, then a summary
naming the store; the store holds exactly the budget's trials, none with a tile wider than the head dim; no numpy
overflow warning reaches the log.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from db.models import TuningTrial
from db.session import sqlite_path
from tests.runners.engine_fixtures import REPO, store_url  # noqa: F401

KERNEL = "gdn_fused_state_output_fwd"  # the state pass GDN's forward launches (its two-kernel path)


def test_tune_talks_and_spends_its_budget_on_launchable_configs(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    env.pop("PYTHONWARNINGS", None)
    args = [
        "tune",
        "--op",
        "gdn",
        "--shape",
        "B=1,T=64,H=1,K=16,V=32,dtype=float32",
        "--strategy",
        "random",
        "--budget",
        "2",
        "--samples",
        "1",
        "--kernel",
        KERNEL,
        "--db",
        store_url,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "bench_server", *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    where = str(sqlite_path(store_url))
    assert out[0].startswith("tune gdn fwd (triton) at 1 shape(s) [B=1,T=64,H=1,K=16,V=32,dtype=float32]"), out
    assert "strategy random, budget 2 config(s)" in out[0] and "device cpu (wall clock)" in out[0]
    assert where in out[0]
    assert out[1].startswith(KERNEL) and len(out) == 3, out
    assert out[2].startswith("tuned 1 of 1 kernel(s)") and "2 trial(s)" in out[2] and where in out[2], out
    assert f"searching {KERNEL}" in proc.stderr and "invalid for this shape left out" in proc.stderr, proc.stderr
    assert f"{KERNEL} rung 0: 2 trial(s)" in proc.stderr, proc.stderr
    assert "overflow encountered" not in proc.stderr and "Traceback" not in proc.stderr
    engine = create_engine(store_url)
    with Session(engine) as s:
        trials = list(s.scalars(select(TuningTrial).where(TuningTrial.kernel == KERNEL)))
    engine.dispose()
    assert len(trials) == 2, [(t.config, t.status) for t in trials]
    assert all(t.config["BV"] <= 32 and t.status != "invalid" for t in trials), [(t.config, t.status) for t in trials]
