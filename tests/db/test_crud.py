"""Round trips through `db.crud` on SQLite and PostgreSQL.

Scenarios: a sweep with queued and skipped points and its progress counts; a sweep of skipped points only is done
at once; malformed point dicts are refused naming the field; timing samples compress and decode exactly;
`list_results` joins measurement, profile and environment, filters and paginates; `results_by_key` keeps the latest
measurement per key; environments are deduplicated by fingerprint; workers, tuning trials, tuned-config upserts and
regression verdicts round-trip; `list_sweeps` filters by tag and paginates; a tuning run measured without a
session (`runners.tuner.TuneResult`) is stored by `store_tuning`: its trials, then its winners, with the sweep,
the environment and when each winner was measured; every store function is keyword-only after the session.
"""

from __future__ import annotations

import inspect
import math
import random
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from db import crud, queue
from db.models import POINT_STATUSES, Measurement
from db.session import get_sessionmaker, session_scope

FACTS = {"device_name": "cpu", "device_count": 0, "torch": "2.13.0", "triton": "3.6.0", "python": "3.11.7",
         "cpbench": "0.1.0", "git_sha": "abc123", "host": "ci", "numa": 1}  # fmt: skip


def _summary(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]
    return {"median_ms": q(0.5), "p10_ms": q(0.1), "p90_ms": q(0.9), "iqr_ms": q(0.75) - q(0.25),
            "mean_ms": sum(s) / len(s), "min_ms": s[0], "max_ms": s[-1], "n": len(s)}  # fmt: skip


def _measure(s, point_id: int, env_id: int, samples: list[float], worker: str = "w") -> None:
    crud.store_measurement(
        s, point_id=point_id, environment_id=env_id, worker=worker, clock="wall", samples=samples,
        summary=_summary(samples), stop_reason="noise", err_vs_none=0.0, err_vs_reference=1e-6,
        configs={"chunk_state_fwd": {"BV": 32}}, report={"floor_ms": 0.1},
    )  # fmt: skip


def test_create_sweep_and_progress(session, make_points) -> None:
    points = make_points(5)
    points[3].update(status="skipped", reason="H % W != 0 for headwise")
    points[4].update(device_kind="cuda", max_attempts=5)
    sweep = crud.create_sweep(session, name="s1", tags=["nightly"], spec={"op": ["gdn"]}, points=points)
    session.commit()
    assert sweep.status == "queued" and sweep.n_points == 5 and sweep.created_at.tzinfo == timezone.utc
    stored = crud.get_sweep(session, sweep_id=sweep.id)
    assert [p.idx for p in stored.points] == [0, 1, 2, 3, 4]
    assert stored.points[3].status == "skipped" and stored.points[3].reason == "H % W != 0 for headwise"
    assert stored.points[4].device_kind == "cuda" and stored.points[4].max_attempts == 5
    assert stored.points[0].max_attempts == 3 and stored.points[0].params["T"] == 64
    progress = crud.sweep_progress(session, sweep_id=sweep.id)
    assert progress == {**dict.fromkeys(POINT_STATUSES, 0), "queued": 4, "skipped": 1, "total": 5}
    assert crud.get_sweep(session, sweep_id=sweep.id + 100) is None


def test_sweep_of_skipped_points_is_done(session, make_points) -> None:
    sweep = crud.create_sweep(session, name="s", tags=[], spec={}, points=make_points(2, status="skipped", reason="W > 8"))
    session.commit()
    assert sweep.status == "done" and sweep.finished_at is not None
    assert queue.claim_point(session, worker="w", lease_s=10) is None


def test_create_sweep_refuses_malformed_points(session, make_points) -> None:
    bad = make_points(2)
    del bad[1]["T"]
    with pytest.raises(ValueError, match=r"points\[1\] has missing fields \['T'\]"):
        crud.create_sweep(session, name="s", tags=[], spec={}, points=bad)
    with pytest.raises(ValueError, match=r"points\[0\]\.status must be 'queued' or 'skipped', got status='done'"):
        crud.create_sweep(session, name="s", tags=[], spec={}, points=make_points(1, status="done"))


