"""End to end: `cpbench run` on the demo spec (CPU, torch backend, gloo ranks), then the other verbs on its store.

Scenarios:
- `cpbench run runners/suites/demo.yaml` (SQLite): every point ends done or skipped (skipped exactly: none and
  warmup_correct at W=2); each done point has a measurement (samples, stop reason, errors vs none and the
  reference under tolerance), a profile whose collective counts are the scheme's (DESIGN §2: all_gather and
  true_cp one all-gather, headwise two all-to-all, ring W-1 send/recv, none and warmup_correct nothing) and
  equal kernels.cp's own expectation, and a gzipped trace artifact whose size and sha256 match the file;
- the same on PostgreSQL (marked `postgres`);
- `results --format csv|json|table`, `status [SWEEP]`, `db upgrade`;
- user errors exit 1 with one red line: a bad spec names the field, an unmigrated store says what to run, an
  unknown sweep id says so;
- a point whose correctness gate fails is failed, not timed, with both errors in its message; a point whose
  backend this worker lacks is failed with that reason.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.runners.engine_fixtures import DEMO_SPEC, pg_store_url, store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli

pytestmark = pytest.mark.multiproc

# DESIGN §2, one forward step of a W=2 gang (send/recv: totals over the gang)
EXPECTED_W2 = {
    "none": None,
    "warmup_correct": None,
    "all_gather": {"all_gather": 1},
    "true_cp": {"all_gather": 1},
    "headwise": {"all_to_all": 2},
    "ring": {"send": 1, "recv": 1},
}


def _run_demo(url: str) -> tuple[int, list[dict[str, Any]], str]:
    code, out, err = _cli("run", str(DEMO_SPEC), "--db", url, "--cpu", "--devices", "2", "--format", "json")
    rows = json.loads(out) if out.strip().startswith("[") else []
    return code, rows, err


def check_demo(url: str, rows: list[dict[str, Any]]) -> None:
    """Everything the demo run must have stored (see the module docstring)."""
    from db import crud
    from db.session import session_scope

    assert len(rows) == 24
    skipped = sorted((r["op"], r["mode"]) for r in rows if r["status"] == "skipped")
    assert skipped == sorted((op, m) for op in ("gdn", "kda") for m in ("none", "warmup_correct"))
    for r in rows:
        assert r["status"] in ("done", "skipped"), (r["key"], r["status"], r["error"])
        if r["status"] == "skipped":
            assert r["W"] == 2 and "runs on one device" in r["reason"] and r["measurement_id"] is None
            continue
        where = r["key"]
        assert r["clock"] == "wall" and r["n"] >= 3 and r["stop_reason"] in ("noise", "max_samples", "timeout"), where
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"], where
        assert r["err_vs_none"] is not None and r["err_vs_none"] <= 2e-3, where
        assert r["err_vs_reference"] is not None and r["err_vs_reference"] <= 2e-3, where
        assert r["collectives"] == r["report"]["expected_collectives"], where
        assert r["report"]["collective_mismatches"] == [] and r["by_direction"] is None, where   # a forward point
        if r["W"] == 2:
            assert r["collectives"] == (EXPECTED_W2[r["mode"]] or {}), where
        if r["mode"] in ("none", "warmup_correct"):
            assert r["collectives"] == {}, where
        assert r["kernel_launches"] == 0 and r["device_name"] == "cpu" and r["torch"]
        assert r["artifact_id"] is not None, where
    ring = next(r for r in rows if r["mode"] == "ring" and r["W"] == 2 and r["op"] == "gdn")
    assert ring["collective_bytes"] == {"recv": 2 * 32 * 32 * 4, "send": 2 * 32 * 32 * 4}  # one fp32 state [H, K, V]
    wc = next(r for r in rows if r["mode"] == "warmup_correct" and r["status"] == "done")
    assert wc["report"]["warmup_correct"]["segments"] >= 1
    with session_scope(url) as s:
        from db.models import Artifact

        for a in s.query(Artifact).all():
            data = Path(a.path).read_bytes()
            assert len(data) == a.size_bytes and hashlib.sha256(data).hexdigest() == a.sha256
            assert data[:2] == b"\x1f\x8b"  # gzip
        workers = crud.list_workers(s)
        assert len(workers) == 1 and workers[0].status == "stopped" and workers[0].points_done == 20
        sweep = crud.get_sweep(s, sweep_id=rows[0]["sweep_id"])
        assert sweep.status == "done" and sweep.finished_at is not None


def test_run_demo_then_results_and_status(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    # one test, so that the demo runs once however the tests are spread over xdist workers
    code, rows, err = _run_demo(store_url)
    assert code == 0, err[-3000:]
    assert "sweep 1 (demo): 24 points, 4 skipped" in err
    check_demo(store_url, rows)

    sid = str(rows[0]["sweep_id"])
    code, out, _ = _cli("results", sid, "--db", store_url, "--format", "csv")
    assert code == 0
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == 24 and table[0]["key"] == rows[0]["key"]
    assert json.loads(next(t for t in table if t["mode"] == "headwise")["collectives"]) == {"all_to_all": 2}
    assert all(t["by_direction"] == "" for t in table)  # the demo is forward only: no per-direction split
    code, out, _ = _cli("results", sid, "--db", store_url, "--format", "json")
    assert code == 0 and [r["point_id"] for r in json.loads(out)] == [r["point_id"] for r in rows]
    code, out, _ = _cli("results", sid, "--db", store_url)
    assert code == 0 and "sweep 1: demo" in out and "headwise" in out and "a2a2" in out

    code, out, _ = _cli("status", sid, "--db", store_url)
    assert code == 0 and "done 20" in out and "skipped 4" in out and "failed 0" in out
    code, out, _ = _cli("status", "--db", store_url)
    assert code == 0 and "demo" in out and "stopped" in out


@pytest.mark.postgres
def test_run_demo_postgres(pg_store_url: str) -> None:  # noqa: F811
    code, rows, err = _run_demo(pg_store_url)
    assert code == 0, err[-3000:]
    check_demo(pg_store_url, rows)


def test_cli_user_errors(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    bad = write_spec(tmp_path, modes=["none", "spiral"])
    code, out, err = _cli("submit", str(bad), "--db", store_url)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "error:" in err and "modes: unknown mode 'spiral'" in err
    code, _, err = _cli("results", "999", "--db", store_url)
    assert code == 1 and "no sweep with id 999" in err
    fresh = f"sqlite:///{tmp_path / 'fresh' / 'x.db'}"
    code, _, err = _cli("worker", "--once", "--db", fresh)
    assert code == 1 and "is not migrated" in err and "cpbench db upgrade" in err
    code, out, _ = _cli("db", "upgrade", "--db", fresh)
    assert code == 0 and "(head)" in out
    code, out, _ = _cli("submit", str(write_spec(tmp_path)), "--db", fresh)
    assert code == 0 and "1 points, 1 to run, 0 skipped" in out


def test_failed_gate_and_missing_backend(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    from db import crud
    from db.session import session_scope
    from runners.engine import run_until_done, submit_spec
    from runners.spec import load_spec

    strict = load_spec(write_spec(tmp_path, "strict.yaml", check={"tol_reference": 1e-12}))
    nofla = load_spec(write_spec(tmp_path, "fla.yaml", backends=["fla"]))
    with session_scope(store_url) as s:
        a = submit_spec(s, strict).id
        b = submit_spec(s, nofla).id
    final = run_until_done(store_url, a, devices=1, device_kind="cpu")
    assert final["failed"] == 1 and final["done"] == 0
    run_until_done(store_url, b, devices=1, device_kind="cpu")
    with session_scope(store_url) as s:
        (gate,), _ = crud.list_results(s, sweep_id=a)
        (fla,), _ = crud.list_results(s, sweep_id=b)
    assert gate["status"] == "failed" and gate["measurement_id"] is None and gate["attempts"] == 1
    assert "correctness gate failed for gdn/none/torch" in gate["error"] and "vs reference (reduced shape)" in gate["error"]
    assert fla["status"] == "failed" and "backend 'fla' is not available on worker" in fla["error"]


@pytest.mark.parametrize(("verb", "env", "needle"), [
    (["worker", "--once"], {"CPBENCH_CPU_RANKS": "abc"}, "invalid setting CPBENCH_CPU_RANKS='abc'"),
    (["worker", "--once"], {"CPBENCH_DATABASE_URL": ""}, "invalid setting CPBENCH_DATABASE_URL=''"),
    (["serve", "--port", "0"], {"CPBENCH_DATABASE_URL": ""}, "invalid setting CPBENCH_DATABASE_URL=''"),
], ids=["bad-int", "empty-url-worker", "empty-url-serve"])
def test_bad_environment_is_one_line(tmp_path: Path, verb: list[str], env: dict[str, str], needle: str) -> None:
    # a fresh process: settings are cached per process, so a bad variable must be there from the start
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith("CPBENCH_")}
    base["CPBENCH_DATABASE_URL"] = f"sqlite:///{tmp_path}/x.db"
    proc = subprocess.run([sys.executable, "-m", "bench_server", *verb], env={**base, **env},  # the cpbench command
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
