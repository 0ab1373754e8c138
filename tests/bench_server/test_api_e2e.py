"""End to end over HTTP: a tiny sweep submitted to the live app is worked by a real worker (`runners.worker.run_worker`,
gloo ranks on the CPU) and its results, figures and CSV are served.

Scenario: POST a spec (none, all_gather, true_cp at W in (1, 2); `none` at W=2 is skipped) -> the worker runs every
queued point -> the sweep reads `done` with every queued point done -> GET /results gives timings, errors vs `none`
within the fp32 tolerance, and the profiled collective calls and bytes equal the cost model's (deterministic) -> the sweep page and
each figure's CSV are served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from dashboards.cost_model import comm_cost
from dashboards.figures import SWEEP_FIGURES
from runners.worker import run_worker

pytestmark = pytest.mark.multiproc

SPEC: dict[str, Any] = {
    "name": "e2e",
    "ops": ["gdn"],
    "modes": ["none", "all_gather", "true_cp"],
    "backends": ["torch"],
    "axes": {"B": 1, "T": [128], "H": 2, "K": 16, "V": 16, "lb": -1.0, "W": [1, 2], "dtype": "float32"},
    "timing": {"min_samples": 2, "max_samples": 3, "min_time_s": 0, "warmup_s": 0, "flush_l2": False, "max_rel_iqr": 10},
    "check": {"reference_tokens": 64},
}


def test_submit_run_and_serve(client: httpx.Client, auth: dict[str, str], store_url: str, tmp_path: Path) -> None:
    r = client.post("/api/v1/sweeps", json=SPEC, headers=auth)
    assert r.status_code == 201, r.text
    sweep = r.json()
    queued = sweep["progress"]["queued"]
    assert queued == 5 and sweep["progress"]["skipped"] == 1  # `none` runs on one device: skipped at W=2

    stats = run_worker(store_url, once=True, until_sweep=sweep["id"], device_kind="cpu", devices=2,
                       artifact_dir=tmp_path / "artifacts", lease_s=120, heartbeat_s=5)
    assert len(stats.point_ids) == queued

    done = client.get(f"/api/v1/sweeps/{sweep['id']}").json()
    failed = client.get("/api/v1/results", params={"sweep": sweep["id"], "status": "failed"}).json()["data"]
    assert done["status"] == "done" and done["progress"]["done"] == queued, [(r["mode"], r["W"], r["error"]) for r in failed]

    rows = client.get("/api/v1/results", params={"sweep": sweep["id"], "status": "done"}).json()["data"]
    assert {(r["mode"], r["W"]) for r in rows} == {("none", 1), *((m, W) for m in ("all_gather", "true_cp") for W in (1, 2))}
    for row in rows:
        assert row["median_ms"] > 0 and row["n"] >= 2 and row["device_name"] == "cpu"
        assert row["err_vs_reference"] is not None and row["err_vs_reference"] < 1e-4  # fp32 chunked vs per-token
        if row["mode"] != "none":
            assert row["err_vs_none"] < 1e-4
        if row["W"] == 2:
            model = comm_cost(row["mode"], B=1, T=128, H=2, K=16, V=16, W=2, dtype_bytes=4)
            assert model is not None
            assert row["collectives"] == model.collectives, (row["mode"], row["collectives"])
            assert row["collective_bytes"] == model.payload_bytes, (row["mode"], row["collective_bytes"])

    page = client.get(f"/sweeps/{sweep['id']}")
    assert page.status_code == 200 and 'id="fig-latency"' in page.text
    for name in SWEEP_FIGURES:
        csv_text = client.get(f"/dash/{sweep['id']}/{name}.csv").text
        assert len(csv_text.splitlines()) >= 2, name
    csv_all = client.get("/api/v1/results", params={"sweep": sweep["id"], "format": "csv"})
    assert csv_all.status_code == 200 and len(csv_all.text.splitlines()) == 1 + sweep["n_points"]
