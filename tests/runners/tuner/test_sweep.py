"""A sweep with `tune: true` (runners.worker -> runners.execute.tune_job -> runners.tuner.tune_missing) on the CPU.

Scenario: one GDN point on the interpreted Triton backend (T=64, H=1, K=V=32, fp32, mode none, W=1) with a small
random search (`tuning: {strategy: random, budget: 4, samples: 1}`). The worker tunes the kernels the point
launches before timing it: the trials are stored with the sweep's id, at most `budget` per kernel, each `ok` one
timed with `samples` samples; the winner per kernel (lowest median among its ok trials) is the TunedConfig; and
the measurement records, per kernel, the launch key and config it ran with, which are the TunedConfig's key and
config. The worker's heartbeat beats every 0.2 s meanwhile, so other writers commit while trials are stored
(on SQLite the tuner must not write from a read transaction they overtook). Also: the `tuning` block is
validated with errors naming the field, and its defaults are `runners.tuner.TuneSpec`'s.
One writer: the same sweep with the gang replaced by an in-process pool whose jobs cannot open a store session
(`Session()` raises inside a job): the tuning job still returns its trials and winners, and the worker (the
parent) stores them.
No timing is asserted: only which stored trial won and what the measurement says it launched.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from runners.errors import SpecError
from tests.runners.engine_fixtures import store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc

BUDGET = 4


def test_sweep_tunes_then_times_with_tuned_configs(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    from db.models import Measurement, Point, TunedConfig, TuningTrial
    from db.session import session_scope
    from kernels.autotune import key_str
    from runners.engine import submit_spec
    from runners.spec import load_spec
    from runners.worker import run_worker

    spec = write_spec(
        tmp_path, backends=["triton"], axes={"T": 64, "H": 1, "K": 32, "V": 32}, tune=True,
        tuning={"strategy": "random", "budget": BUDGET, "samples": 1},
    )
    with session_scope(store_url) as s:
        sweep_id = submit_spec(s, load_spec(spec)).id
    # heartbeats commit while the point is tuned (a stale read transaction of the tuner then failed on SQLite)
    stats = run_worker(store_url, once=True, devices=1, device_kind="cpu", artifact_dir=tmp_path / "art",
                       lease_s=30, heartbeat_s=0.2)
    assert (stats.done, stats.failed) == (1, 0), stats

    with session_scope(store_url) as s:
        point = s.scalars(select(Point).where(Point.sweep_id == sweep_id)).one()
        assert point.status == "done", point.error
        m = s.scalars(select(Measurement).where(Measurement.point_id == point.id)).one()
        trials = list(s.scalars(select(TuningTrial)))
        tuned = {r.kernel: r for r in s.scalars(select(TunedConfig))}

    assert trials and {t.sweep_id for t in trials} == {sweep_id}
    assert {t.strategy for t in trials} == {"random"} and {t.device_name for t in trials} == {"cpu"}
    assert tuned and set(tuned) == {t.kernel for t in trials}
    for name, row in tuned.items():
        mine = [t for t in trials if t.kernel == name]
        assert len(mine) == BUDGET, [(t.config, t.status) for t in mine]
        ok = [t for t in mine if t.status == "ok"]
        assert ok and all(t.n == 1 for t in ok)
        best = min(ok, key=lambda t: t.median_ms)
        assert row.config == best.config and row.median_ms == best.median_ms
        assert row.sweep_id == sweep_id and row.key_str == mine[0].key_str
        # the measurement ran this kernel at the tuned key with the tuned config
        used = m.configs[name]
        assert key_str(used["key"]) == row.key_str, (used, row.key_str)
        assert used["config"] == row.config, (name, used, row.config)


class _NoStorePool:
    """A W=1 "gang" that runs each job in this thread, where opening a store session raises (rank processes
    must not touch the store); the worker's own store calls (outside a job, and its heartbeat thread) still work."""

    guard = threading.local()
    restarts = 0  # runners.gang.Gangs: it never restarts a gang

    def __init__(self, *_a: Any, **_kw: Any) -> None:
        self.jobs: list[str] = []
        self._gangs: dict[int, Any] = {}

    def run(self, world_size: int, fn: Callable[..., Any], payload: Any, **_kw: Any) -> list[Any]:
        from runners.gang import RankContext

        assert world_size == 1 and "url" not in (payload if isinstance(payload, dict) else vars(payload))
        self.jobs.append(fn.__name__)
        rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
        self.guard.in_job = True
        try:
            return [pickle.loads(pickle.dumps(fn(rc, pickle.loads(pickle.dumps(payload)))))]  # as through a queue
        finally:
            self.guard.in_job = False

    def close(self) -> None:
        pass