def test_samples_round_trip_exactly() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(0, 1) for _ in range(500)] + [5e-324, 1.7976931348623157e308, 0.1, math.pi]
    blob = crud.encode_samples(samples)
    assert crud.decode_samples(blob) == samples
    assert len(blob) < 8 * len(samples) + 64
    assert crud.decode_samples(crud.encode_samples([])) == []


def test_measurement_and_results(db_url: str, make_points) -> None:
    rng = random.Random(3)
    with session_scope(db_url) as s:
        points = make_points(4) + make_points(2, start=4, W=2, mode="ring")
        sweep = crud.create_sweep(s, name="r", tags=[], spec={}, points=points)
        env = crud.get_or_create_environment(s, facts=FACTS)
        sweep_id, env_id = sweep.id, env.id
    samples = {}
    with get_sessionmaker(db_url)() as s:
        for _ in range(3):
            point = queue.claim_point(s, worker="w", lease_s=30)
            samples[point.id] = [rng.uniform(0.5, 2.0) for _ in range(17)]
            _measure(s, point.id, env_id, samples[point.id])
            artifact = crud.store_artifact(s, point_id=point.id, kind="chrome_trace", path=f"/tmp/{point.id}.json.gz",
                                           size_bytes=123, sha256="0" * 64)  # fmt: skip
            crud.store_profile(s, point_id=point.id, collectives={"all_gather": 1}, collective_bytes={"all_gather": 4096},
                               host_syncs=0, sync_events={}, kernel_launches=7, peak_memory_bytes=1 << 20,
                               artifact_id=artifact.id)  # fmt: skip
            assert queue.complete_point(s, point_id=point.id, worker="w")
        failing = queue.claim_point(s, worker="w", lease_s=30)
        assert queue.fail_point(s, point_id=failing.id, worker="w", error="RuntimeError: boom", retryable=False)

    with get_sessionmaker(db_url)() as s:
        rows, total = crud.list_results(s, sweep_id=sweep_id)
        assert total == 6 and [r["idx"] for r in rows] == list(range(6))
        assert set(rows[0]) == set(crud.RESULT_FIELDS)
        first = rows[0]
        assert first["status"] == "done" and first["id"] == first["point_id"]
        assert first["median_ms"] == _summary(samples[first["point_id"]])["median_ms"] and first["n"] == 17
        assert first["collectives"] == {"all_gather": 1} and first["kernel_launches"] == 7
        assert first["device_name"] == "cpu" and first["git_sha"] == "abc123" and first["torch"] == "2.13.0"
        assert first["configs"] == {"chunk_state_fwd": {"BV": 32}} and first["report"] == {"floor_ms": 0.1}
        assert first["measured_at"].tzinfo == timezone.utc and first["T"] == 64 and first["params"]["W"] == 1
        assert rows[3]["status"] == "failed" and rows[3]["error"] == "RuntimeError: boom" and rows[3]["median_ms"] is None
        assert rows[4]["status"] == "queued" and rows[4]["device_name"] is None

        assert crud.list_results(s, sweep_id=sweep_id, status="done")[1] == 3
        assert crud.list_results(s, sweep_id=sweep_id, status=["done", "failed"])[1] == 4
        assert crud.list_results(s, W=2, mode="ring")[1] == 2
        assert crud.list_results(s, T=[64, 128])[1] == 2
        assert crud.list_results(s, T=[64, 128, 320])[1] == 3
        assert crud.list_results(s, device="cpu")[1] == 3
        assert crud.list_results(s, device="NVIDIA H200")[1] == 0
        assert crud.list_results(s, op="gdn", backend="torch", B=1, lb=-2.0)[1] == 6
        page, total = crud.list_results(s, sweep_id=sweep_id, skip=2, limit=3)
        assert total == 6 and [r["idx"] for r in page] == [2, 3, 4]
        with pytest.raises(ValueError, match="limit must be >= 1, got limit=0"):
            crud.list_results(s, limit=0)

        by_key = crud.results_by_key(s, sweep_ids=[sweep_id])
        assert len(by_key) == 3
        for key, row in by_key.items():
            assert row["key"] == key and row["samples"] == samples[row["point_id"]]


