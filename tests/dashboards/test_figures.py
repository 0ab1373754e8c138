"""The figure modules as pure functions: synthetic result rows in, plotly figures and CSV tables out.

Scenarios: every sweep figure draws one trace name per mode present (and only those); latency facets by W and lb
holding only its own runs (`none` as the dashed reference elsewhere) and the speedup it reports equal to none/mode;
the mode map names the fastest exact mode of each T x W cell with its runner-up, and marks a faster approximate one;
scaling reports speedup, efficiency and the model; the communication figure puts the cost model beside the measured counts
(a training step's forward and backward apart, each beside its direction's model); accuracy keeps the modes that
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
from dashboards.cost_model import comm_cost, model_speedup
from dashboards.figures import SWEEP_FIGURES, accuracy, best_mode, comm, common, history, latency, scaling, syncs, tuning
from dashboards.figures.common import REFERENCE_NAME
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


@pytest.mark.parametrize("name", [n for n in SWEEP_FIGURES if n != "libraries"])  # per library: test_libraries.py
@pytest.mark.parametrize("modes", [MODES, ("none", "true_cp", "ring")], ids=["all-modes", "three-modes"])
def test_sweep_figure_one_trace_name_per_mode(name: str, modes: tuple[str, ...]) -> None:
    rows = result_rows(modes=modes)
    fig = SWEEP_FIGURES[name].figure(rows)
    traces = [t for t in fig.data if (t.meta or {}).get("kind") in ("measured", "best")]
    assert traces, f"{name} drew no trace"
    drawn = {t.meta["mode"] for t in traces}
    references = {t.meta["mode"] for t in fig.data if (t.meta or {}).get("kind") == "reference"}
    if name == "best_mode":  # only modes that win a cell appear, and each winner is one of the modes
        assert drawn <= set(modes) and drawn
    elif name == "scaling":  # `none` is the baseline every speedup divides
        assert drawn == set(modes) - {"none"}
    elif name == "predicted":  # the scaling model leaves warmup_correct out
        assert drawn == set(modes) - {"warmup_correct"}
    elif name == "latency":  # without a W=1 facet of its own, `none` is drawn only as the reference line
        assert drawn | references == set(modes) and references == {"none"}
        assert ("none" in drawn) == ("warmup_correct" in modes)
    else:
        assert drawn == set(modes)
    assert {t.name for t in traces} == drawn  # each trace is named after its mode


def test_latency_facets_and_speedup() -> None:
    rows = result_rows()
    fig = latency.figure(rows)
    table = latency.frame(rows)
    # facets: lb in {-4, -1} x W in {1, 2, 4}; each holds its own runs, `none` is a reference in W=2 and W=4
    assert {(r["lb"], r["facet_W"]) for r in table} == {(lb, W) for lb in (-4.0, -1.0) for W in (1, 2, 4)}
    for lb in (-4.0, -1.0):
        for W in (1, 2, 4):
            facet = {t.meta["mode"] for t in fig.data if t.meta["W"] == W and t.meta["lb"] == lb and t.meta["kind"] == "measured"}
            assert facet == (set(ONE_DEVICE_MODES) if W == 1 else set(CP_MODES))
            ref = [t for t in fig.data if t.meta["W"] == W and t.meta["lb"] == lb and t.meta["kind"] == "reference"]
            assert {t.name for t in ref} == (set() if W == 1 else {REFERENCE_NAME})
            assert all(t.line.dash == "dash" for t in ref)
    assert all(r["W"] == r["facet_W"] or r["role"] == "reference" for r in table)
    base = {(r["B"], r["T"], r["lb"]): r["median_ms"] for r in rows if r["mode"] == "none"}
    for r in table:
        assert r["speedup_vs_none"] == pytest.approx(base[(r["B"], r["T"], r["lb"])] / r["median_ms"], rel=1e-12)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_mode_map_is_fastest_exact_per_cell() -> None:
    rows = result_rows()
    table = best_mode.frame(rows)
    assert len(table) == 2 * 3 * 2 * 3  # lb x T x B x W cells
    for cell in table:
        cands = [r for r in rows if (r["lb"], r["T"], r["B"], r["W"]) == (cell["lb"], cell["T"], cell["B"], cell["W"])]
        exact = sorted((r for r in cands if r["mode"] != "warmup_correct"), key=lambda r: r["median_ms"])
        assert (cell["best_mode"], cell["best_ms"], cell["best_id"]) == (exact[0]["mode"], exact[0]["median_ms"], exact[0]["id"])
        none = next(r["median_ms"] for r in rows if r["mode"] == "none" and (r["lb"], r["T"], r["B"]) == (cell["lb"], cell["T"], cell["B"]))
        assert cell["speedup_vs_none"] == pytest.approx(none / exact[0]["median_ms"])
        if len(exact) > 1:
            assert cell["runner_up"] == exact[1]["mode"]
            assert cell["gap"] == pytest.approx(exact[1]["median_ms"] / exact[0]["median_ms"] - 1)
    # by construction true_cp at W=4 wins the largest cells, none wins every W=1 cell (warmup_correct is slower)
    assert {c["best_mode"] for c in table if c["T"] == 4096 and c["B"] == 2 and c["W"] == 4} == {"true_cp"}
    assert {c["best_mode"] for c in table if c["W"] == 1} == {"none"}
    fig = best_mode.figure(rows)
    assert {t.type for t in fig.data} == {"heatmap"}
    assert list(fig.layout.yaxis.categoryarray) == ["T=256", "T=1024", "T=4096"]  # T ascending, categorical
    assert list(fig.layout.xaxis.categoryarray) == ["W=1", "W=2", "W=4"]


def test_mode_map_marks_a_faster_approximate_scheme() -> None:
    rows = result_rows()
    fast = next(r for r in rows if r["mode"] == "warmup_correct" and (r["lb"], r["T"], r["B"]) == (-1.0, 256, 1))
    fast["median_ms"] = 1e-4  # approximate (fallback auto): faster than none, but not the answer
    cell = next(c for c in best_mode.frame(rows) if (c["lb"], c["T"], c["B"], c["W"]) == (-1.0, 256, 1, 1))
    assert (cell["best_mode"], cell["faster_approx"], cell["exact"]) == ("none", "warmup_correct", True)
    # every cell where warmup_correct beat none carries the mark naming it, and only those
    faster = {(r["lb"], r["T"], r["B"]) for r in rows if r["mode"] == "warmup_correct"
              for n in rows if n["mode"] == "none" and (n["lb"], n["T"], n["B"]) == (r["lb"], r["T"], r["B"])
              and r["median_ms"] < n["median_ms"]}
    assert (-1.0, 256, 1) in faster and len(faster) < 12
    fig = best_mode.figure(rows)
    labels = [t for trace in fig.data for line in trace.text for t in line if t]
    assert sum(best_mode.APPROX_MARK + " warmup_correct" in t for t in labels) == len(faster)
    fast["params"] = {**fast["params"], "mode_options": {"fallback": "exact"}}  # exact: now it is the answer
    cell = next(c for c in best_mode.frame(rows) if (c["lb"], c["T"], c["B"], c["W"]) == (-1.0, 256, 1, 1))
    assert (cell["best_mode"], cell["faster_approx"], cell["runner_up"]) == ("warmup_correct", None, "none")


def test_scaling_speedup_efficiency_and_model() -> None:
    rows = result_rows()
    table = scaling.frame(rows)
    none = {(r["lb"], r["T"], r["B"]): r["median_ms"] for r in rows if r["mode"] == "none"}
    assert len(table) == len([r for r in rows if r["mode"] != "none"])
    for r in table:
        s = none[(r["lb"], r["T"], r["B"])] / r["median_ms"]
        assert (r["speedup"], r["efficiency"]) == (pytest.approx(s), pytest.approx(s / r["W"]))
        assert r["model_speedup"] == model_speedup(r["mode"], r["W"], T=r["T"] * r["B"])
    assert model_speedup("headwise", 4, T=4096) == 4.0 and model_speedup("ring", 4, T=4096) == 1.0
    assert model_speedup("true_cp", 2, T=4096) == pytest.approx(2 / 1.5) and model_speedup("none", 1, T=64) is None
    fig = scaling.figure(rows)
    assert names(fig, "model") == {f"{m} (model)" for m in CP_MODES}


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



def test_comm_training_step_per_direction() -> None:
    """A fwd+bwd row profiled per direction is drawn as its forward (circles) and backward (triangles), each beside
    the model of that direction; a backward with an extra all-gather stands out from its model, the forward not."""
    rows = []
    for i, mode in enumerate(("all_gather", "true_cp")):
        p = {**point(i, mode=mode, W=2, T=1024, B=1, lb=-1.0), "direction": "fwd+bwd"}
        split = {}
        for d in ("fwd", "bwd"):
            cost = comm_cost(mode, B=1, T=1024, H=4, K=32, V=32, W=2, dtype_bytes=2, direction=d)
            assert cost is not None
            split[d] = {"collectives": dict(cost.collectives), "collective_bytes": dict(cost.payload_bytes), "host_syncs": 0}
        if mode == "true_cp":
            split["bwd"]["collectives"] = {"all_gather": 2}
        total = {k: sum(split[d]["collectives"].get(k, 0) for d in split) for k in ("all_gather", "reduce_scatter")}
        rows.append({**p, "id": i, "status": "done", "collectives": {k: n for k, n in total.items() if n},
                     "collective_bytes": {}, "by_direction": split})
    table = comm.frame(rows)
    assert [(t["mode"], t["part"]) for t in table] == [("all_gather", "fwd"), ("all_gather", "bwd"), ("true_cp", "fwd"),
                                                      ("true_cp", "bwd")]
    by = {(t["mode"], t["part"]): t for t in table}
    assert by["all_gather", "bwd"]["measured_by_kind"] == by["all_gather", "bwd"]["model_by_kind"] == {"reduce_scatter": 1}
    assert by["all_gather", "fwd"]["model_by_kind"] == {"all_gather": 1}
    assert by["true_cp", "fwd"]["measured_calls"] == by["true_cp", "fwd"]["model_calls"] == 1
    assert (by["true_cp", "bwd"]["measured_calls"], by["true_cp", "bwd"]["model_calls"]) == (2, 1)
    fig = comm.figure(rows)
    calls = [t for t in fig.data if t.meta["quantity"] == "calls"]
    measured = {(t.meta["mode"], t.meta["part"]): (t.marker.symbol, list(t.y)) for t in calls if t.meta["kind"] == "measured"}
    assert measured == {("all_gather", "fwd"): ("circle", [1]), ("all_gather", "bwd"): ("triangle-down", [1]),
                        ("true_cp", "fwd"): ("circle", [1]), ("true_cp", "bwd"): ("triangle-down", [2])}
    models = {(t.meta["mode"], t.meta["part"]): (t.line.dash, list(t.y)) for t in calls if t.meta["kind"] == "model"}
    assert models[("true_cp", "bwd")] == ("dot", [1]) and models[("true_cp", "fwd")] == ("dash", [1])
    unsplit = comm.frame([{**rows[0], "by_direction": None}])   # a training step stored before the split
    assert [(t["part"], t["measured_calls"], t["model_calls"]) for t in unsplit] == [("step", 2, 2)]


def test_syncs_and_accuracy_tables() -> None:
    rows = result_rows()
    assert {r["host_syncs"] for r in syncs.frame(rows)} == {0}
    acc = accuracy.frame(rows)
    assert {r["mode"] for r in acc} == set(MODES)
    fig = accuracy.figure(rows)
    assert fig.layout.yaxis.type == "log"
    wc = [t for t in fig.data if t.meta["mode"] == "warmup_correct" and t.meta["quantity"] == "err_vs_none"]
    assert len(wc) == 1 and sorted({c[5] for c in wc[0].customdata}) == [-4.0, -1.0]  # the true lb in the hover



def test_accuracy_keeps_cp_sizes_apart_at_the_true_lb() -> None:
    """W=1 and W=2 runs of one mode are distinct series in their own columns, and every point sits at its true lb
    (no sideways shift along the lb axis)."""
    rows = result_rows()
    extra = next(r for r in rows if r["mode"] == "true_cp" and r["W"] == 2)
    rows.append({**extra, "id": len(rows), "W": 1, "err_vs_none": 5e-2})  # true_cp also run at W=1
    fig = accuracy.figure(rows)
    measured = [t for t in fig.data if t.meta["kind"] == "measured"]
    by_series = {(t.meta["mode"], t.meta["W"], t.meta["quantity"]): t for t in measured}
    assert len(by_series) == len(measured)  # one trace per (mode, W, row)
    assert {W for m, W, q in by_series if m == "true_cp"} == {1, 2, 4}
    for t in measured:
        assert {c[2] for c in t.customdata} == {t.meta["W"]}  # a trace holds the runs of its own W only
        assert list(t.x) == [c[5] for c in t.customdata]  # drawn at the true lb
        assert set(t.x) <= {-1.0, -4.0}
    cols = {t.meta["W"]: t.xaxis for t in measured if t.meta["quantity"] == "err_vs_none"}
    assert len(set(cols.values())) == 3  # W = 1, 2, 4 in three columns
    w1 = by_series[("true_cp", 1, "err_vs_none")]
    assert list(w1.y) == [5e-2] and cols[1] == w1.xaxis != by_series[("true_cp", 2, "err_vs_none")].xaxis


def test_grad_frame_lists_each_gradient() -> None:
    rows = result_rows(modes=("none", "true_cp"))
    grads = {"dq": 1e-3, "dk": 2e-3, "dv": 3e-3, "dg": 4e-3, "dbeta": 0.0}
    for r in rows:
        r["direction"] = "fwd+bwd"
        if r["mode"] == "true_cp":
            r["report"] = {"grad_errors_vs_none": grads}
    table = accuracy.grad_frame(rows)
    assert len(table) == len([r for r in rows if r["mode"] == "true_cp"])
    assert accuracy.grad_names(table) == ["dq", "dk", "dv", "dg", "dbeta"]
    assert all({k: r[k] for k in grads} == grads for r in table)
    assert accuracy.grad_frame(result_rows()) == []  # forward points carry none


def test_exact_errors_and_single_length_stay_visible() -> None:
    rows = [r for r in result_rows(modes=("none", "true_cp")) if r["T"] == 1024]
    for r in rows:
        r["err_vs_none"] = 0.0 if r["mode"] == "true_cp" else None
    fig = accuracy.figure(rows)
    drawn = next(t for t in fig.data if t.meta["mode"] == "true_cp" and t.meta["quantity"] == "err_vs_none")
    zero = accuracy.zero_level(accuracy.frame(rows))
    assert zero == pytest.approx(1e-5)  # two decades under the smallest non-zero error (2e-3)
    assert set(drawn.y) == {zero} and {c[4] for c in drawn.customdata} == {"exact (0)"}
    assert fig.layout.yaxis.ticktext[0] == "exact (0)" and fig.layout.yaxis.tickvals[0] == zero
    assert len(fig.layout.shapes) == 2 * 3  # the shaded band, in both rows of each W column (1, 2, 4)
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
    # rejected trials sit in their own lane (the second y axis, labelled), never at a timed height
    assert rejected.yaxis == "y2" and set(rejected.y) == {"rejected"}
    assert all(t.yaxis in (None, "y") for t in fig.data if t.meta["kind"] in ("trials", "chosen"))
    assert fig.layout.yaxis2.type == "category" and fig.layout.yaxis.type == "log"
    # trials are whole numbers: integer ticks from 1
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert (axis.tick0, axis.dtick, axis.tickformat) == (1, 1, "d")


def test_log_axes_are_labelled_in_tokens_and_on_the_1_2_5_sequence() -> None:
    """The latency page names the measured lengths on its T axis and labels its time axis 1-2-5 over every median
    and error bar (plotly's own log ticks read "2", "3" for 20K, 30K)."""
    rows = result_rows()
    fig = latency.figure(rows)
    assert list(fig.layout.xaxis.tickvals) == [256, 1024, 4096]
    assert list(fig.layout.xaxis.ticktext) == ["256", "1K", "4K"]
    ticks, text = list(fig.layout.yaxis.tickvals), list(fig.layout.yaxis.ticktext)
    drawn = [v for r in latency.frame(rows) for v in (r["median_ms"], r["p10_ms"], r["p90_ms"])]
    assert ticks[0] <= min(drawn) < ticks[1] and ticks[-2] < max(drawn) <= ticks[-1]  # one step beyond each end
    assert all(f"{t:.3g}" == x and float(x) / 10 ** math.floor(math.log10(float(x))) in (1, 2, 5)
               for t, x in zip(ticks, text, strict=True))
    assert common.tokens_label(131072) == "128K" and common.tokens_label(1000) == "1000"
    assert common.ms_ticks([0.338, 25.5])["ticktext"] == ["0.2", "0.5", "1", "2", "5", "10", "20", "50"]
    assert common.ms_ticks([2.0])["ticktext"] == ["2"] and common.ms_ticks([]) == {}
    many = common.t_ticks(range(1024, 20 * 1024 + 1, 1024))["tickvals"]
    assert len(many) <= 12 and many[0] == 1024  # every other length beyond 12


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
    assert list(fig.layout.yaxis.ticktext) == ["0.5", "1", "2"]  # medians 1-1.25, error bars 0.9-1.4


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


def _unreliable(row: dict[str, Any], why: str = "stopped on timeout with n=3 < min_samples=10 (IQR/median 1.8)") -> None:
    row.update(unreliable=why, median_ms=row["median_ms"] * 20, p10_ms=0.76, p90_ms=139.5, n=3)


def test_mode_map_says_noisy_instead_of_a_winner_over_an_unreliable_baseline() -> None:
    """The issue's store: `none` stopped on timeout with a wide spread gave "true_cp 15.98×". A cell whose `none`
    baseline or whose fastest run is unreliable names no winner and no speedup: it says "noisy" and why."""
    rows = result_rows()
    shape = (-1.0, 1024, 2)
    base = next(r for r in rows if r["mode"] == "none" and (r["lb"], r["T"], r["B"]) == shape)
    _unreliable(base)
    slow = next(r for r in rows if r["mode"] == "true_cp" and (r["lb"], r["T"], r["B"], r["W"]) == (-4.0, 4096, 2, 4))
    _unreliable(slow, "stopped on max_samples before the noise target (n=200, IQR/median 0.4 > 0.02)")
    slow["median_ms"] = 1e-6  # an unreliable run that would win its cell
    table = best_mode.frame(rows)
    noisy = {(c["lb"], c["T"], c["B"], c["W"]): c for c in table if c["noisy"]}
    assert set(noisy) == {(*shape, W) for W in (1, 2, 4)} | {(-4.0, 4096, 2, 4)}
    for key, c in noisy.items():
        assert c["speedup_vs_none"] is None
        why = {(-4.0, 4096, 2, 4): "winner true_cp (torch): stopped on max_samples",
               (*shape, 1): "winner none (torch): stopped on timeout"}.get(key, "baseline none (torch): stopped on timeout")
        assert c["noisy"].startswith(why)
    assert all(c["speedup_vs_none"] is not None for c in table if not c["noisy"])
    fig = best_mode.figure(rows)
    drawn = [t for t in fig.data if t.meta["kind"] == "noisy"]
    labels = [(y, x, text) for t in drawn for y, line in zip(t.y, t.text, strict=True) for x, text in zip(t.x, line, strict=True) if text]
    said = {"T=1024": {"W=1": "winner", "W=2": "baseline", "W=4": "baseline"}, "T=4096": {"W=4": "winner"}}
    assert sorted(labels) == sorted((y, x, f"<b>{best_mode.NOISY}</b><br>{who} unreliable")
                                    for y, xs in said.items() for x, who in xs.items())
    hovers = [h[0] for t in drawn for line in t.customdata for h in line if h[0]]
    assert all("unreliable: " in h for h in hovers) and any("p10–p90 0.76–139.5" in h for h in hovers)
    for t in fig.data:  # no winner trace claims a noisy cell, and no label anywhere shows a speedup for it
        if t.meta["kind"] == "best" and t.meta["B"] == 2 and t.meta["lb"] == -1.0:
            assert all(not text for text in t.text[list(t.y).index("T=1024")])


def test_scaling_never_uses_an_unreliable_baseline() -> None:
    rows = result_rows()
    shape = (-1.0, 1024, 2)
    _unreliable(next(r for r in rows if r["mode"] == "none" and (r["lb"], r["T"], r["B"]) == shape))
    cp = next(r for r in rows if r["mode"] == "ring" and (r["lb"], r["T"], r["B"], r["W"]) == (-4.0, 256, 1, 2))
    _unreliable(cp)
    table = scaling.frame(rows)
    assert not [r for r in table if (r["lb"], r["T"], r["B"]) == shape]  # no efficiency over the unreliable none
    assert len(table) == len([r for r in rows if r["mode"] != "none"]) - len([r for r in rows if r["mode"] != "none" and
                                                                             (r["lb"], r["T"], r["B"]) == shape])
    flagged = [r for r in table if r["unreliable"]]
    assert [r["id"] for r in flagged] == [cp["id"]]  # an unreliable CP run stays, flagged
    fig = scaling.figure(rows)
    edges = [(i, c) for t in fig.data if t.meta.get("kind") == "measured" for i, c in zip(t.ids, t.marker.line.color, strict=True)]
    assert [i for i, c in edges if c == "#9e9e9e"] == [str(cp["id"])] * 2  # its speedup and its efficiency


@pytest.mark.parametrize("case", ["none-noisy", "cp-failed", "no-none"])
def test_scaling_placeholder_says_why(case: str) -> None:
    rows = result_rows(modes=("none", "true_cp"))
    for r in rows:
        if case == "none-noisy" and r["mode"] == "none":
            _unreliable(r)
        if case == "cp-failed" and r["mode"] != "none":
            r.update(status="failed", median_ms=None)
        if case == "no-none" and r["mode"] == "none":
            r.update(status="skipped", median_ms=None)
    fig = scaling.figure(rows)
    text = fig.layout.annotations[0].text
    assert "no runs with a `none` baseline yet" not in text
    assert text == {"none-noisy": "no reliable `none` baseline: every `none` run is unreliable (stopped on timeout with n=3 "
                                  "< min_samples=10 (IQR/median 1.8))",
                    "cp-failed": "`none` is done but no CP point finished: 24 failed",
                    "no-none": "no run of `none` (the one-device baseline) finished yet"}[case]