def test_tuning_job_opens_no_session_and_the_worker_stores_its_outcome(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import runners.worker as worker_mod
    from db.models import TunedConfig, TuningTrial
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec

    real_init = Session.__init__

    def guarded(self: Session, *a: Any, **kw: Any) -> None:
        if getattr(_NoStorePool.guard, "in_job", False):
            raise AssertionError("a job opened a store session")
        real_init(self, *a, **kw)

    spec = write_spec(tmp_path, backends=["triton"], axes={"T": 64, "H": 1, "K": 32, "V": 32}, tune=True,
                      tuning={"strategy": "random", "budget": 2, "samples": 1}, profile=False)
    with session_scope(store_url) as s:
        sweep_id = submit_spec(s, load_spec(spec)).id
    pools: list[_NoStorePool] = []
    monkeypatch.setattr(worker_mod, "GangPool", lambda *a, **kw: pools.append(_NoStorePool()) or pools[-1])
    monkeypatch.setattr(Session, "__init__", guarded)
    stats = worker_mod.run_worker(store_url, once=True, devices=1, device_kind="cpu", artifact_dir=tmp_path / "art",
                                  lease_s=30, heartbeat_s=0.2)
    assert pools[0].jobs == ["tune_job", "run_point_job"]
    assert (stats.done, stats.failed) == (1, 0), stats
    with session_scope(store_url) as s:
        trials = list(s.scalars(select(TuningTrial)))
        tuned = {r.kernel: r for r in s.scalars(select(TunedConfig))}
    assert trials and {t.sweep_id for t in trials} == {sweep_id}
    assert tuned and set(tuned) == {t.kernel for t in trials}
    for name, row in tuned.items():
        mine = [t for t in trials if t.kernel == name]
        assert len(mine) == 2
        best = min((t for t in mine if t.status == "ok"), key=lambda t: t.median_ms)
        assert row.config == best.config and row.sweep_id == sweep_id


@pytest.mark.parametrize(
    ("tuning", "match"),
    [
        ({"strategy": "bayes"}, "tuning.strategy"),
        ({"budget": 0}, "tuning.budget"),
        ({"min_samples": 10, "max_samples": 5}, r"tuning: max_samples \(5\) must be >= min_samples \(10\)"),
        ({"rungs": 3}, "tuning.rungs"),
    ],
)
def test_tuning_spec_errors_name_the_field(tmp_path: Path, tuning: dict, match: str) -> None:
    from runners.spec import load_spec

    with pytest.raises(SpecError, match=match):
        load_spec(write_spec(tmp_path, tune=True, tuning=tuning))


def test_tuning_block_defaults_are_the_tuners(tmp_path: Path) -> None:
    """A sweep spec's `tuning` block takes `runners.tuner.TuneSpec`'s defaults, and the worker's tune job builds
    its TuneSpec from the stored block."""
    from runners.spec import TuningSpec, load_spec
    from runners.tuner import TuneSpec

    d = TuneSpec()
    fields = ("strategy", "budget", "samples", "min_samples", "max_samples")
    assert TuningSpec().model_dump() == {f: getattr(d, f) for f in fields}
    stored = load_spec(write_spec(tmp_path, tune=True, tuning={"budget": 3})).model_dump(mode="json")["tuning"]
    assert TuneSpec.of(stored, direction="fwd+bwd") == TuneSpec(budget=3, direction="fwd+bwd")