def test_results_by_key_keeps_latest(db_url: str, make_points) -> None:
    ids = []
    for value in (1.0, 2.0):
        with session_scope(db_url) as s:
            ids.append(crud.create_sweep(s, name="base", tags=[], spec={}, points=make_points(1)).id)
            env_id = crud.get_or_create_environment(s, facts=FACTS).id
        with get_sessionmaker(db_url)() as s:
            point = queue.claim_point(s, worker="w", lease_s=30)
            _measure(s, point.id, env_id, [value] * 3)
            queue.complete_point(s, point_id=point.id, worker="w")
    with get_sessionmaker(db_url)() as s:
        (row,) = crud.results_by_key(s, sweep_ids=ids).values()
        assert row["sweep_id"] == ids[1] and row["samples"] == [2.0, 2.0, 2.0]
        assert crud.results_by_key(s, sweep_ids=ids[:1])[row["key"]]["samples"] == [1.0, 1.0, 1.0]


def test_store_measurement_checks_summary(session, make_points) -> None:
    sweep = crud.create_sweep(session, name="s", tags=[], spec={}, points=make_points(1))
    point_id = sweep.points[0].id
    kwargs = {"point_id": point_id, "environment_id": None, "worker": "w", "clock": "wall", "stop_reason": None,
              "err_vs_none": None, "err_vs_reference": None}  # fmt: skip
    with pytest.raises(ValueError, match="summary n=2 differs from len\\(samples\\)=3"):
        crud.store_measurement(session, samples=[1.0, 2.0, 3.0], summary={**_summary([1.0, 2.0]), "n": 2}, **kwargs)
    with pytest.raises(ValueError, match=r"summary lacks \['p10_ms'\]"):
        crud.store_measurement(
            session, samples=[1.0], summary={k: v for k, v in _summary([1.0]).items() if k != "p10_ms"}, **kwargs
        )
    crud.store_measurement(session, samples=[1.0], summary=_summary([1.0]), **kwargs)
    session.commit()
    assert session.execute(select(func.count()).select_from(Measurement)).scalar_one() == 1


def test_environments_workers_and_sweep_listing(session, make_points) -> None:
    env = crud.get_or_create_environment(session, facts=FACTS)
    again = crud.get_or_create_environment(session, facts=dict(reversed(list(FACTS.items()))))
    other = crud.get_or_create_environment(session, facts={**FACTS, "git_sha": "def456"})
    assert again.id == env.id != other.id and env.extra == {"numa": 1} and len(env.fingerprint) == 64
    with pytest.raises(ValueError, match=r"facts lacks \['torch'\]"):
        crud.get_or_create_environment(session, facts={k: v for k, v in FACTS.items() if k != "torch"})

    crud.register_worker(session, name="h:1:aa", host="h", pid=1, devices={"kind": "cpu", "count": 0}, environment_id=env.id)
    crud.register_worker(session, name="h:2:bb", host="h", pid=2, devices={"kind": "cpu", "count": 0}, environment_id=env.id)
    crud.touch_worker(session, name="h:1:aa", status="busy", current_point_id=5)
    crud.touch_worker(session, name="h:1:aa", status="idle", points_done_inc=1)
    session.commit()
    workers = crud.list_workers(session)
    assert [w.name for w in workers] == ["h:1:aa", "h:2:bb"]
    assert workers[0].points_done == 1 and workers[0].status == "idle" and workers[0].current_point_id is None
    assert workers[0].last_heartbeat >= workers[0].started_at and workers[0].last_heartbeat.tzinfo == timezone.utc
    with pytest.raises(ValueError, match="no worker registered with name='nope'"):
        crud.touch_worker(session, name="nope", status="idle")

    for i in range(5):
        crud.create_sweep(session, name=f"s{i}", tags=["nightly"] if i % 2 else ["adhoc", "100%_x"], spec={}, points=[])
    session.commit()
    page, total = crud.list_sweeps(session, limit=2)
    assert total == 5 and [s.name for s in page] == ["s4", "s3"]
    page, total = crud.list_sweeps(session, tag="nightly")
    assert total == 2 and [s.name for s in page] == ["s3", "s1"]
    assert crud.list_sweeps(session, tag="100%_x")[1] == 3
    assert crud.list_sweeps(session, tag="night")[1] == 0
    assert crud.list_sweeps(session, skip=4)[0][0].name == "s0"


