"""`benchmarks/fwd_host_lab.py` on the CPU (its dry run: fp32, H=1, K=V=32, T=128 under the interpreter): one row per
shape for the public op and, with --direct (session 33), one for the op's own forward under it; the markdown names
each row's call. The GPU runs the lab itself (its times, graph replays and kernel lists)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils import TEST_DEVICE
from tests.utils.scripts import load_script

lab = load_script("fwd_host_lab")


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the CPU plumbing test (the GPU runs the lab itself)")
def test_dry_run_times_the_public_op_and_the_direct_forward(tmp_path: Path) -> None:
    assert lab.main(["--out", str(tmp_path), "--dry-run", "--direct", "--profile", "0"]) == 0
    rows = json.loads((tmp_path / "fwd_host_lab.json").read_text())["rows"]
    assert [(r["op"], r["T"], r["call"]) for r in rows] == [("gdn", 128, "public"), ("gdn", 128, "direct")]
    assert all(r["ms"] > 0 and r["host_issue_ms"] > 0 for r in rows)
    md = (tmp_path / "fwd_host_lab.md").read_text()
    assert "| gdn | 1x128 | public |" in md and "| gdn | 1x128 | direct |" in md
