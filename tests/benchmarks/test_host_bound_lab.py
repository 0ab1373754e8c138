"""`benchmarks/host_bound_lab.py --dry-run` end to end on the CPU (interpreter, fp32): each variant's row carries its
launch and op counts and its gradients against the default's; the variants compute the same step (within 1e-5 in
fp32; `old-host`, the path before session 17's host cuts, too), and keeping the WY factors and states issues fewer
launches than recomputing them, as does forming them from the kept Ag (GDN's default, "ag") against "inputs"; the
public op (`api`) launches what the default does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_rows(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "host_bound_lab.py"), "--out", str(tmp_path), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "host_bound_lab.json").read_text())["rows"]
    by = {r["variant"]: r for r in rows}
    assert set(by) == {"default", "inputs", "old-host", "nosplit", "wy+states", "api"}
    for r in rows:
        assert r["ok"] and max(v for k, v in r.items() if k.startswith("rel_")) < 1e-5, r
        assert r["launches"] > 0 and r["aten_ops"] > 0 and r["host_ms"] > 0
    assert by["default"]["rel_dq"] == 0.0
    assert by["wy+states"]["launches"] < by["default"]["launches"]
    assert by["default"]["launches"] < by["inputs"]["launches"]  # GDN's "ag": one `wy_from_ag` for the WY prep and the inverse
    # the public op (session 20): the default's launches and gradients, more ATen ops (its autograd node)
    assert by["api"]["launches"] == by["default"]["launches"] and by["api"]["aten_ops"] > by["default"]["aten_ops"]
    assert "| 1x128 | 1 | nosplit |" in (tmp_path / "host_bound_lab.md").read_text()


def test_unknown_variant_is_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "host_bound_lab.py"),
            "--out",
            str(tmp_path),
            "--variants",
            "default,bogus",
            "--dry-run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "unknown ['bogus']" in proc.stderr and "Traceback" not in proc.stderr
