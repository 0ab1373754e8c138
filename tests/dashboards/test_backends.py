"""Ours and a peer's implementation of each mode side by side: a sweep of two backends (torch and fla) on one page.

Scenarios, read from each figure's JSON (as the browser gets it): the backend slice offers "all" first (the default
with several backends, absent with one) and "all" keeps every backend's rows; latency draws one trace per
(mode, backend) named "<mode> · <backend>", each holding exactly that backend's medians, FLA's true_cp on the same
axes as ours, and each backend's own `none` as a reference; the mode map's cells name the winner's backend
with its speedup ("fla · true_cp 1.23×") and point at the winning row; accuracy keeps each backend's errors apart; no figure mixes two
backends in one trace; FLA's Hopper-guard opt-in (`params.backend_options`) shows in the trace names and hovers,
also when fla is the only backend; so does our triton recompute policy (`triton+keep=wy+states`, a non-boolean
option), as a series apart from the default policy's; one backend alone keeps the plain mode names.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from dashboards import data
from dashboards.figures import SWEEP_FIGURES, accuracy, best_mode, latency
from dashboards.figures.common import REFERENCE_NAME
from tests.dashboards.seed import model_ms, point

TS = (256, 1024, 4096)
RUNS = (("none", 1), ("warmup_correct", 1), ("true_cp", 2), ("true_cp", 4), ("all_gather", 2), ("all_gather", 4))
# FLA's KCP is 0.5x our true_cp time at the largest T (it wins those cells), 1.5x elsewhere; its none is 1.1x ours
FLA_FACTOR = {"none": 1.1, "warmup_correct": 1.2, "all_gather": 1.3}


def two_backend_rows(*, fla_options: dict[str, Any] | None = None, backends: tuple[str, ...] = ("torch", "fla"),
                     ) -> list[dict[str, Any]]:
    rng, rows = random.Random(3), []
    for backend in backends:
        for T in TS:
            for mode, W in RUNS:
                p = point(len(rows), mode=mode, W=W, T=T, B=1, lb=-1.0, backend=backend)
                if mode == "warmup_correct":
                    p["params"]["mode_options"] = {"fallback": "exact"}  # exact: it competes in the mode map
                if backend == "fla" and fla_options:
                    p["params"]["backend_options"] = dict(fla_options)
                ms = model_ms(p, rng)
                if backend == "fla":
                    ms *= (0.5 if max(TS) == T else 1.5) if mode == "true_cp" else FLA_FACTOR[mode]
                rows.append({**p, "id": 100 + len(rows), "status": "done", "median_ms": ms, "p10_ms": ms * 0.97,
                             "p90_ms": ms * 1.03, "n": 5, "collectives": {"all_gather": W - 1}, "collective_bytes": {},
                             "host_syncs": 0, "kernel_launches": 5 if backend == "fla" else 7,
                             "err_vs_none": None if mode == "none" else (1e-3 if backend == "fla" else 1e-5),
                             "err_vs_reference": 2e-3, "report": {}})
    return rows


def fig_json(fig: Any) -> dict[str, Any]:
    return json.loads(fig.to_json())


def traces(fig: Any, kind: str) -> list[dict[str, Any]]:
    return [t for t in fig_json(fig)["data"] if (t.get("meta") or {}).get("kind") == kind]


def test_backend_slice_offers_all_first_and_keeps_every_backend() -> None:
    rows = two_backend_rows()
    options = data.slice_options(rows)
    assert options["backend"] == [data.ALL, "fla", "torch"]
    kept, chosen = data.apply_slice(rows, {})
    assert chosen["backend"] == data.ALL and len(kept) == len(rows)
    kept, chosen = data.apply_slice(rows, {"backend": "fla"})
    assert chosen["backend"] == "fla" and {r["backend"] for r in kept} == {"fla"} and len(kept) == len(rows) // 2
    one = two_backend_rows(backends=("torch",))
    assert data.slice_options(one)["backend"] == ["torch"]
    assert data.apply_slice(one, {"backend": data.ALL})[1]["backend"] == "torch"  # nothing to compare: no "all"


def test_latency_draws_each_backend_of_each_mode_on_the_same_axes() -> None:
    rows = two_backend_rows()
    by_id = {r["id"]: r for r in rows}
    fig = latency.figure(rows)
    measured = traces(fig, "measured")
    assert {t["name"] for t in measured} == {f"{m} · {b}" for m, _ in RUNS for b in ("torch", "fla")}
    for t in measured:
        mode, backend = t["name"].split(" · ")
        pts = [by_id[int(i)] for i in t["ids"]]
        assert {(p["mode"], p["backend"], p["W"]) for p in pts} == {(mode, backend, t["meta"]["W"])}
        assert t["x"] == list(TS) and t["y"] == [p["median_ms"] for p in pts]
        assert t["meta"]["backend"] == backend and t["hovertemplate"].startswith(t["name"])
    # FLA's KCP beside our true_cp in the W=4 facet: same subplot axes, FLA's is the faster one at the largest T
    w4 = {t["name"]: t for t in measured if t["meta"]["W"] == 4}
    ours, fla = w4["true_cp · torch"], w4["true_cp · fla"]
    assert (ours["xaxis"], ours["yaxis"]) == (fla["xaxis"], fla["yaxis"])
    assert fla["y"][-1] < ours["y"][-1] and fla["y"][0] > ours["y"][0]
    assert ours["marker"]["symbol"] == "circle" and fla["marker"]["symbol"] == "circle-open"
    refs = {t["name"] for t in traces(fig, "reference")}
    assert refs == {f"{REFERENCE_NAME} · torch", f"{REFERENCE_NAME} · fla"}
    # each backend's speedup is over its own `none`
    none = {(r["backend"], r["T"]): r["median_ms"] for r in rows if r["mode"] == "none"}
    for r in latency.frame(rows):
        assert r["speedup_vs_none"] == pytest.approx(none[(r["backend"], r["T"])] / by_id[r["id"]]["median_ms"])


def test_mode_map_names_the_backend_of_the_winner() -> None:
    rows = two_backend_rows()
    by_id = {r["id"]: r for r in rows}
    table = best_mode.frame(rows)
    for cell in table:  # the winner is the fastest exact run of either backend
        cands = [r for r in rows if (r["T"], r["W"]) == (cell["T"], cell["W"])]
        win = min(cands, key=lambda r: r["median_ms"])
        assert cell["best_id"] == win["id"] and cell["best"] == f"{win['backend']} · {win['mode']}"
    cell = next(c for c in table if (c["T"], c["W"]) == (TS[-1], 4))
    assert cell["best"] == "fla · true_cp" and cell["runner_up"] == "torch · true_cp"
    fig = best_mode.figure(rows)
    best = traces(fig, "best")
    assert {t["name"] for t in best} == {f"{c['best_mode']} · {c['best_backend']}" for c in table}
    fla = next(t for t in best if t["name"] == "true_cp · fla")
    row, col = fla["y"].index(f"T={TS[-1]}"), fla["x"].index("W=4")
    assert fla["text"][row][col].startswith(f"<b>fla · true_cp</b> {cell['speedup_vs_none']:.2f}×")
    assert "2nd torch · true_cp" in fla["text"][row][col]
    assert by_id[fla["customdata"][row][col][1]]["backend"] == "fla"
    assert "speedup vs none (fla)" in fla["customdata"][row][col][0]
    for t in best:  # every cell a trace colours is won by that trace's (mode, backend)
        for i, line in enumerate(t["customdata"]):
            for j, (_, pid) in enumerate(line):
                if pid is not None:
                    assert (by_id[pid]["mode"], by_id[pid]["backend"]) == (t["meta"]["mode"], t["meta"]["backend"])
                    assert t["text"][i][j]


def test_accuracy_and_every_figure_keep_backends_apart() -> None:
    rows = two_backend_rows()
    by_id = {r["id"]: r for r in rows}
    acc = traces(accuracy.figure(rows), "measured")
    for t in acc:
        mode, backend = t["name"].split(" · ")
        want = [r for r in rows if (r["mode"], r["backend"], r["W"]) == (mode, backend, t["meta"]["W"])]  # a W column
        col = t["meta"]["quantity"]
        if col == "err_vs_none":
            assert sorted(map(str, t["y"])) == sorted(str(r["err_vs_none"]) for r in want)
    assert {t["name"] for t in acc if t["meta"]["quantity"] == "err_vs_none"} >= {"true_cp · fla", "true_cp · torch"}
    for name, module in SWEEP_FIGURES.items():
        for t in fig_json(module.figure(rows))["data"]:
            if "ids" in t and (t.get("meta") or {}).get("kind") == "measured":
                assert len({by_id[int(i)]["backend"] for i in t["ids"]}) == 1, (name, t["name"])
                assert t["name"].endswith(" · " + by_id[int(t["ids"][0])]["backend"]), (name, t["name"])


def test_hopper_guard_opt_in_is_named_in_legend_and_hover() -> None:
    label = "fla+bypass_hopper_guard"
    rows = two_backend_rows(fla_options={"bypass_hopper_guard": True})
    names = {t["name"] for t in traces(latency.figure(rows), "measured")}
    assert f"true_cp · {label}" in names and "true_cp · torch" in names
    assert any(c["best"] == f"{label} · true_cp" for c in best_mode.frame(rows))
    # fla alone, with the opt-in: still named, so the opt-in is seen
    alone = [r for r in rows if r["backend"] == "fla"]
    lat = traces(latency.figure(alone), "measured")
    assert {t["name"] for t in lat} == {f"{m} · {label}" for m, _ in RUNS}
    assert all(label in t["hovertemplate"] for t in lat)
    # off (False) is the default: not shown
    plain = two_backend_rows(fla_options={"bypass_hopper_guard": False}, backends=("fla",))
    assert {t["name"] for t in traces(latency.figure(plain), "measured")} == {m for m, _ in RUNS}


def test_triton_recompute_policy_is_a_series_of_its_own() -> None:
    """`mode_options: {triton: {keep: wy+states}}` (a non-boolean option): its points are `triton+keep=wy+states`,
    drawn apart from the same sweep's default-policy triton points, each trace holding only its own rows."""
    label = "triton+keep=wy+states"
    plain = [{**r, "backend": "triton", "params": {**r["params"], "backend": "triton"}}
             for r in two_backend_rows(backends=("torch",))]
    kept = [{**r, "id": r["id"] + 1000, "median_ms": r["median_ms"] * 0.8,
             "params": {**r["params"], "backend_options": {"keep": "wy+states"}}} for r in plain]
    rows = plain + kept
    lat = traces(latency.figure(rows), "measured")
    assert {t["name"] for t in lat} == {f"{m} · {b}" for m, _ in RUNS for b in ("triton", label)}
    kept_ids = {r["id"] for r in kept}
    for t in lat:
        assert {int(i) in kept_ids for i in t["ids"]} == {t["name"].endswith(label)}, t["name"]
        assert t["name"].endswith(label) == (label in t["hovertemplate"]), t["name"]


def test_one_backend_keeps_plain_mode_names() -> None:
    rows = two_backend_rows(backends=("torch",))
    for module in (latency, best_mode, accuracy):
        for t in fig_json(module.figure(rows))["data"]:
            assert "·" not in t.get("name", "") and "(torch)" not in json.dumps(t.get("text", ""))
