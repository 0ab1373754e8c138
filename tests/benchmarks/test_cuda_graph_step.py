"""`benchmarks/cuda_graph_step.py --dry-run` on the CPU (interpreter, fp32): our two steps run eagerly and each row
says how many tensors the step returned (o and the five input gradients); an unknown peer is a one-line error. The
capture and replay themselves need CUDA (the H200 rows are in `benchmarks/results/cuda_graph_step_h200.md`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "cuda_graph_step.py")


def test_dry_run_rows(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "cuda_graph_step.json").read_text())["rows"]
    assert [r["who"] for r in rows] == ["ours", "ours direct"]
    for r in rows:
        assert "error" not in r, r
        assert r["eager_outputs"] == 6  # o, dq, dk, dv, dg, dbeta (no initial state: no dh0)
    assert "| 1x128 | 1 | ours direct |" in (tmp_path / "cuda_graph_step.md").read_text()


def test_unknown_peer_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), "--peers", "flashqla"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "--peers: unknown ['flashqla']; known: fla, flash_qla (or none)" in proc.stderr
