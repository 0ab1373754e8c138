"""The figure modules as pure functions: synthetic result rows in, plotly figures and CSV tables out.

Scenarios: every sweep figure draws one trace name per mode present (and only those); latency facets by W and lb
with `none` in every facet and the speedup it reports equal to none/mode; the best-mode map picks the argmin of
each cell; the communication figure puts the cost model beside the measured counts; accuracy keeps the modes that
carry an error; tuning normalises to the best valid trial and marks rejected and chosen configs; history draws one
line per key and one trace per non-SAME verdict; empty input gives a placeholder; render gives a div without any
off-host URL and CSV with nested values as JSON.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from typing import Any

import pytest

from dashboards import render
from dashboards.cost_model import comm_cost
from dashboards.figures import SWEEP_FIGURES, accuracy, best_mode, comm, history, latency, syncs, tuning
from tests.dashboards.seed import CP_MODES, MODES, ONE_DEVICE_MODES, model_ms, point


def result_rows(*, modes: tuple[str, ...] = MODES, seed: int = 0) -> list[dict[str, Any]]:
    """Rows shaped like `db.crud.list_results`: every point done, measured and profiled."""
    rng = random.Random(seed)
    rows = []
    for lb in (-1.0, -4.0):
        for T in (256, 1024, 4096):
            for B in (1, 2):
                for mode in modes:
                    for W in ((1,) if mode in ONE_DEVICE_MODES else (2, 4)):
                        p = point(len(rows), mode=mode, W=W, T=T, B=B, lb=lb)
                        ms = model_ms(p, rng)
                        cost = comm_cost(mode, B=B, T=T, H=4, K=32, V=32, W=W, dtype_bytes=2)
                        assert cost is not None
                        rows.append({**p, "id": len(rows), "status": "done", "median_ms": ms, "p10_ms": ms * 0.97,
                                     "p90_ms": ms * 1.03, "collectives": cost.collectives,
                                     "collective_bytes": cost.payload_bytes, "host_syncs": 0, "kernel_launches": 7,
                                     "err_vs_none": None if mode == "none" else 1e-3 * (2 if mode == "warmup_correct" else 1),
                                     "err_vs_reference": 2e-3, "report": {"warmup_chunks": 2}})
    return rows


def names(fig: Any, kind: str | None = None) -> set[str]:
    return {t.name for t in fig.data if kind is None or (t.meta or {}).get("kind") == kind}


@pytest.mark.parametrize("name", list(SWEEP_FIGURES))
@pytest.mark.parametrize("modes", [MODES, ("none", "true_cp", "ring")], ids=["all-modes", "three-modes"])
def test_sweep_figure_one_trace_name_per_mode(name: str, modes: tuple[str, ...]) -> None:
    rows = result_rows(modes=modes)
    fig = SWEEP_FIGURES[name].figure(rows)
    traces = [t for t in fig.data if (t.meta or {}).get("kind") in ("measured", "best")]
    assert traces, f"{name} drew no trace"
    drawn = {t.meta["mode"] for t in traces}
    if name == "best_mode":  # only modes that win a cell appear, and each winner is one of the modes
        assert drawn <= set(modes) and drawn
    elif name == "accuracy":  # `none` is its own yardstick: no error vs none, but an error vs the reference
        assert drawn == set(modes)
    else:
        assert drawn == set(modes)
    assert {t.name for t in traces} == drawn  # each trace is named after its mode


def test_latency_facets_and_speedup() -> None:
    rows = result_rows()
    fig = latency.figure(rows)
    table = latency.frame(rows)
    # facets: lb in {-4, -1} x W in {2, 4}; `none` and warmup_correct (W=1) drawn in each facet
    assert {(r["lb"], r["facet_W"]) for r in table} == {(lb, W) for lb in (-4.0, -1.0) for W in (2, 4)}
    for lb in (-4.0, -1.0):
        for W in (2, 4):
            facet = {t.meta["mode"] for t in fig.data if t.meta["W"] == W and t.meta["lb"] == lb}
            assert facet == set(MODES)
    base = {(r["B"], r["T"], r["lb"]): r["median_ms"] for r in rows if r["mode"] == "none"}
    for r in table:
        assert r["speedup_vs_none"] == pytest.approx(base[(r["B"], r["T"], r["lb"])] / r["median_ms"], rel=1e-12)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_best_mode_is_argmin_per_cell() -> None:
    rows = result_rows()
    table = best_mode.frame(rows)
    assert len(table) == 2 * 2 * 3 * 2  # lb x W x T x B cells
    for cell in table:
        cands = [r for r in rows if r["lb"] == cell["lb"] and r["T"] == cell["T"] and r["B"] == cell["B"]
                 and (r["W"] == cell["W"] or r["W"] == 1)]
        winner = min(cands, key=lambda r: r["median_ms"])
        assert (cell["best_mode"], cell["best_ms"]) == (winner["mode"], winner["median_ms"])
        none = next(r["median_ms"] for r in cands if r["mode"] == "none")
        assert cell["speedup_vs_none"] == pytest.approx(none / winner["median_ms"])
    # by construction true_cp at W=4 wins the largest cells, none wins the smallest
    big = [c for c in table if c["T"] == 4096 and c["B"] == 2 and c["W"] == 4]
    small = [c for c in table if c["T"] == 256 and c["B"] == 1]
    assert {c["best_mode"] for c in big} == {"true_cp"}
    assert {c["best_mode"] for c in small} == {"none"}


def test_comm_measured_beside_model() -> None:
    rows = result_rows()
    rows[5]["collectives"] = {"all_gather": 3}  # one point measured more calls than the model says
    table = comm.frame(rows)
    fig = comm.figure(rows)
    assert names(fig, "model") == {f"{m} (model)" for m in MODES}
    for r in table:
        if r["mode"] in CP_MODES and r is not None:
            cost = comm_cost(r["mode"], B=r["B"], T=r["T"], H=4, K=32, V=32, W=r["W"], dtype_bytes=2)
            assert cost is not None
            assert (r["model_calls"], r["model_bytes"]) == (cost.count, cost.total_payload_bytes)
    odd = [r for r in table if r["measured_calls"] != r["model_calls"]]
    assert odd and all(r["measured_by_kind"] == {"all_gather": 3} for r in odd)


def test_syncs_and_accuracy_tables() -> None:
    rows = result_rows()
    assert {r["host_syncs"] for r in syncs.frame(rows)} == {0}
    acc = accuracy.frame(rows)
    assert {r["mode"] for r in acc} == set(MODES)
    fig = accuracy.figure(rows)
    assert fig.layout.yaxis.type == "log"
    wc = [t for t in fig.data if t.meta["mode"] == "warmup_correct" and t.meta["quantity"] == "err_vs_none"]
    assert len(wc) == 1 and sorted(set(wc[0].x)) == [-4.0, -1.0]


def test_exact_errors_and_single_length_stay_visible() -> None:
    rows = [r for r in result_rows(modes=("none", "true_cp")) if r["T"] == 1024]
    for r in rows:
        r["err_vs_none"] = 0.0 if r["mode"] == "true_cp" else None
    fig = accuracy.figure(rows)
    drawn = next(t for t in fig.data if t.meta["mode"] == "true_cp" and t.meta["quantity"] == "err_vs_none")
    assert set(drawn.y) == {accuracy.ZERO_FLOOR} and {c[4] for c in drawn.customdata} == {"0 (exact)"}
    assert {r["err_vs_none"] for r in accuracy.frame(rows) if r["mode"] == "true_cp"} == {0.0}
    # one sequence length: a log axis of half a decade each side, not an autorange over decades
    assert list(latency.figure(rows).layout.xaxis.range) == pytest.approx([math.log10(1024) - 0.5, math.log10(1024) + 0.5])
    assert latency.figure(result_rows()).layout.xaxis.range is None


def trial_rows() -> list[dict[str, Any]]:
    rows = []
    for kernel in ("k_a", "k_b"):
        for i, ms in enumerate([1.3, 1.0, 1.6, None]):
            rows.append({"id": len(rows), "kernel": kernel, "key_str": "H=4", "device_name": "cpu",
                         "config": {"BV": 16 * (i + 1)}, "status": "ok" if ms else "invalid", "median_ms": ms,
                         "strategy": "exhaustive", "rung": 0, "chosen": ms == 1.0, "error": None if ms else "too big"})
    return rows


def test_tuning_relative_to_best() -> None:
    table = tuning.frame(trial_rows())
    fig = tuning.figure(trial_rows())
    assert names(fig, "trials") == {"k_a", "k_b"}
    assert names(fig) == {"k_a", "k_b", "rejected", "chosen"}
    for kernel in ("k_a", "k_b"):
        rel = [r["rel_to_best"] for r in table if r["kernel"] == kernel and r["rel_to_best"] is not None]
        assert min(rel) == 1.0 and sorted(rel) == pytest.approx([1.0, 1.3, 1.6])
    rejected = next(t for t in fig.data if t.name == "rejected")
    assert len(rejected.x) == 2


def test_history_lines_and_verdicts() -> None:
    rows = []
    for night in range(3):
        for key, mode in (("k1", "true_cp"), ("k2", "ring")):
            verdict = "SLOW" if (night == 2 and key == "k1") else ("SAME" if night == 2 else None)
            rows.append({"key": key, "mode": mode, "sweep_id": night + 1, "sweep_name": f"n{night}", "at": f"2026-11-0{night + 1}",
                         "median_ms": 1.0 + (0.25 if verdict == "SLOW" else 0), "p10_ms": 0.9, "p90_ms": 1.4,
                         "verdict": verdict, "ratio": 1.25 if verdict == "SLOW" else 1.0, "q_value": 0.01})
    fig = history.figure(rows)
    assert names(fig, "history") == {"k1", "k2"}
    assert names(fig, "verdict") == {"SLOW"}  # SAME is not marked
    slow = next(t for t in fig.data if t.name == "SLOW")
    assert list(slow.y) == [1.25]


@pytest.mark.parametrize("module", [*SWEEP_FIGURES.values(), tuning, history], ids=lambda m: m.NAME)
def test_empty_rows_give_placeholder(module: Any) -> None:
    fig = module.figure([])
    assert len(fig.data) == 0 and fig.layout.annotations
    assert render.to_csv(module.frame([]), module.COLUMNS).splitlines() == [",".join(module.COLUMNS)]


def test_render_div_is_local_and_csv_is_parseable() -> None:
    rows = result_rows(modes=("none", "true_cp"))
    div = render.figure_div(latency.figure(rows), "fig-latency")
    assert 'id="fig-latency"' in div and "Plotly.newPlot" in div
    assert "cdn" not in div.lower() and "<script src" not in div
    text = render.to_csv(comm.frame(rows), comm.COLUMNS)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert len(parsed) == len(comm.frame(rows))
    cp = next(r for r in parsed if r["mode"] == "true_cp")
    assert json.loads(cp["measured_by_kind"]) == {"all_gather": 1}
    assert render.plotly_js_path().stat().st_size > 1_000_000