def test_tuning_and_regression_records(session) -> None:
    env = crud.get_or_create_environment(session, facts=FACTS)
    for bv, ms in ((32, 1.0), (64, 0.8)):
        crud.store_trial(session, environment_id=env.id, device_name="cpu", kernel="chunk_state_fwd", key={"H": 4},
                         key_str="H=4", config={"BV": bv}, strategy="exhaustive", status="ok", median_ms=ms, n=10)  # fmt: skip
    crud.store_trial(session, device_name="gpu", kernel="wy_fwd", key={}, key_str="", config={}, strategy="random",
                     status="invalid", error="BV > V")  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown fields \['colour'\]"):
        crud.store_trial(session, colour="red")
    common = {"kernel": "chunk_state_fwd", "key": {"H": 4}, "key_str": "H=4", "device_name": "cpu",
              "compute_capability": None, "default_ms": 1.0, "source_hash": "h1", "sweep_id": None,
              "environment_id": env.id}  # fmt: skip
    first = crud.upsert_tuned_config(session, config={"BV": 32}, median_ms=1.0, runner_up_ms=None, **common)
    second = crud.upsert_tuned_config(session, config={"BV": 64}, median_ms=0.8, runner_up_ms=1.0, **common)
    crud.upsert_tuned_config(session, config={"BV": 64}, median_ms=0.5, runner_up_ms=None, **{**common, "device_name": "h200"})
    session.commit()
    assert first.id == second.id
    configs = crud.list_tuned_configs(session, device_name="cpu")
    assert len(configs) == 1 and configs[0].config == {"BV": 64} and configs[0].runner_up_ms == 1.0
    assert len(crud.list_tuned_configs(session)) == 2
    assert [t.config["BV"] for t in crud.list_trials(session, kernel="chunk_state_fwd", device_name="cpu")] == [32, 64]
    assert len(crud.list_trials(session)) == 3

    rows = [{"run_id": "r1", "suite": "nightly", "baseline_ref": "main", "key": k, "verdict": v, "ratio": r,
             "detail": {"medians": [1, r]}} for k, v, r in (("a", "SAME", 1.0), ("b", "SLOW", 1.3))]  # fmt: skip
    crud.store_regression_results(session, rows=rows)
    session.commit()
    assert [r.verdict for r in crud.list_regression_results(session, suite="nightly")] == ["SAME", "SLOW"]
    (b,) = crud.list_regression_results(session, key="b")
    assert b.ratio == 1.3 and b.detail == {"medians": [1, 1.3]} and b.created_at.tzinfo == timezone.utc
    with pytest.raises(ValueError, match=r"rows\[0\] has unknown fields \['p'\]"):
        crud.store_regression_results(session, rows=[{"p": 1}])


