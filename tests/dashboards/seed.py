"""Seed a migrated store directly through `db.crud` (fast: no sweep is run) for the dashboard and API tests.

`seed_store(url)` writes:
- a CP sweep "cp-demo": modes none and warmup_correct (W=1), headwise, all_gather, ring, true_cp (W=2 and 4), over
  T in (256, 1024), B in (1, 2), lb in (-1, -4), every point measured and profiled (collectives as the cost model
  says), plus one failed and one skipped point; latencies follow a simple model with seeded noise;
- tuning trials for two kernels (two keys each, one invalid trial) and their tuned configs on device "cpu";
- three nightly sweeps of two keys, and regression verdicts on the last one: SLOW for one key, SAME for the other,
  and CHANGED for the other key on the second night.
Returns a `Seeded` with the ids and the modes, so tests can say what the figures must hold.
`seed_topologies(url)`: a sweep run on one host and, at W=4, also on two "hosts" of 2 (`TOPO_2X2`), its medians
`TOPO_MS`. `page_figure(html, div)`: the data and layout a page's plotly div draws.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from dashboards.cost_model import comm_cost
from db import crud
from db.models import Point, Sweep
from db.session import session_scope
from db.topology import Topology

CP_MODES = ("headwise", "all_gather", "ring", "true_cp")
ONE_DEVICE_MODES = ("none", "warmup_correct")
MODES = ("none", *CP_MODES, "warmup_correct")
FACTS = {"device_name": "cpu", "torch": "2.13.0", "python": "3.11", "cpbench": "0.1.0", "host": "test"}


@dataclass
class Seeded:
    sweep_id: int
    modes: tuple[str, ...] = MODES
    n_points: int = 0
    kernels: tuple[str, ...] = ("seed_state_fwd", "seed_wy_fwd")
    nightly_ids: list[int] = field(default_factory=list)
    keys: tuple[str, ...] = ()


def point(idx: int, *, mode: str, W: int, T: int, B: int, lb: float, H: int = 4, K: int = 32, V: int = 32,
          backend: str = "torch", op: str = "gdn") -> dict[str, Any]:
    p: dict[str, Any] = {"idx": idx, "op": op, "mode": mode, "backend": backend, "B": B, "T": T, "H": H, "K": K, "V": V,
                         "lb": lb, "W": W, "layout": "contiguous", "direction": "fwd", "dtype": "bfloat16", "seed": 0}
    p["key"] = "/".join(f"{k}={p[k]}" for k in ("op", "mode", "backend", "B", "T", "H", "K", "V", "lb", "W", "layout", "dtype"))
    p["params"] = {k: p[k] for k in ("B", "T", "H", "K", "V", "lb", "W", "layout", "direction", "dtype")}
    return p


def model_ms(p: dict[str, Any], rng: random.Random) -> float:
    """none ∝ B T; CP modes pay an overhead and gain ~W/1.7 (true_cp), ring gains nothing, all_gather nothing."""
    base = 1e-3 * p["B"] * p["T"]
    speed = {"none": 1.0, "warmup_correct": 1.6, "headwise": p["W"] / 2.0, "all_gather": 0.9, "ring": 0.95,
             "true_cp": p["W"] / 1.7}[p["mode"]]
    overhead = 0.0 if p["mode"] == "none" else 0.2
    return (base / speed + overhead) * rng.uniform(0.97, 1.03)


def _measure(session: Any, point_id: int, p: dict[str, Any], env_id: int, ms: float, topology: Topology | None = None) -> None:
    samples = [ms * f for f in (0.96, 0.98, 1.0, 1.02, 1.04)]
    summary = {"median_ms": ms, "p10_ms": ms * 0.97, "p90_ms": ms * 1.03, "iqr_ms": ms * 0.04, "mean_ms": ms,
               "min_ms": ms * 0.96, "max_ms": ms * 1.04, "n": 5}
    err_none = 2e-3 * 10 ** (p["lb"] / 2) if p["mode"] == "warmup_correct" else 4e-3
    if p["mode"] == "none":
        err_none = None
    report = {"warmup_chunks": 2, "fallback_fraction": 0.25} if p["mode"] == "warmup_correct" else {}
    crud.store_measurement(session, point_id=point_id, environment_id=env_id, worker="seed", clock="wall",
                           samples=samples, summary=summary, stop_reason="max_samples", err_vs_none=err_none,
                           err_vs_reference=3e-3, configs={}, report=report, **(topology.columns() if topology else {}))
    cost = comm_cost(p["mode"], B=p["B"], T=p["T"], H=p["H"], K=p["K"], V=p["V"], W=p["W"], dtype_bytes=2, op=p["op"])
    assert cost is not None
    crud.store_profile(session, point_id=point_id, collectives=cost.collectives, collective_bytes=cost.payload_bytes,
                       host_syncs=0, sync_events={}, kernel_launches=0, peak_memory_bytes=None)


def _mark(session: Any, sweep: Sweep, statuses: dict[int, tuple[str, str | None]], when: datetime) -> list[Point]:
    pts = list(session.query(Point).filter(Point.sweep_id == sweep.id).order_by(Point.idx))
    for pt in pts:
        st, msg = statuses.get(pt.idx, ("done", None))
        pt.status, pt.finished_at = st, when
        if st == "failed":
            pt.error = msg
        if st == "skipped":
            pt.reason = msg
    sweep.status, sweep.finished_at = "done", when
    session.flush()
    return pts


def seed_cp_sweep(session: Any, rng: random.Random, env_id: int) -> tuple[int, int]:
    pts, idx = [], 0
    for lb in (-1.0, -4.0):
        for T in (256, 1024):
            for B in (1, 2):
                for mode in ONE_DEVICE_MODES:
                    pts.append(point(idx, mode=mode, W=1, T=T, B=B, lb=lb))
                    idx += 1
                for W in (2, 4):
                    for mode in CP_MODES:
                        pts.append(point(idx, mode=mode, W=W, T=T, B=B, lb=lb))
                        idx += 1
    bad = {idx: ("failed", "RuntimeError: rank 1 crashed"), idx + 1: ("skipped", "H % W != 0")}
    pts.append(point(idx, mode="true_cp", W=4, T=2048, B=1, lb=-1.0))
    pts.append(point(idx + 1, mode="headwise", W=8, T=2048, B=1, lb=-1.0))
    sweep = crud.create_sweep(session, name="cp-demo", tags=["demo"], spec={"name": "cp-demo"}, points=pts)
    for pt in _mark(session, sweep, bad, datetime.now(timezone.utc)):
        if pt.idx not in bad:
            _measure(session, pt.id, pts[pt.idx], env_id, model_ms(pts[pt.idx], rng))
    return sweep.id, len(pts)


def seed_tuning(session: Any, rng: random.Random, sweep_id: int) -> None:
    for kernel in ("seed_state_fwd", "seed_wy_fwd"):
        for H in (4, 8):
            key = {"H": H, "K": 32, "V": 32}
            key_str = ",".join(f"{k}={v}" for k, v in sorted(key.items()))
            best: tuple[float, dict[str, Any]] | None = None
            for i, (bv, warps) in enumerate([(16, 2), (16, 4), (32, 2), (32, 4), (64, 8)]):
                config = {"BV": bv, "num_warps": warps, "num_stages": 1}
                if bv == 64:
                    crud.store_trial(session, sweep_id=sweep_id, device_name="cpu", kernel=kernel, key=key, key_str=key_str,
                                     config=config, strategy="exhaustive", rung=0, status="invalid", median_ms=None, n=0,
                                     error="BV=64 exceeds V=32")
                    continue
                ms = (1.0 + 0.1 * i) * rng.uniform(0.9, 1.1)
                crud.store_trial(session, sweep_id=sweep_id, device_name="cpu", kernel=kernel, key=key, key_str=key_str,
                                 config=config, strategy="exhaustive", rung=0, status="ok", median_ms=ms, n=10)
                if best is None or ms < best[0]:
                    best = (ms, config)
            assert best is not None
            crud.upsert_tuned_config(session, kernel=kernel, key=key, key_str=key_str, device_name="cpu",
                                     compute_capability=None, config=best[1], median_ms=best[0], default_ms=best[0] * 1.2,
                                     runner_up_ms=best[0] * 1.05, source_hash="0" * 64, sweep_id=sweep_id, environment_id=None)


def seed_nightly(session: Any, rng: random.Random, env_id: int) -> tuple[list[int], tuple[str, ...]]:
    specs = [point(0, mode="true_cp", W=2, T=1024, B=1, lb=-1.0), point(1, mode="ring", W=2, T=1024, B=1, lb=-1.0)]
    keys = tuple(p["key"] for p in specs)
    start = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)
    ids = []
    for night in range(3):
        sweep = crud.create_sweep(session, name=f"nightly-{night}", tags=["nightly"], spec={"name": "nightly"}, points=specs)
        sweep.created_at = start + timedelta(days=night)
        for pt in _mark(session, sweep, {}, sweep.created_at):
            slow = 1.25 if (night == 2 and pt.idx == 0) else 1.0
            _measure(session, pt.id, specs[pt.idx], env_id, model_ms(specs[pt.idx], rng) * slow)
        ids.append(sweep.id)
    rows = [
        {"run_id": "run-2", "suite": "nightly", "sweep_id": ids[2], "baseline_ref": "night-1", "key": keys[0],
         "verdict": "SLOW", "ratio": 1.25, "effect_log": 0.22, "p_welch": 1e-4, "p_mannwhitney": 1e-3, "q_value": 2e-4},
        {"run_id": "run-2", "suite": "nightly", "sweep_id": ids[2], "baseline_ref": "night-1", "key": keys[1],
         "verdict": "SAME", "ratio": 1.0, "effect_log": 0.0, "p_welch": 0.8, "p_mannwhitney": 0.7, "q_value": 0.8},
        {"run_id": "run-1", "suite": "nightly", "sweep_id": ids[1], "baseline_ref": "night-0", "key": keys[1],
         "verdict": "CHANGED", "ratio": 1.0, "detail": {"collectives": {"send": [1, 2]}}},
    ]
    crud.store_regression_results(session, rows=rows)
    return ids, keys


def seed_store(url: str, *, seed: int = 0) -> Seeded:
    rng = random.Random(seed)
    with session_scope(url) as session:
        env = crud.get_or_create_environment(session, facts=FACTS)
        session.flush()
        sweep_id, n = seed_cp_sweep(session, rng, env.id)
        seed_tuning(session, rng, sweep_id)
        nightly, keys = seed_nightly(session, rng, env.id)
    return Seeded(sweep_id=sweep_id, n_points=n, nightly_ids=nightly, keys=keys)


FAILED_ERROR = ('Traceback (most recent call last):\n  File "runners/execute.py", line 1, in run\n    step()\n'
                'RuntimeError: 0 active drivers ([]). There should only be one.')


@dataclass
class Extras:
    failed_id: int
    run_ids: list[int]
    run: str


def seed_index_extras(url: str, *, seed: int = 1, run: str = "r-0001", sweeps_in_run: int = 4) -> Extras:
    """A sweep whose every point failed (a traceback each), and one regression run of `sweeps_in_run` sweeps tagged
    `regress` and `regress-run:<run>`: what the sweeps list must show as failed and collapse."""
    rng = random.Random(seed)
    with session_scope(url) as session:
        env = crud.get_or_create_environment(session, facts=FACTS)
        session.flush()
        pts = [point(i, mode=m, W=2, T=256, B=1, lb=-1.0, backend="triton") for i, m in enumerate(("ring", "true_cp"))]
        failed = crud.create_sweep(session, name="all-failed", tags=["cpu"], spec={"name": "all-failed"}, points=pts)
        _mark(session, failed, {p["idx"]: ("failed", FAILED_ERROR) for p in pts}, datetime.now(timezone.utc))
        ids = []
        specs = [point(0, mode="true_cp", W=2, T=1024, B=1, lb=-1.0)]
        for i in range(sweeps_in_run):
            sweep = crud.create_sweep(session, name=f"nightly-regress-{i}", tags=["regress", f"regress-run:{run}"],
                                      spec={"name": "nightly"}, points=specs)
            for pt in _mark(session, sweep, {}, datetime.now(timezone.utc)):
                _measure(session, pt.id, specs[pt.idx], env.id, model_ms(specs[pt.idx], rng))
            ids.append(sweep.id)
        return Extras(failed_id=failed.id, run_ids=ids, run=run)


@dataclass
class PageExtras:
    sweep_id: int
    unreliable_idx: int
    grads: dict[str, float]
    skip_reasons: dict[tuple[str, str], int]  # (backend, reason) -> points


UNRELIABLE_WHY = "stopped on timeout with n=3 < min_samples=10 (IQR/median 1.8)"


def seed_page_extras(url: str) -> PageExtras:
    """A fwd+bwd sweep "honest": `none` (W=1) stored done but unreliable (timeout, n=3, p10-p90 0.76-139.5 ms),
    true_cp at W=2 done with its per-gradient errors in the report, and three skipped points under two reasons."""
    grads = {"dq": 1.5e-3, "dk": 2.5e-3, "dv": 3.5e-3, "dg": 4.5e-3, "dbeta": 5.5e-4}
    reasons = {("torch", "H % W != 0 (H=4, W=8)"): 2, ("fla", "backend fla does not run mode ring"): 1}
    with session_scope(url) as session:
        env = crud.get_or_create_environment(session, facts=FACTS)
        session.flush()
        pts = [point(0, mode="none", W=1, T=1024, B=1, lb=-1.0), point(1, mode="true_cp", W=2, T=1024, B=1, lb=-1.0)]
        pts += [point(2 + i, mode="headwise", W=8, T=1024 * (i + 1), B=1, lb=-1.0) for i in range(2)]
        pts.append(point(4, mode="ring", W=2, T=1024, B=1, lb=-1.0, backend="fla"))
        for p in pts:
            p["direction"] = p["params"]["direction"] = "fwd+bwd"
            p["key"] += "/fwd+bwd"
        sweep = crud.create_sweep(session, name="honest", tags=["cpu"], spec={"name": "honest"}, points=pts)
        skipped = {2: ("skipped", "H % W != 0 (H=4, W=8)"), 3: ("skipped", "H % W != 0 (H=4, W=8)"),
                   4: ("skipped", "backend fla does not run mode ring")}
        for pt in _mark(session, sweep, skipped, datetime.now(timezone.utc)):
            if pt.idx == 0:
                crud.store_measurement(
                    session, point_id=pt.id, environment_id=env.id, worker="seed", clock="wall", samples=[0.76, 2.0, 139.5],
                    summary={"median_ms": 2.0, "p10_ms": 0.76, "p90_ms": 139.5, "iqr_ms": 70.0, "mean_ms": 47.4,
                             "min_ms": 0.76, "max_ms": 139.5, "n": 3},
                    stop_reason="timeout", unreliable=UNRELIABLE_WHY, err_vs_none=None, err_vs_reference=1e-3)
            elif pt.idx == 1:
                crud.store_measurement(
                    session, point_id=pt.id, environment_id=env.id, worker="seed", clock="wall", samples=[0.125] * 10,
                    summary={"median_ms": 0.125, "p10_ms": 0.125, "p90_ms": 0.125, "iqr_ms": 0.0, "mean_ms": 0.125,
                             "min_ms": 0.125, "max_ms": 0.125, "n": 10},
                    stop_reason="noise", err_vs_none=max(grads.values()), err_vs_reference=1e-3,
                    report={"grad_errors_vs_none": grads})
        return PageExtras(sweep_id=sweep.id, unreliable_idx=0, grads=grads, skip_reasons=reasons)


# ms per (backend, mode, W, T) of the "libraries" sweep (GDN fwd, B=1, H=16, K=V=128, bf16, lb=-5): FlashQLA's
# warmup_correct the fastest at W=1, ours (triton) at W=2, where FlashQLA and FLA as dispatched are skipped
LIB_MS = {
    ("triton", "none", 1): (0.40, 2.40), ("triton", "warmup_correct", 1): (0.30, 1.20), ("triton", "true_cp", 2): (0.25, 1.30),
    ("fla", "none", 1): (0.88, 2.60), ("fla", "warmup_correct", 1): (0.50, 1.50), ("fla", "true_cp", 2): (0.45, 1.40),
    ("fla_dispatch", "none", 1): (0.27, 0.70), ("fla_dispatch", "warmup_correct", 1): (0.26, 0.65),
    ("flash_qla", "none", 1): (0.27, 0.69), ("flash_qla", "warmup_correct", 1): (0.13, 0.40),
}  # fmt: skip
LIB_TS = (8192, 65536)
LIB_SKIPS = {
    ("flash_qla", "true_cp", 2, "bfloat16"): "FlashQLA's inter-card CP (FlashQLACPContext) needs W=2 GPUs of one host",
    ("fla_dispatch", "true_cp", 2, "bfloat16"): "fla_dispatch runs FLA as installed, on one device: no CP context",
    ("flash_qla", "none", 1, "float32"): "FlashQLA runs bfloat16 and float16 only, got float32",
}
LIB_NOISY = ("fla_dispatch", "warmup_correct", 1, 65536)  # unreliable: never a headline, never the reference


@dataclass
class Libraries:
    sweep_id: int
    ids: dict[tuple[str, str, int, int], int]  # (backend, mode, W, T) -> point id, bf16 points


def seed_libraries(url: str) -> Libraries:
    """A sweep "libraries" of four backends (ours: triton; fla; fla_dispatch; flash_qla), the measured times of
    `LIB_MS` at T in `LIB_TS` (every warmup_correct with `fallback: exact`: it competes in the mode map), the skipped
    points of `LIB_SKIPS` (one in a float32 slice, beside our float32 `none`) and `LIB_NOISY` unreliable."""
    with session_scope(url) as session:
        env = crud.get_or_create_environment(session, facts=FACTS)
        session.flush()
        specs: list[tuple[tuple[str, str, int, str, int], dict[str, Any]]] = []
        runs = [(b, m, W, "bfloat16", T) for (b, m, W) in LIB_MS for T in LIB_TS]
        runs += [(b, m, W, dt, T) for (b, m, W, dt) in LIB_SKIPS for T in LIB_TS] + [("triton", "none", 1, "float32", 8192)]
        for b, m, W, dt, T in runs:
            p = point(len(specs), mode=m, W=W, T=T, B=1, lb=-5.0, H=16, K=128, V=128, backend=b)
            p["dtype"] = p["params"]["dtype"] = dt
            p["key"] += f"/{dt}"
            if m == "warmup_correct":
                p["params"]["mode_options"] = {"fallback": "exact"}
            specs.append(((b, m, W, dt, T), p))
        sweep = crud.create_sweep(session, name="libraries", tags=["peers"], spec={"name": "libraries"},
                                  points=[p for _, p in specs])  # fmt: skip
        skipped = {p["idx"]: ("skipped", LIB_SKIPS[k[:4]]) for k, p in specs if k[:4] in LIB_SKIPS}
        ids = {}
        for pt in _mark(session, sweep, skipped, datetime.now(timezone.utc)):
            (b, m, W, dt, T), p = specs[pt.idx]
            if pt.idx in skipped:
                continue
            ms = LIB_MS[(b, m, W)][LIB_TS.index(T)] if dt == "bfloat16" else 1.0
            if (b, m, W, T) == LIB_NOISY:
                crud.store_measurement(
                    session, point_id=pt.id, environment_id=env.id, worker="seed", clock="cuda", samples=[ms, ms * 3, ms / 2],
                    summary={"median_ms": ms, "p10_ms": ms / 2, "p90_ms": ms * 3, "iqr_ms": ms, "mean_ms": ms, "min_ms": ms / 2,
                             "max_ms": ms * 3, "n": 3},
                    stop_reason="timeout", unreliable=UNRELIABLE_WHY, err_vs_none=1e-3, err_vs_reference=3e-3)  # fmt: skip
            else:
                _measure(session, pt.id, p, env.id, ms)
            if dt == "bfloat16":
                ids[(b, m, W, T)] = pt.id
        return Libraries(sweep_id=sweep.id, ids=ids)


TOPO_2X2 = Topology(2, 2, "loopback+tcp/lo")  # what the multi-host worker records for two torchrun "hosts" of 2 ranks
TOPO_TS = (256, 1024)
# medians per (mode, W, hosts): the same shapes on one host and, at W=4, on two hosts of 2 ranks (slower: the
# collectives cross the inter-host link); per T as a multiple of T / 256
TOPO_MS = {("none", 1, 1): 1.0, ("true_cp", 2, 1): 0.6, ("true_cp", 4, 1): 0.4, ("true_cp", 4, 2): 0.5,
           ("ring", 2, 1): 1.1, ("ring", 4, 1): 1.2, ("ring", 4, 2): 1.5}


@dataclass
class Topologies:
    sweep_id: int
    ids: dict[tuple[str, int, int, int], int]  # (mode, W, hosts, T) -> point id


def seed_topologies(url: str) -> Topologies:
    """A sweep measured on one host (W = 1, 2, 4) and again at W=4 on TOPO_2X2, as two points of the same shape;
    every measurement records its topology's columns."""
    with session_scope(url) as session:
        env = crud.get_or_create_environment(session, facts=FACTS)
        session.flush()
        keys = [(k, T) for k in TOPO_MS for T in TOPO_TS]
        pts = [point(i, mode=mode, W=W, T=T, B=1, lb=-1.0) for i, ((mode, W, _), T) in enumerate(keys)]
        sweep = crud.create_sweep(session, name="two-topologies", tags=["multi-host"], spec={"name": "topo"}, points=pts)
        ids = {}
        for pt in _mark(session, sweep, {}, datetime.now(timezone.utc)):
            (mode, W, hosts), T = keys[pt.idx]
            topo = TOPO_2X2 if hosts == 2 else Topology(1, W, "none" if W == 1 else "loopback")
            _measure(session, pt.id, pts[pt.idx], env.id, TOPO_MS[(mode, W, hosts)] * T / 256, topo)
            ids[(mode, W, hosts, T)] = pt.id
        return Topologies(sweep.id, ids)


def page_figure(html: str, div: str) -> dict[str, Any]:
    """The figure a page draws in `div` (plotly's newPlot call): {"data": traces, "layout": layout}."""
    m = re.search(rf'Plotly\.newPlot\(\s*"{div}",\s*(\[.*?\]),\s*(\{{.*?\}}),\s*\{{"displaylogo"', html, re.S)
    assert m, f"no figure {div}"
    return {"data": json.loads(m.group(1)), "layout": json.loads(m.group(2))}
