"""`dashboards.data` on a seeded store: a sweep's rows, the slice the sweep page picks, tuning trials with the
chosen config marked, and the nightly history with the verdicts of the regression runs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from dashboards import data
from tests.dashboards.seed import MODES, Seeded


def test_sweep_rows_and_slice(session: Session, seeded: Seeded) -> None:
    rows = data.sweep_rows(session, seeded.sweep_id, limit=1000)
    assert len(rows) == seeded.n_points
    assert {r["mode"] for r in rows if r["status"] == "done"} == set(MODES)
    assert sorted(r["status"] for r in rows if r["status"] != "done") == ["failed", "skipped"]
    options = data.slice_options(rows)
    assert options["op"] == ["gdn"] and options["H"] == [4]
    kept, chosen = data.apply_slice(rows, {"H": "4", "backend": "nope"})  # query strings; unknown value -> first
    assert chosen["H"] == 4 and chosen["backend"] == "torch" and len(kept) == len(rows)
    kept, _ = data.apply_slice(rows, {"layout": "zigzag"})  # not present: falls back to contiguous
    assert len(kept) == len(rows)


def test_tuning_rows_mark_the_stored_winner(session: Session, seeded: Seeded) -> None:
    rows = data.tuning_rows(session)
    assert {r["kernel"] for r in rows} == set(seeded.kernels)
    assert sum(r["status"] == "invalid" for r in rows) == 4  # one per (kernel, key)
    for kernel in seeded.kernels:
        for key in ("H=4,K=32,V=32", "H=8,K=32,V=32"):
            group = [r for r in rows if r["kernel"] == kernel and r["key_str"] == key]
            chosen = [r for r in group if r["chosen"]]
            best = min((r for r in group if r["status"] == "ok"), key=lambda r: r["median_ms"])
            assert chosen == [best]
    configs = data.tuned_config_rows(session, device_name="cpu")
    assert len(configs) == 4 and all(abs(c["vs_default"] - 1.2) < 1e-9 for c in configs)
    assert data.tuning_rows(session, sweep_id=seeded.sweep_id + 999) == []


def test_history_rows_carry_verdicts(session: Session, seeded: Seeded) -> None:
    keys = data.history_keys(session)
    assert keys[0] == seeded.keys[0] or keys[0] == seeded.keys[1]  # flagged keys first (SLOW, CHANGED)
    assert set(keys) == set(seeded.keys)
    rows = data.history_rows(session, keys=keys)
    assert len(rows) == 3 * 2  # three nights x two keys
    by = {(r["key"], r["sweep_id"]): r for r in rows}
    slow = by[(seeded.keys[0], seeded.nightly_ids[2])]
    assert slow["verdict"] == "SLOW" and slow["ratio"] == 1.25
    assert by[(seeded.keys[1], seeded.nightly_ids[1])]["verdict"] == "CHANGED"
    assert by[(seeded.keys[1], seeded.nightly_ids[2])]["verdict"] == "SAME"
    assert by[(seeded.keys[0], seeded.nightly_ids[0])]["verdict"] is None
    first = by[(seeded.keys[0], seeded.nightly_ids[0])]["median_ms"]
    assert slow["median_ms"] > 1.15 * first  # the seeded 25% slowdown (noise is +-3%)
    assert data.history_keys(session, contains="mode=ring") == [seeded.keys[1]]


def test_direction_is_a_slice_and_the_comm_model_covers_the_training_step() -> None:
    # a sweep over [fwd, fwd+bwd]: modes are compared within one direction, and the communication figure's model
    # gives the training step's counts (forward + backward) beside the measured ones
    from dashboards.figures import comm

    def row(mode: str, direction: str, calls: dict) -> dict:
        return {"status": "done", "mode": mode, "direction": direction, "op": "gdn", "backend": "torch", "B": 1,
                "T": 256, "H": 2, "K": 16, "V": 16, "W": 2, "layout": "contiguous", "dtype": "float32",
                "collectives": calls, "collective_bytes": dict.fromkeys(calls, 1), "params": {}}

    rows = [row("true_cp", "fwd", {"all_gather": 1}), row("true_cp", "fwd+bwd", {"all_gather": 2}),
            row("all_gather", "fwd+bwd", {"all_gather": 1, "reduce_scatter": 1})]
    assert data.slice_options(rows)["direction"] == ["fwd", "fwd+bwd"]
    kept, chosen = data.apply_slice(rows, {"direction": "fwd+bwd"})
    assert chosen["direction"] == "fwd+bwd" and {r["mode"] for r in kept} == {"true_cp", "all_gather"}
    table = comm.frame(kept)
    assert all(t["model_by_kind"] == t["measured_by_kind"] for t in table), table


def test_a_sweep_of_several_gates_is_sliced_by_gate() -> None:
    """gate / lower_bound / l2norm_in_kernel live in a point's params (issue 25): a page of a sweep that mixes them
    offers them as slice axes (a point without the key has the default), and keeps one value of each; a sweep of one
    value (every older one) offers none of them."""
    def row(mode: str, **params: Any) -> dict[str, Any]:
        return {"op": "kda", "backend": "torch", "H": 2, "K": 16, "V": 16, "dtype": "float32", "direction": "fwd",
                "layout": "contiguous", "mode": mode, "params": params}

    rows = [row(m, **extra) for m in ("none", "ring") for extra in
            ({}, {"gate": "in_kernel"}, {"gate": "in_kernel", "l2norm_in_kernel": True})]
    options = data.slice_options(rows)
    assert options["gate"] == ["in_kernel", "precomputed"] and options["l2norm_in_kernel"] == [False, True]
    assert "lower_bound" not in options
    kept, chosen = data.apply_slice(rows, {"gate": "precomputed"})
    assert chosen["gate"] == "precomputed" and chosen["l2norm_in_kernel"] is False
    assert [r["params"] for r in kept] == [{}, {}]
    kept, chosen = data.apply_slice(rows, {"gate": "in_kernel", "l2norm_in_kernel": "true"})  # query strings
    assert chosen["l2norm_in_kernel"] is True and [r["mode"] for r in kept] == ["none", "ring"]
    old = [row("none"), row("ring")]
    assert not {"gate", "lower_bound", "l2norm_in_kernel"} & set(data.slice_options(old))


def test_a_sweep_of_several_value_head_counts_is_sliced_by_hv() -> None:
    """A sweep with HV 16 and 32 (issue 27's peers2 grid; `HV` is in a point's params only where HV != H): its page
    offers HV and keeps one value, so a figure never ranks an HV=32 time against an HV=16 one; one HV, no axis."""
    def row(backend: str, ms: float, **params: Any) -> dict[str, Any]:
        return {"op": "gdn", "backend": backend, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16", "direction": "fwd",
                "layout": "contiguous", "mode": "none", "median_ms": ms, "params": params}

    rows = [row("flash_qla", 0.275), row("triton", 0.384), row("flash_qla", 0.304, HV=32), row("triton", 0.61, HV=32)]
    assert data.slice_options(rows)["HV"] == [16, 32]
    kept, chosen = data.apply_slice(rows, {})
    assert chosen["HV"] == 16 and [r["median_ms"] for r in kept] == [0.275, 0.384]
    kept, chosen = data.apply_slice(rows, {"HV": "32"})  # a query string
    assert chosen["HV"] == 32 and [r["median_ms"] for r in kept] == [0.304, 0.61]
    assert "HV" not in data.slice_options(rows[:2]) and "HV" not in data.slice_options(rows[2:])