def test_store_tuning_stores_a_run_measured_without_a_session(session) -> None:
    from runners.tuner.result import KernelResult, Trial, TuneResult

    env = crud.get_or_create_environment(session, facts=FACTS)
    sweep = crud.create_sweep(session, name="tuned", tags=[], spec={}, points=[])
    measured = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    ok = tuple(Trial(kernel="chunk_state_fwd", key={"H": 4}, config={"BV": bv}, strategy="exhaustive", rung=0, status="ok",
                     median_ms=ms, n=3) for bv, ms in ((64, 1.0), (32, 0.8)))
    crash = Trial(kernel="wy_fwd", key={}, config={"BV": 16}, strategy="exhaustive", rung=0, status="failed",
                  error="RuntimeError: CUDA error: x")
    won = KernelResult(kernel="chunk_state_fwd", key={"H": 4}, key_str="H=4", source_hash="h1", trials=ok,
                       config={"BV": 32}, median_ms=0.8, default_ms=1.0, runner_up_ms=1.0, measured_at=measured)
    stopped = KernelResult(kernel="wy_fwd", key={}, key_str="", source_hash="h2", trials=(crash,))  # no winner
    result = TuneResult(device_name="cpu", compute_capability=None, kernels=(won, stopped))
    (row,) = crud.store_tuning(session, result=result, sweep_id=sweep.id, environment_id=env.id)
    session.commit()
    assert (row.kernel, row.key, row.config, row.median_ms, row.default_ms, row.runner_up_ms, row.source_hash) == (
        "chunk_state_fwd", {"H": 4}, {"BV": 32}, 0.8, 1.0, 1.0, "h1")
    assert row.measured_at == measured and (row.sweep_id, row.environment_id, row.device_name) == (sweep.id, env.id, "cpu")
    trials = crud.list_trials(session, sweep_id=sweep.id)
    assert [(t.kernel, t.config, t.status, t.median_ms) for t in trials] == [
        ("chunk_state_fwd", {"BV": 64}, "ok", 1.0), ("chunk_state_fwd", {"BV": 32}, "ok", 0.8),
        ("wy_fwd", {"BV": 16}, "failed", None)]
    assert {(t.environment_id, t.device_name) for t in trials} == {(env.id, "cpu")}
    (crashed,) = crud.list_trials(session, status="failed", error_contains="CUDA error")
    assert crashed.kernel == "wy_fwd" and crud.list_trials(session, status="ok", error_contains="CUDA") == []


def test_every_store_function_is_keyword_only_after_the_session() -> None:
    checked = []
    for module in (crud, queue):
        for name, f in vars(module).items():
            if not inspect.isfunction(f) or f.__module__ != module.__name__ or name.startswith("_"):
                continue
            params = list(inspect.signature(f).parameters.values())
            if params and params[0].name == "session":
                checked.append(name)
                assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[1:]), f"{module.__name__}.{name}"
    assert {"store_tuning", "list_tuned_configs", "claim_point", "complete_point"} <= set(checked)


def test_sweep_view_equals_the_orm_reads(db_url: str, make_points) -> None:
    """`sweep_view` (the sweep page's poll, two prebuilt Core statements) gives what the ORM reads give: the sweep's
    columns, `sweep_progress` and `sweeps_unreliable`, on a sweep with done (one of them unreliable), failed, skipped
    and queued points; None for a missing sweep."""
    with session_scope(db_url) as s:
        points = make_points(6)
        points[5].update(status="skipped", reason="not here")
        sweep = crud.create_sweep(s, name="v", tags=["a", "b"], spec={"ops": ["gdn"], "n": [1, 2]}, points=points)
        sweep_id = sweep.id
    with get_sessionmaker(db_url)() as s:
        for i in range(3):
            point = queue.claim_point(s, worker="w", lease_s=30)
            crud.store_measurement(
                s, point_id=point.id, environment_id=None, worker="w", clock="wall", samples=[1.0, 1.1, 1.2],
                summary=_summary([1.0, 1.1, 1.2]), stop_reason="timeout" if i == 1 else "noise",
                unreliable="stopped on timeout" if i == 1 else None, err_vs_none=None, err_vs_reference=None,
            )  # fmt: skip
            assert queue.complete_point(s, point_id=point.id, worker="w")
        failing = queue.claim_point(s, worker="w", lease_s=30)
        assert queue.fail_point(s, point_id=failing.id, worker="w", error="RuntimeError: boom", retryable=False)
    with get_sessionmaker(db_url)() as s:
        view = crud.sweep_view(s, sweep_id=sweep_id)
        orm = crud.get_sweep(s, sweep_id=sweep_id)
        want = {c: getattr(orm, c) for c in crud.SWEEP_VIEW_COLUMNS}
        progress = {**crud.sweep_progress(s, sweep_id=sweep_id), "unreliable": crud.sweeps_unreliable(s, sweep_ids=[sweep_id])[sweep_id]}
        assert view == {**want, "progress": progress}, view
        assert progress["done"] == 3 and progress["unreliable"] == 1 and progress["failed"] == 1 and progress["skipped"] == 1
        assert crud.sweep_view(s, sweep_id=sweep_id + 100) is None
