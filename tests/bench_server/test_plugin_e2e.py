"""A team's own kernel as a backend plugin, end to end on SQLite: the example peer `tests.plugins.torch_peer:PEER`
(a pure-torch per-token recurrence) is named in a spec next to our torch backend, expanded (its missing modes
skipped with the reason), run by a real worker through the same gate and timing (gloo ranks on the CPU), stored,
and shown on the sweep's dashboard page. The module must be allowed by CPBENCH_PLUGIN_MODULES: a spec naming any
other module is refused with a one-line 422 (`runners.plugins.refusal`).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import httpx
import pytest

from runners.worker import run_worker

pytestmark = pytest.mark.multiproc

PLUGIN = "tests.plugins.torch_peer:PEER"
SPEC: dict[str, Any] = {
    "name": "plugin-e2e",
    "ops": ["kda"],
    "modes": ["none", "all_gather", "true_cp"],
    "backends": ["torch", PLUGIN],
    "axes": {"B": 1, "T": [64], "H": 2, "K": 16, "V": 16, "lb": -1.0, "W": [1, 2], "dtype": "float32"},
    "timing": {"min_samples": 2, "max_samples": 3, "min_time_s": 0, "warmup_s": 0, "flush_l2": False, "max_rel_iqr": 10},
    "check": {"reference_tokens": 64},
}


def test_plugin_module_must_be_allowed(client: httpx.Client, auth: dict[str, str], plugin_modules: Any) -> None:
    plugin_modules("tests.plugin")  # not a prefix (no trailing '.'), not the module
    r = client.post("/api/v1/sweeps", json=SPEC, headers=auth)
    assert r.status_code == 422, r.text
    (entry,) = r.json()["detail"]
    assert "\n" not in entry["msg"] and "CPBENCH_PLUGIN_MODULES" in entry["msg"]
    assert f"backend '{PLUGIN}' is refused: module 'tests.plugins.torch_peer' is not allowed" in entry["msg"]
    assert client.get("/api/v1/sweeps").json()["count"] == 0

    plugin_modules("tests.plugins.torch_peer")
    r = client.post("/api/v1/sweeps", json={**SPEC, "name": "allowed"}, headers=auth)
    assert r.status_code == 201, r.text
    assert client.post(f"/api/v1/sweeps/{r.json()['id']}/cancel", headers=auth).status_code == 200


def test_plugin_sweep_runs_gates_stores_and_shows(client: httpx.Client, auth: dict[str, str], store_url: str,
                                                 tmp_path: Path, plugin_modules: Any) -> None:
    plugin_modules("tests.plugins.")  # the server's check and the worker's (and its ranks')
    r = client.post("/api/v1/sweeps", json=SPEC, headers=auth)
    assert r.status_code == 201, r.text
    sweep = r.json()
    points = client.get("/api/v1/results", params={"sweep": sweep["id"], "backend": "torchpeer"}).json()["data"]
    status = {(p["mode"], p["W"]): (p["status"], p["reason"] or "") for p in points}
    assert status[("none", 1)][0] == status[("all_gather", 1)][0] == status[("all_gather", 2)][0] == "queued"
    assert status[("true_cp", 1)] == ("skipped", "backend 'torchpeer' does not implement mode 'true_cp' (it has none, all_gather)")

    stats = run_worker(store_url, once=True, until_sweep=sweep["id"], device_kind="cpu", devices=2,
                       artifact_dir=tmp_path / "artifacts", lease_s=120, heartbeat_s=5)
    assert len(stats.point_ids) == sweep["progress"]["queued"]
    rows = client.get("/api/v1/results", params={"sweep": sweep["id"], "status": "done"}).json()["data"]
    failed = client.get("/api/v1/results", params={"sweep": sweep["id"], "status": "failed"}).json()["data"]
    assert not failed, [(f["backend"], f["mode"], f["error"]) for f in failed]
    peer = {(r["mode"], r["W"]): r for r in rows if r["backend"] == "torchpeer"}
    assert set(peer) == {("none", 1), ("all_gather", 1), ("all_gather", 2)}
    for row in peer.values():
        # the gate ran against our fp32 reference (and the peer's own `none`); the per-token loop is exact in fp32
        assert row["median_ms"] > 0 and row["err_vs_reference"] is not None and row["err_vs_reference"] < 1e-5
        assert row["key"].startswith(f"kda/{row['mode']}/torchpeer/")
        if row["mode"] != "none":
            assert row["err_vs_none"] < 1e-5
        if row["W"] == 2:  # profiled like ours: the peer's five all-gathers (q, k, v, g, beta) were counted
            assert row["collectives"] == {"all_gather": 5}, row["collectives"]

    page = client.get(f"/sweeps/{sweep['id']}", params={"backend": "torchpeer"})
    assert page.status_code == 200 and "torchpeer" in page.text
    csv_text = client.get(f"/dash/{sweep['id']}/latency.csv", params={"backend": "torchpeer"}).text
    assert "torchpeer" in csv_text and "all_gather" in csv_text

    # without a choice the page shows every backend (ours and the plugin's all_gather on the same axes)
    page = client.get(f"/sweeps/{sweep['id']}")
    assert page.status_code == 200 and '<option value="all" selected>all</option>' in page.text
    shown = page.text.replace("\\u00b7", "·")
    assert all(f'"name":"{m} · {b}"' in shown for m in ("all_gather", "none") for b in ("torch", "torchpeer")), shown[:2000]
    rows = list(csv.DictReader(io.StringIO(client.get(f"/dash/{sweep['id']}/latency.csv").text)))
    drawn = {(r["mode"], r["backend_label"], r["W"]) for r in rows if r["role"] == "measured"}
    assert {("all_gather", "torch", "2"), ("all_gather", "torchpeer", "2")} <= drawn
