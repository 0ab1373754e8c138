"""`benchmarks/autotune_h200.py import`: several device runs of the same kernels merge into one export (per op,
shape and direction, the run with the best whole-op speedup supplies the tuned entries; every trial is kept), runs
of other commits merge when the kernels they share are unchanged, and runs where a shared kernel changed are
refused. Runs the script's import step on real run files from a CPU dry run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "autotune_h200.py"


def _module():
    return load_script("autotune_h200")


def _hash(kernel: str) -> str:
    """This build's source hash (the export drops entries of another kernel source as stale)."""
    import kernels.common.wy  # noqa: F401  (registers the WY kernels)
    from kernels.autotune import source_hash

    return source_hash(kernel)


def _run(sha: str, op: str, speedup: float, cfg: dict, command: str) -> dict:
    shape = {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"}
    key = {"H": 16, "K": 128, "V": 128, "BT": 64, "IS_VARLEN": False, "dtype": "bfloat16"}
    tuned = {"op": op, "shape": shape, "kernel": f"wy_{op}_fwd", "key": key, "key_str": json.dumps(key, sort_keys=True),
             "device_name": "NVIDIA H200", "compute_capability": "9.0", "config": cfg, "median_ms": 1.0 / speedup,
             "default_ms": 1.0, "runner_up_ms": 1.01, "source_hash": _hash(f"wy_{op}_fwd")}
    trial = {"op": op, "shape": shape, "kernel": tuned["kernel"], "key": key, "config": cfg, "strategy": "halving",
             "rung": 0, "status": "ok", "median_ms": 1.0 / speedup, "n": 5, "error": None}
    return {"env": {"device": "NVIDIA H200", "compute_capability": "9.0", "torch": "2.11", "triton": "3.6.0", "python": "3.12",
                    "driver": "580", "git_sha": sha, "command": command, "started_at": "2026-11-30T00:00:00", "elapsed_s": 10.0},
            "trials": [trial], "tuned": [tuned],
            "ops": [{"op": op, "shape": shape, "default_ms": 1.0, "tuned_ms": 1.0 / speedup, "speedup": speedup,
                     "tune_s": 1.0, "n_trials": 1, "tuned": {tuned["kernel"]: cfg}}],
            "crashed": [["gdn", "chunk_state_output_fwd", {"BV": 32}, "illegal address"]]}


def test_merge_keeps_every_trial_and_the_best_run_per_shape() -> None:
    mod = _module()
    a = _run("abc", "gdn", 1.02, {"BK": 32, "BV": 64, "num_warps": 1, "num_stages": 2}, "run a")
    b = _run("abc", "gdn", 1.10, {"BK": 64, "BV": 64, "num_warps": 2, "num_stages": 2}, "run b")
    c = _run("abc", "kda", 1.05, {"BK": 16, "BV": 64, "num_warps": 1, "num_stages": 2}, "run c")
    m = mod.merge_runs([a, b, c])
    assert len(m["trials"]) == 3
    assert [(o["op"], o["speedup"]) for o in m["ops"]] == [("gdn", 1.10), ("kda", 1.05)]
    assert {t["kernel"]: t["config"]["BK"] for t in m["tuned"]} == {"wy_gdn_fwd": 64, "wy_kda_fwd": 16}
    assert m["env"]["command"] == "run a ; run b ; run c" and m["env"]["elapsed_s"] == 30.0
    assert len(m["crashed"]) == 1  # the same crash seen by three runs is listed once
    # another commit whose kernels are those of the first: merged, both commits recorded
    later = mod.merge_runs([a, _run("def", "kda", 1.0, {"BK": 16}, "other")])
    assert later["env"]["git_shas"] == ["abc", "def"] and len(later["tuned"]) == 2
    # another commit where a kernel tuned in both changed: refused, naming the kernel
    edited = _run("def", "gdn", 1.2, {"BK": 16}, "edited")
    edited["tuned"][0]["source_hash"] = "0" * 64
    with pytest.raises(ValueError, match="different code cannot be merged: kernel.s. wy_gdn_fwd changed"):
        mod.merge_runs([a, edited])
    with pytest.raises(ValueError, match="no run files"):
        mod.merge_runs([])


def test_import_cli_merges_files(tmp_path: Path) -> None:
    """The import step end to end on two run files of one code: one exported entry per kernel and key, the
    Markdown lists both ops."""
    a = _run("abc", "gdn", 1.02, {"BK": 32, "BV": 64, "num_warps": 1, "num_stages": 2}, "run a")
    b = _run("abc", "kda", 1.05, {"BK": 16, "BV": 64, "num_warps": 1, "num_stages": 2}, "run b")
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    out_json, out_md = tmp_path / "auto.json", tmp_path / "auto.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "import", str(fa), str(fb), "--json", str(out_json), "--md", str(out_md)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    assert data["device"]["name"] == "NVIDIA H200"
    assert {k: [e["config"] for e in v["entries"]] for k, v in data["kernels"].items()} == {
        "wy_gdn_fwd": [a["tuned"][0]["config"]], "wy_kda_fwd": [b["tuned"][0]["config"]]}
    md = out_md.read_text()
    assert "| gdn | B=1 T=8K |" in md and "| kda | B=1 T=8K |" in md and "run a ; run b" in md
