"""Tuner tests on CPU (TRITON_INTERPRET=1, wall clock), against a test-only Triton kernel and the real GDN kernels.

Scenarios:
- each strategy (exhaustive, random, halving) returns the best of what it measured: the winner is the lowest
  median among the stored `ok` trials of its final comparison (halving: its last rung); the stored TunedConfig
  carries the winner, the runner-up's and the default's medians;
- a config whose tile is wider than the head dim (BV > V: the space's BV=48 and 64 at V=32) is left out of the
  candidates before a budget is drawn (no trial, no launch);
- a deliberately wrong config (a test-only space entry: num_stages=3 makes the test kernel scale by 3, not 2)
  is `disqualified` and never wins;
- with a scripted timer, halving keeps the fastest configs, grows the samples per rung and keeps the default;
- the real GDN Triton kernels: tune_kernels on a tiny shape stores trials and tuned configs for every kernel
  the op launches (skipped until kernels/ops/gdn/chunk.py exists).
No timing is asserted: only which trial wins among the stored ones.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import triton
import triton.language as tl
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from db import crud
from db.models import TunedConfig, TuningTrial
from kernels.configs import KernelSpec, LaunchConfig, get_spec, register
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.tuner import Shape, TuneSpec, TuningStopped, candidates, tune_case, tune_kernels
from runners.tuner.clock import WallTimer
from runners.tuner.search import first_rung, pinned, search
from runners.tuner.trials import Trial


@triton.jit
def _tuner_scale_kernel(x, y, N, FACTOR: tl.constexpr, BV: tl.constexpr):
    i_v = tl.program_id(0)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < N
    tl.store(y + o_v, tl.load(x + o_v, mask=m_v, other=0.0) * FACTOR, mask=m_v)


SCALE = register(KernelSpec(
    name="test_tuner_scale",
    key=("N", "V"),
    default=LaunchConfig(BV=16, num_warps=4, num_stages=2),
    # BV=48 cannot compile (tl.arange needs a power of 2) and, like BV=64, is wider than V=32: invalid for the key;
    # num_stages=3 is the deliberately wrong entry (the launcher below then scales by 3)
    space={"BV": (16, 32, 48, 64), "num_warps": (2, 4), "num_stages": (2, 3)},
))
V = 32
SEEN = LaunchRecorder()  # every launch of the test kernel, whatever plan it had (the scripted timer reads it)


def scale(x: torch.Tensor, plan: LaunchPlan) -> torch.Tensor:
    key = {"N": x.numel(), "V": V}
    cfg = plan.config_for(SCALE, key)
    SEEN.record(SCALE.name, key, cfg)
    y = torch.empty_like(x)
    factor = 3.0 if cfg.num_stages == 3 else 2.0
    _tuner_scale_kernel[(triton.cdiv(x.numel(), cfg.BV),)](x, y, x.numel(), FACTOR=factor, BV=cfg.BV,
                                                          num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


def _runner():
    x = torch.randn(2 * V)
    return lambda plan: (scale(x, plan),)


def _crashing(crash: LaunchConfig, error: str, seen: list[LaunchConfig] | None = None):
    """A runner of the test kernel that raises `error` (a device fault's text) when it launches with `crash`;
    `seen` collects every config it launched with."""
    x = torch.randn(2 * V)

    def run(plan):
        cfg = plan.configs.get(SCALE.name)
        if seen is not None:
            seen.append(cfg)
        if cfg == crash:
            raise RuntimeError(error)
        return (scale(x, plan),)

    return run


def _stored(session: Session, strategy: str) -> list[TuningTrial]:
    return list(session.scalars(select(TuningTrial).where(TuningTrial.kernel == SCALE.name, TuningTrial.strategy == strategy)))


@pytest.mark.parametrize("strategy", ["exhaustive", "random", "halving"])
def test_tune_case_best_of_stored_trials(session: Session, strategy: str) -> None:
    result = tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy=strategy,
                       budget=6 if strategy == "random" else None, seed=3, samples=2, min_samples=1,
                       max_samples=3, eta=2), timer=WallTimer(warmup=0))
    rows = crud.store_tuning(session, result=result)
    trials = _stored(session, strategy)
    (res,) = result.kernels
    assert len(trials) == len(res.trials)
    by_status = {s: [t for t in trials if t.status == s] for s in ("ok", "invalid", "disqualified", "failed")}
    assert not by_status["failed"], [t.error for t in by_status["failed"]]
    # the final comparison: halving's last rung, else everything measured
    last = max(t.rung for t in trials)
    final_ok = [t for t in by_status["ok"] if t.rung == last]
    (row,) = rows
    assert row.median_ms == min(t.median_ms for t in final_ok)
    assert row.config in [t.config for t in final_ok if t.median_ms == row.median_ms]
    assert row.config.get("num_stages") != 3 and row.config["BV"] <= V
    assert row.default_ms == next(t.median_ms for t in final_ok if t.config == SCALE.default.as_dict())
    if len(final_ok) > 1:
        assert row.runner_up_ms == sorted(t.median_ms for t in final_ok)[1]
    assert row.key == {"N": 2 * V, "V": V} and row.key_str == "N=64,V=32"
    assert session.scalars(select(TunedConfig)).one().config == row.config
    assert all(t.config["BV"] <= V for t in trials)  # BV=64 > V=32 is never drawn nor launched
    if strategy == "random":
        assert len({str(t.config) for t in trials}) == 6
    if strategy != "random":
        # the whole space that fits V was tried: every wrong entry disqualified, none wider than V launched
        assert not by_status["invalid"], [(t.config, t.error) for t in by_status["invalid"]]
        assert all(t.config["num_stages"] == 3 for t in by_status["disqualified"])
        assert len([t for t in by_status["disqualified"] if t.rung == 0]) == 4
        assert all("relative L2 error" in t.error for t in by_status["disqualified"])


class ScriptedTimer:
    """Returns a fixed cost per config of the tuned kernel, read from what the kernel actually launched with."""

    clock = "scripted"

    def __init__(self, cost):
        self.cost = cost
        self.calls: list[tuple[LaunchConfig, int]] = []

    def __call__(self, fn, n):
        fn()
        cfg = SEEN[SCALE.name][1]
        self.calls.append((cfg, n))
        return [self.cost(cfg)] * n


def test_halving_keeps_fastest_and_default(session: Session) -> None:
    # cost: BV=32, 2 warps fastest; default (BV=16, 4 warps) slowest of the valid ones
    cost = lambda c: {(32, 2): 1.0, (32, 4): 2.0, (16, 2): 3.0, (16, 4): 4.0}[(c.BV, c.num_warps)]
    timer = ScriptedTimer(cost)
    result = tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy="halving",
                       min_samples=2, max_samples=50, eta=3), timer=timer)
    rows = crud.store_tuning(session, result=result)
    (res,) = result.kernels
    rungs = sorted({t.rung for t in res.trials})
    assert rungs == [0, 1]
    r1 = [t for t in res.trials if t.rung == 1]
    # best ceil(4/3)=2 survivors plus the pinned default, measured with eta times more samples
    assert sorted((t.config["BV"], t.config["num_warps"]) for t in r1) == [(16, 4), (32, 2), (32, 4)]
    assert {t.n for t in r1} == {6} and {t.n for t in res.trials if t.rung == 0 and t.status == "ok"} == {2}
    (row,) = rows
    assert row.config == {"BV": 32, "num_warps": 2, "num_stages": 2}
    assert (row.median_ms, row.runner_up_ms, row.default_ms) == (1.0, 2.0, 4.0)


def test_random_budget_and_seed(session: Session) -> None:
    timer = ScriptedTimer(lambda c: float(c.BV + c.num_warps))
    spec = TuneSpec(kernels=(SCALE.name,), strategy="random", budget=5, seed=11)
    (r1,) = tune_case(_runner(), device="cpu", spec=spec, timer=timer).kernels
    (r2,) = tune_case(_runner(), device="cpu", spec=spec, timer=timer).kernels
    cfgs = [LaunchConfig.from_dict(t.config) for t in r1.trials]
    assert cfgs == [LaunchConfig.from_dict(t.config) for t in r2.trials]
    assert len(cfgs) == 5 and cfgs[0] == SCALE.default and len(set(cfgs)) == 5
    ok = [t for t in r1.trials if t.status == "ok"]
    assert r1.median_ms == min(t.median_ms for t in ok)


def test_candidates_default_first_and_unique() -> None:
    c = candidates(SCALE)
    assert c[0] == SCALE.default and len(c) == len(set(c)) == 16


def test_hints_lead_the_candidates_and_a_budgeted_draw_always_measures_them() -> None:
    hints = (LaunchConfig(BV=32, num_warps=2, num_stages=2), LaunchConfig(BV=16, num_warps=2, num_stages=3))
    spec = KernelSpec(name="test_tuner_hinted", key=("N",), default=SCALE.default, space=SCALE.space, hints=hints)
    c = candidates(spec)
    assert c[:3] == [SCALE.default, *hints] and len(c) == len(set(c)) == 16
    assert pinned(spec) == 3 and pinned(spec, hints[0]) == 2  # a hint equal to the default counts once
    cost = {cfg: float(i) for i, cfg in enumerate(c)}
    for seed in range(8):  # whatever the random draw, both hints are in every budgeted search's first rung
        for strategy in ("random", "halving"):
            res = search(strategy, c, lambda cfg, n, r, _s=strategy: Trial(kernel="k", key={}, config=cfg, strategy=_s, rung=r,
                                                              status="ok", median_ms=cost[cfg], n=n),
                         budget=4, seed=seed, min_samples=1, max_samples=1, pinned=pinned(spec))
            first = [t.config for t in res.trials if t.rung == 0]
            assert first[:3] == [SCALE.default, *hints] and len(first) == len(set(first)) == 4
    # without hints (pinned=1) a budget of 4 draws 3 of the 15 others; with them, 1 beside the two hints
    assert all(first_rung(spec, None, 4, s)[:3] == [SCALE.default, *hints] for s in range(8))
    drawn = {tuple(first_rung(SCALE, None, 4, s)[1:]) for s in range(8)}
    assert len(drawn) > 1 and all(SCALE.default not in d for d in drawn)


def test_a_hint_outside_the_space_is_refused() -> None:
    with pytest.raises(ValueError, match="hint .* is not a config of its space"):
        KernelSpec(name="test_tuner_bad_hint", key=("N",), default=SCALE.default, space=SCALE.space,
                   hints=(LaunchConfig(BV=128, num_warps=2, num_stages=2),))


def test_backward_kernels_hint_their_low_spill_configs() -> None:
    from kernels.common import chunk_bwd, state_bwd

    for spec in (chunk_bwd.CHUNK_BWD_DQK, chunk_bwd.WY_BWD, state_bwd.CHUNK_STATE_BWD):
        assert spec.hints and all(h.num_warps == 8 for h in spec.hints)
        assert candidates(spec)[1:1 + len(spec.hints)] == list(spec.hints)


def test_bad_strategy_and_unknown_kernel() -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy="bayes"))
    with pytest.raises(ValueError, match="unknown kernel"):
        tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=("no_such_kernel",)))


def test_shape_validation() -> None:
    assert Shape.of({"lengths": [30, 34], "H": 1}).T == 64
    with pytest.raises(ValueError, match="unknown fields"):
        Shape.of({"B": 1, "TT": 3})
    with pytest.raises(ValueError, match="dtype must be one of"):
        Shape.of({"dtype": "int8"})


_HAVE_GDN = importlib.util.find_spec("kernels.ops.gdn.chunk") is not None


@pytest.mark.skipif(not _HAVE_GDN, reason="kernels/ops/gdn/chunk.py (the Triton GDN path) does not exist yet")
def test_tune_kernels_gdn_triton_tiny(session: Session) -> None:
    result = tune_kernels(op="gdn", shapes=[{"B": 1, "T": 64, "H": 1, "K": 16, "V": 32, "dtype": "float32"}],
                          spec=TuneSpec(strategy="random", budget=2, samples=1), device="cpu")
    rows = crud.store_tuning(session, result=result)
    trials = list(session.scalars(select(TuningTrial)))
    kernels_tuned = {r.kernel for r in rows}
    assert kernels_tuned and kernels_tuned <= {t.kernel for t in trials}
    for r in rows:
        ok = [t for t in trials if t.kernel == r.kernel and t.status == "ok"]
        assert r.median_ms == min(t.median_ms for t in ok)
        assert r.device_name == "cpu" and len(r.source_hash) == 64
    assert not [t for t in trials if t.status in ("failed", "disqualified")], [(t.kernel, t.config, t.error) for t in trials]


def _rank_main(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    import runners.tuner.tune as tune_mod

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tuned_here = []
    real = tune_mod.tune_case

    def fake_tune_case(run, *, spec, **kw):  # the op's runner replaced by the test kernel's
        tuned_here.append(rank)
        kw.update(timer=ScriptedTimer(lambda c: float(c.BV) + c.num_warps / 10 + rank))
        return real(_runner(), spec=dataclasses.replace(spec, kernels=(SCALE.name,)), **kw)

    tune_mod.tune_case = fake_tune_case
    rows = tune_kernels(op="gdn", shapes=[{"B": 1, "T": 64, "H": 1, "K": 16, "V": 32, "dtype": "float32"}],
                        spec=TuneSpec(strategy="exhaustive", samples=1), device="cpu").winners()
    out.put((rank, tuned_here, [(r.kernel, r.key_str, r.config, r.median_ms) for r in rows]))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_tune_kernels_rank0_tunes_and_broadcasts() -> None:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = {r: (t, rows) for r, t, rows in (out.get(timeout=60) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert got[0][0] == [0] and got[1][0] == []          # only rank 0 searched
    assert got[0][1] == got[1][1] and got[0][1]           # every rank has rank 0's winners
    assert got[1][1][0][2] == {"BV": 16, "num_warps": 2, "num_stages": 2}


def test_cli_configs_export(tmp_path, migrated_sqlite) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from runners.cli.configs import parse_shape, register
    from runners.errors import CpbenchError

    url = migrated_sqlite(tmp_path)
    engine = create_engine(url)
    result = tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy="exhaustive", samples=1),
                       timer=ScriptedTimer(lambda c: c.BV + c.num_warps / 10))
    with Session(engine) as s:
        crud.store_tuning(s, result=result)
        s.commit()
    engine.dispose()
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    res = runner.invoke(app, ["configs", "export", "--database-url", url, "-o", str(tmp_path / "a.json")])
    assert isinstance(res.exception, CpbenchError) and "refusing to export CPU timings" in str(res.exception)
    res = runner.invoke(app, ["configs", "export", "--database-url", url, "--allow-cpu", "-o", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    assert "1 kernels, 1 entries, device 'cpu'" in res.output
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["kernels"][SCALE.name]["entries"][0]["config"] == {"BV": 16, "num_warps": 2, "num_stages": 2}
    assert parse_shape("B=1,T=8192,dtype=float32,lengths=3:5") == {"B": 1, "T": 8192, "dtype": "float32", "lengths": [3, 5]}
    with pytest.raises(CpbenchError, match="must be an integer"):
        parse_shape("B=x")


def test_ensure_tuned_tunes_once_then_reuses(session: Session, monkeypatch) -> None:
    import runners.tuner.sweep as sweep_mod
    from runners.tuner import ensure_tuned, launched_configs, payload_table

    monkeypatch.setattr(sweep_mod, "op_runner", lambda op, case, backend, direction="fwd": _runner())
    monkeypatch.setattr(sweep_mod, "make_case", lambda op, shape, device: {})
    real = sweep_mod.tune_case
    cost = ScriptedTimer(lambda c: c.BV + c.num_warps / 10)
    monkeypatch.setattr(sweep_mod, "tune_case", lambda *a, **kw: real(*a, **{**kw, "timer": cost}))
    shape = {"B": 1, "T": 64, "H": 1, "K": 16, "V": 32, "dtype": "float32"}
    payload = ensure_tuned(session, op="gdn", shape=shape, device="cpu", sweep_id=None)
    n_trials = len(list(session.scalars(select(TuningTrial))))
    assert n_trials > 0
    best = payload["kernels"][SCALE.name]["entries"][0]["config"]
    assert best == {"BV": 16, "num_warps": 2, "num_stages": 2}
    # through a plan with the payload's table, a launch uses the tuned config, and the measurement can record it
    rec = LaunchRecorder()
    _runner()(LaunchPlan(table=payload_table(payload), recorder=rec))
    assert launched_configs(rec)[SCALE.name] == best
    # a second point with the same key reuses the stored winner: no new trials
    again = ensure_tuned(session, op="gdn", shape=shape, device="cpu", sweep_id=None)
    assert len(list(session.scalars(select(TuningTrial)))) == n_trials
    assert again["kernels"] == payload["kernels"]


def test_tune_missing_keeps_the_trials_of_a_device_crash_for_the_parent(session: Session, monkeypatch) -> None:
    """`tune_missing` (what a rank process runs, no session) ends on a device crash with the trials so far (the
    crasher included) and the error; stored by the parent (`store_tuning`), the crasher is skipped on the retry."""
    import runners.tuner.sweep as sweep_mod
    from runners.tuner import tune_missing, tuning_state

    crash = LaunchConfig(BV=32, num_warps=2, num_stages=2)
    launched: list[LaunchConfig] = []
    run = _crashing(crash, "CUDA error: an illegal memory access was encountered", launched)

    monkeypatch.setattr(sweep_mod, "op_runner", lambda op, case, backend, direction="fwd": run)
    monkeypatch.setattr(sweep_mod, "make_case", lambda op, shape, device: {})
    real = sweep_mod.tune_case
    monkeypatch.setattr(sweep_mod, "tune_case", lambda *a, **kw: real(*a, **{**kw, "timer": ScriptedTimer(lambda c: float(c.BV))}))
    shape = {"B": 1, "T": 64, "H": 1, "K": 16, "V": 32, "dtype": "float32"}
    spec = TuneSpec(strategy="exhaustive", samples=1)
    first = tune_missing(tuning_state(session), op="gdn", shape=shape, device="cpu", spec=spec)
    assert first.payload is None and first.result.winner_rows() == [] and "illegal memory access" in (first.error or "")
    trials = first.result.trial_rows()
    assert trials[-1]["config"] == crash.as_dict() and trials[-1]["status"] == "failed"
    assert launched[-1] == crash  # nothing launched after the fault
    crud.store_tuning(session, result=first.result)
    session.commit()
    assert len(session.scalars(select(TuningTrial)).all()) == len(trials)
    launched.clear()
    again = tune_missing(tuning_state(session), op="gdn", shape=shape, device="cpu", spec=spec)
    assert again.error is None and crash not in launched and again.payload is not None
    assert [t for t in again.result.trial_rows() if t["config"] == crash.as_dict()][0]["status"] == "failed"
    assert [w["kernel"] for w in again.result.winner_rows()] == [SCALE.name]


def test_known_bad_and_fatal_cuda_error(session: Session) -> None:
    bad = LaunchConfig(BV=32, num_warps=2, num_stages=2)
    crash = LaunchConfig(BV=32, num_warps=4, num_stages=2)
    x = torch.randn(2 * V)

    def run(plan):
        cfg = plan.configs.get(SCALE.name)
        assert cfg != bad, "a known-bad config must never launch"
        if cfg == crash:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return (scale(x, plan),)

    # a known crasher is recorded `failed` without launching; the search goes on
    spec = TuneSpec(kernels=(SCALE.name,), strategy="exhaustive", samples=1)
    (res,) = tune_case(run, device="cpu", spec=spec, timer=ScriptedTimer(lambda c: float(c.BV)),
                       known_bad={SCALE.name: {bad: "crashed elsewhere", crash: "too"}}).kernels
    failed = [t for t in res.trials if t.status == "failed"]
    assert {LaunchConfig.from_dict(t.config) for t in failed} == {bad, crash}
    assert {t.error for t in failed} == {"crashed elsewhere", "too"}
    # an unknown device crash poisons the process: raised (the search cannot go on) with the trials so far, stored
    with pytest.raises(RuntimeError, match="illegal memory access") as stopped:
        tune_case(lambda p: run(p.replace(configs={k: v for k, v in p.configs.items() if v != bad})), device="cpu",
                  spec=spec, timer=ScriptedTimer(lambda c: float(c.BV)))
    assert isinstance(stopped.value, TuningStopped)
    crud.store_tuning(session, result=stopped.value.result)
    rec = session.scalars(select(TuningTrial).where(TuningTrial.status == "failed")).all()
    assert any("illegal memory access" in (t.error or "") for t in rec)


def test_each_kernel_is_handed_over_as_decided_and_a_crash_hands_over_its_trials() -> None:
    """`on_result` (how `cpbench tune` stores as it goes) gets each kernel's result once decided; when a device crash
    ends the search, the partial result (the crashing trial included) is handed over before `TuningStopped`."""
    run = _crashing(LaunchConfig(BV=32, num_warps=4, num_stages=2), "CUDA error: an illegal memory access was encountered")
    spec = TuneSpec(kernels=(SCALE.name,), strategy="exhaustive", samples=1)
    timer = ScriptedTimer(lambda c: float(c.BV))
    parts: list = []
    result = tune_case(_runner(), device="cpu", spec=spec, timer=timer, on_result=parts.append)
    assert [p.kernels for p in parts] == [result.kernels] and result.winners()
    parts.clear()
    with pytest.raises(TuningStopped) as stopped:
        tune_case(run, device="cpu", spec=spec, timer=timer, on_result=parts.append)
    (part,) = parts
    assert part.kernels == stopped.value.result.kernels and part.kernels[0].config is None
    assert part.kernels[0].trials[-1].status == "failed" and "illegal memory access" in part.kernels[0].trials[-1].error


def test_triton_launch_error_is_fatal(session: Session) -> None:
    """A Triton launch reports a device fault as "Triton Error [CUDA]: ..." (not "CUDA error"): it must still end
    the search (seen on an H200: every later trial failed on the poisoned context until torch raised)."""
    calls: list[LaunchConfig] = []
    crash = LaunchConfig(BV=32, num_warps=4, num_stages=2)
    run = _crashing(crash, "Triton Error [CUDA]: an illegal memory access was encountered", calls)

    with pytest.raises(RuntimeError, match="Triton Error"):
        tune_case(run, device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy="exhaustive", samples=1),
                  timer=ScriptedTimer(lambda c: float(c.BV)))
    assert calls[-1] == crash  # nothing launched after the fault


def test_miscompile_rules_apply_by_capability_and_triton_version() -> None:
    from runners.tuner.miscompiles import Rule, known_bad

    rule = Rule(kernels=(SCALE.name,), matches=lambda c: c.BV == 32 and c.num_warps == 4, capabilities=("9",),
                triton_min=(3, 4), triton_max=(3, 7, 0), reason="test rule")
    hit = known_bad("9.0", "3.6.0", rules=[rule])
    assert set(hit) == {SCALE.name}
    assert hit[SCALE.name] and all(c.BV == 32 and c.num_warps == 4 for c in hit[SCALE.name])
    assert set(hit[SCALE.name]) == {c for c in SCALE.configs() if c.BV == 32 and c.num_warps == 4}
    assert set(hit[SCALE.name].values()) == {"test rule"}
    for cap, ver in (("8.0", "3.6.0"), ("9.0", "3.7.1"), ("9.0", "3.3.0"), (None, "3.6.0"), ("9.0", "")):
        assert known_bad(cap, ver, rules=[rule]) == {}, (cap, ver)
    assert known_bad("9.0", "3.7.0+git5e3f", rules=[rule]) == hit
    assert known_bad("9.0", "3.4.0rc1", rules=[rule]) == hit
    # the shipped rule covers the chunk-state kernels seen to crash on the H200
    import kernels.common.chunk_state  # noqa: F401  (registers the specs)

    shipped = known_bad("9.0", "3.6.0")
    assert LaunchConfig(BV=32, num_warps=4, num_stages=1) in shipped["chunk_state_transition_fwd"]
    assert LaunchConfig(BV=32, num_warps=4, num_stages=1) in shipped["chunk_state_output_fwd"]
    fwd = ("chunk_state_transition_fwd", "chunk_state_output_fwd", "chunk_state_fwd", "chunk_state_ag_fwd")
    assert all(c.BV == 32 and c.num_stages == 1 for n in fwd for c in shipped.get(n, {}))
    # the reverse state pass crashed at BV=32 with one and with two stages; the state recompute and the WY
    # backward crashed mid-search / when precompiled (2026-12-01)
    import kernels.common.chunk_bwd  # noqa: F401
    import kernels.common.state_bwd  # noqa: F401

    shipped = known_bad("9.0", "3.6.0")
    assert {c.BV for c in shipped["chunk_state_bwd"]} == {32}
    assert LaunchConfig(BV=32, num_warps=4, num_stages=2) in shipped["chunk_state_bwd"]
    assert LaunchConfig(BV=32, num_warps=4, num_stages=1) in shipped["chunk_state_fwd"]
    assert LaunchConfig(BV=32, num_warps=4, num_stages=1) in shipped["chunk_state_ag_fwd"]
    assert set(shipped["wy_bwd"]) == {LaunchConfig(BK=128, BV=32, num_warps=w, num_stages=1) for w in (2, 4, 8)}
    # GDN's fused state+output pass crashed at BV=32 with one and with three stages (session 16's re-tune)
    import kernels.ops.gdn.fused  # noqa: F401

    shipped = known_bad("9.0", "3.6.0")
    fused = {c for c in get_spec("gdn_fused_state_output_fwd").configs() if c.BV == 32}
    assert set(shipped["gdn_fused_state_output_fwd"]) == fused and LaunchConfig(BV=32, num_warps=4, num_stages=3) in fused
    # the fused gradient kernel's 32-wide blocks gave KDA a wrong dk (session 19's GPU test): skipped for both ops
    wide = list(get_spec("chunk_bwd_dqk_wy").configs())
    assert set(shipped["chunk_bwd_dqk_wy"]) == {c for c in wide if 32 in (c.BK, c.BV)}
    assert any(c.BK == c.BV == 64 for c in wide) and not any(c.BK == c.BV == 64 for c in shipped["chunk_bwd_dqk_wy"])
    assert set(shipped) <= {*fwd, "chunk_state_bwd", "wy_bwd", "gdn_fused_state_output_fwd", "chunk_bwd_dqk_wy"}


def test_tune_kernels_fwd_bwd_tunes_a_backward_kernel(session: Session) -> None:
    """direction fwd+bwd: the runner runs forward + Triton backward, so a backward kernel launches, is searched on
    the whole step (its outputs, gradients included, checked against the defaults' run) and gets a tuned row."""
    result = tune_kernels(op="gdn", shapes=[{"B": 1, "T": 64, "H": 1, "K": 32, "V": 32, "dtype": "float32"}],
                          spec=TuneSpec(strategy="random", budget=2, samples=1, kernels=("chunk_bwd_dqk_wy",),
                                        direction="fwd+bwd"),
                          device="cpu")
    rows = crud.store_tuning(session, result=result)
    assert [r.kernel for r in rows] == ["chunk_bwd_dqk_wy"]  # GDN's gradient kernel (AUTO_BWD_GRADS)
    trials = [t for t in session.scalars(select(TuningTrial)) if t.kernel == "chunk_bwd_dqk_wy"]
    assert rows[0].median_ms == min(t.median_ms for t in trials if t.status == "ok")
    with pytest.raises(ValueError, match="direction"):
        tune_kernels(op="gdn", shapes=[{"B": 1, "T": 64, "H": 1, "K": 32, "V": 32, "dtype": "float32"}],
                     device="cpu", spec=TuneSpec(direction="bwd"))


def test_tune_spec_is_the_one_source_of_the_defaults() -> None:
    """`cpbench tune`'s options and the search functions default to `TuneSpec()`'s values; `TuneSpec.of` builds one
    from a stored `tuning` block, refusing unknown options; importing it loads no torch (the sweep spec reads it)."""
    import inspect
    import subprocess
    import sys

    from runners.cli.configs import tune_command

    d = TuneSpec()
    cli = {p.name: p.default.default for p in inspect.signature(tune_command).parameters.values()}
    assert (cli["strategy"], cli["budget"], cli["seed"], cli["samples"], cli["direction"], cli["fla_min_gain"]) == (
        d.strategy, d.budget, d.seed, d.samples, d.direction, d.min_gain)
    params = inspect.signature(search).parameters
    assert {f: params[f].default for f in ("budget", "seed", "samples", "min_samples", "max_samples", "eta")} == {
        f: getattr(d, f) for f in ("budget", "seed", "samples", "min_samples", "max_samples", "eta")}
    assert TuneSpec.of({"strategy": "random", "budget": 4}, kernels=["a"]) == TuneSpec(strategy="random", budget=4,
                                                                                       kernels=("a",))
    with pytest.raises(ValueError, match=r"unknown tuning option\(s\) \['rungs'\]"):
        TuneSpec.of({"rungs": 3})
    code = "import sys, runners.tuner.spec, runners.tuner.result; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_tune_result_holds_what_storing_and_exporting_need() -> None:
    """The decision per kernel and key (winner, its median, the default's and runner-up's), the trials as stored
    rows, the winners as transient TunedConfig rows the exporter reads; it survives pickling (a gang's queue), and so
    does the TuningStopped of a crashed search with its partial result."""
    import pickle

    from runners.tuner.export import export_from_rows

    timer = ScriptedTimer(lambda c: float(c.BV) + c.num_warps / 10)
    result = tune_case(_runner(), device="cpu", spec=TuneSpec(kernels=(SCALE.name,), strategy="exhaustive", samples=1),
                       timer=timer)
    assert pickle.loads(pickle.dumps(result)) == result
    (k,) = result.winners()
    assert (k.kernel, k.key_str, k.config, k.median_ms) == (SCALE.name, "N=64,V=32", {"BV": 16, "num_warps": 2, "num_stages": 2}, 16.2)
    assert k.default_ms == 16.4 and k.runner_up_ms == 16.4 and len(k.source_hash) == 64
    trials = result.trial_rows()
    # BV=48 and 64 > V=32 are left out before launching: the 8 configs with BV 16 or 32 remain
    assert len(trials) == len(k.trials) == 8 and {t["kernel"] for t in trials} == {SCALE.name}
    assert {t["device_name"] for t in trials} == {"cpu"} and trials[0]["config"] == SCALE.default.as_dict()
    (row,) = result.tuned_rows()
    assert (row.kernel, row.config, row.measured_at) == (k.kernel, k.config, k.measured_at)
    data = export_from_rows(result.tuned_rows(), allow_cpu=True)
    assert data["kernels"][SCALE.name]["entries"][0]["config"] == k.config
    stop = TuningStopped(result, RuntimeError("CUDA error: an illegal memory access was encountered"))
    again = pickle.loads(pickle.dumps(stop))
    assert again.result == result and str(again) == "tuning stopped: RuntimeError: CUDA error: an illegal memory access was encountered"
