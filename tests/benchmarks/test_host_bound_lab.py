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
    assert set(by) == {"default", "inputs", "old-host", "nosplit", "wy+states", "wy", "ag+states", "api"}
    for r in rows:
        assert r["ok"] and max(v for k, v in r.items() if k.startswith("rel_")) < 1e-5, r
        assert r["launches"] > 0 and r["aten_ops"] > 0 and r["host_ms"] > 0
    assert by["default"]["rel_dq"] == 0.0
    assert by["wy+states"]["launches"] < by["default"]["launches"]
    assert by["ag+states"]["launches"] < by["default"]["launches"]  # no state recompute in the backward
    assert by["default"]["launches"] < by["inputs"]["launches"]  # GDN's "ag": one `wy_from_ag` for the WY prep and the inverse
    # the public op (session 20): the default's launches and gradients, more ATen ops (its autograd node)
    assert by["api"]["launches"] == by["default"]["launches"] and by["api"]["aten_ops"] > by["default"]["aten_ops"]
    assert "| 1x128 | 1 | nosplit |" in (tmp_path / "host_bound_lab.md").read_text()


def test_busy_and_gaps() -> None:
    """The timeline's arithmetic (session 21): overlapping kernels count once, gaps are named by the kernel that ended
    last before them and the one after, longest first."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.host_bound_lab import busy_and_gaps

    kernels = [(0.0, 10.0, "a"), (5.0, 12.0, "b"), (2.0, 4.0, "c"), (20.0, 25.0, "d"), (26.0, 30.0, "e")]
    busy, span, gaps = busy_and_gaps(kernels)
    assert (busy, span) == (12.0 + 5.0 + 4.0, 30.0)
    assert gaps == [(8.0, "b", "d"), (1.0, "d", "e")]
    assert busy_and_gaps([]) == (0.0, 0.0, [])


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
