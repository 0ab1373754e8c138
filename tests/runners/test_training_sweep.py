"""Engine, `direction: fwd+bwd`: a sweep over [fwd, fwd+bwd] end to end (CPU, gloo W = 2) on SQLite and PostgreSQL,
and a training point whose gradient is wrong failing its gate.

The sweep (gdn, T = 128, H = 2, K = V = 16, fp32, torch backend): none and warmup_correct at W = 1; headwise,
all_gather, ring, true_cp, tail_exchange at W = 1 and 2; both directions. Every point is done; a fwd+bwd point's gate
covered every input gradient (errors under the fp32 tolerance 2e-3, per-gradient errors vs none in the report),
its measured collectives are the forward's plus the backward's (`kernels.cp.expected_collectives(..,
"fwd+bwd")`: e.g. true_cp 2 all-gathers, headwise 4 all-to-alls, all_gather 1 all-gather + 1 reduce-scatter,
ring twice the forward's send/recv), zero host syncs, and its key differs from the fwd point's only by `dir=`.
Its profile is stored per direction too (`by_direction`): each direction's collectives = kernels.cp's count of
that direction (the report's `expected_collectives_by_direction`, e.g. all_gather's backward 1 reduce-scatter),
its calls and bytes = the cost model's of that direction, no host sync in either, and no collective mismatch
reported; a forward point stores no split.
The fault: `kernels.cp.warmup_correct._backward` monkeypatched to double dg, run in this process (W = 1): the
point fails its gate vs none with the error in its message, and is not timed.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from dashboards.cost_model import comm_cost
from tests.runners.engine_fixtures import pg_store_url, store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc

FWD_BWD_W2 = {
    "all_gather": {"all_gather": 1, "reduce_scatter": 1},
    "true_cp": {"all_gather": 2},
    "headwise": {"all_to_all": 4},
    "ring": {"send": 2, "recv": 2},
    "tail_exchange": {"send": 2, "recv": 2},
}
BWD_W2 = {   # the backward alone (the profile's by_direction["bwd"])
    "all_gather": {"reduce_scatter": 1},
    "true_cp": {"all_gather": 1},
    "headwise": {"all_to_all": 2},
    "ring": {"send": 1, "recv": 1},
    "tail_exchange": {"send": 1, "recv": 1},
}


def _sweep(tmp_path: Path, url: str) -> list[dict[str, Any]]:
    from db import crud
    from db.session import session_scope
    from runners.engine import run_until_done, submit_spec
    from runners.spec import load_spec

    spec = load_spec(write_spec(tmp_path, modes=["none", "warmup_correct", "headwise", "all_gather", "ring", "true_cp",
                                                 "tail_exchange"],
                                axes={"T": 128, "H": 2, "K": 16, "V": 16, "W": [1, 2], "direction": ["fwd", "fwd+bwd"]}))
    with session_scope(url) as s:
        sid = submit_spec(s, spec).id
    run_until_done(url, sid, devices=2, device_kind="cpu")
    with session_scope(url) as s:
        rows, _ = crud.list_results(s, sweep_id=sid, limit=1000)
    return rows


def _check(rows: list[dict[str, Any]]) -> None:
    done = [r for r in rows if r["status"] == "done"]
    assert len(done) == 24, [(r["key"], r["status"], r["error"], r["reason"]) for r in rows if r["status"] != "skipped"]
    for r in done:
        where = r["key"]
        assert r["err_vs_none"] <= 2e-3 and r["err_vs_reference"] <= 2e-3, where
        assert r["collectives"] == r["report"]["expected_collectives"], where
        assert r["report"]["collective_mismatches"] == [], where
        assert r["host_syncs"] == 0, where
        if r["direction"] == "fwd":
            assert r["by_direction"] is None and set(r["report"]["expected_collectives_by_direction"]) == {"fwd"}, where
        if r["direction"] == "fwd+bwd":
            assert set(r["report"]["grad_errors_vs_none"]) == {"dq", "dk", "dv", "dg", "dbeta"}, where
            assert max(r["report"]["grad_errors_vs_none"].values()) <= 1e-4, where
            split, expected = r["by_direction"], r["report"]["expected_collectives_by_direction"]
            assert set(split) == set(expected) == {"fwd", "bwd"}, where
            for d in ("fwd", "bwd"):
                assert split[d]["collectives"] == expected[d] and split[d]["host_syncs"] == 0, (where, d, split)
            if r["W"] == 2:
                assert r["collectives"] == FWD_BWD_W2[r["mode"]], where
                assert split["bwd"]["collectives"] == BWD_W2[r["mode"]], where
                for d in ("fwd+bwd", "fwd", "bwd"):
                    model = comm_cost(r["mode"], B=1, T=128, H=2, K=16, V=16, W=2, dtype_bytes=4, direction=d,
                                      warmup_chunks=2)
                    got = r if d == "fwd+bwd" else split[d]
                    assert model is not None and model.collectives == got["collectives"], (where, d)
                    assert model.payload_bytes == got["collective_bytes"], (where, d, model, got["collective_bytes"])
    keys = {r["key"] for r in done}
    assert {k.replace("dir=fwd+bwd", "dir=fwd") for k in keys} == {k for k in keys if "dir=fwd," in k}


def test_fwd_bwd_sweep_sqlite(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    _check(_sweep(tmp_path, store_url))


@pytest.mark.postgres
def test_fwd_bwd_sweep_postgres(tmp_path: Path, pg_store_url: str) -> None:  # noqa: F811
    _check(_sweep(tmp_path, pg_store_url))


def test_wrong_gradient_fails_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.execute import run_point_job
    from runners.gang import RankContext
    from runners.point import PointJob, PointSpec

    wc = importlib.import_module("kernels.cp.warmup_correct")
    real = wc._backward

    def wrong(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        dq, dk, dv, dg, dbeta = real(*args, **kwargs)
        return dq, dk, dv, 2 * dg, dbeta

    params = {"op": "gdn", "mode": "warmup_correct", "backend": "torch", "B": 1, "T": 256, "H": 2, "K": 16, "V": 16,
              "lb": -1.0, "W": 1, "layout": "contiguous", "direction": "fwd+bwd", "dtype": "float32", "seed": 0,
              "mode_options": {"segments": 2}}
    options = {"timing": {"min_samples": 2, "max_samples": 2, "min_time_s": 0.0, "timeout_s": 1.0, "warmup_s": 0.0,
                          "flush_l2": False}, "check": {"reference_tokens": 128}, "profile": False}
    rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
    job = PointJob(PointSpec.from_json(params), options, trace_path=None)
    ok = run_point_job(rc, job)
    assert ok.ok and ok.gate is not None and ok.gate["err_vs_none"] < 1e-5, ok
    monkeypatch.setattr(wc, "_backward", wrong)
    bad = run_point_job(rc, job)
    assert not bad.ok and bad.timing is None, bad
    assert bad.error is not None and "correctness gate failed for gdn/warmup_correct/torch" in bad.error and "vs none" in bad.error, bad
    assert bad.gate is not None and bad.gate["err_vs_none"] > 0.1
