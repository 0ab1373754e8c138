"""The worker's and the CLI's hardening (issue 17 §3, §7, §8, §10), each test named after the defect it guards:
bad lease/heartbeat options are one line, identities are unique per process, the point's time limit follows its
spec, the store retry logs an outage once, heartbeats renew the worker row during a point, lost workers are shown
lost, `cpbench gc` removes orphans only, and user text with rich markup prints as text."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from tests.runners.engine_fixtures import store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli


@pytest.mark.parametrize("opts, needle", [
    (["--heartbeat-s", "0"], "heartbeat"), (["--lease-s", "0"], "lease"), (["--lease-s", "-5"], "lease"),
    (["--lease-s", "nan"], "lease"), (["--lease-s", "inf"], "lease"), (["--heartbeat-s", "nan"], "heartbeat"),
    (["--lease-s", "5", "--heartbeat-s", "5"], "shorter"),
])
def test_bad_lease_and_heartbeat_options_are_one_line(store_url: str, opts: list[str], needle: str) -> None:  # noqa: F811
    code, out, err = _cli("worker", "--db", store_url, "--cpu", "--once", *opts)
    assert code == 1 and needle in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1, err


def test_worker_identity_is_unique_per_process_with_the_same_name(store_url: str) -> None:  # noqa: F811
    from runners.worker import Worker

    a, b = Worker(store_url, name="gpu-box"), Worker(store_url, name="gpu-box")
    assert a.name != b.name and a.name.startswith(f"gpu-box:{os.getpid()}:") and b.name.startswith("gpu-box:")


def test_point_time_limit_follows_the_spec_not_the_gang_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.settings import get_worker_settings
    from runners.worker import point_time_limit_s

    monkeypatch.setenv("CPBENCH_POINT_OVERHEAD_S", "30")
    get_worker_settings.cache_clear()
    try:
        s = get_worker_settings()
        assert point_time_limit_s({"timing": {"timeout_s": 10, "warmup_s": 1, "min_time_s": 0}}, s) == 30 + 2 * 11
        assert point_time_limit_s({"timing": {"timeout_s": 1e9}}, s) == s.JOB_TIMEOUT_S  # capped
    finally:
        get_worker_settings.cache_clear()


def test_a_peers_first_call_allowance_extends_its_points_limit() -> None:
    """FLA autotunes for minutes on its first call: its points get its `first_call_s` on top (ours get nothing)."""
    from runners.settings import get_worker_settings
    from runners.worker import _first_call_s, point_time_limit_s

    spec = {"timing": {"timeout_s": 2, "warmup_s": 0, "min_time_s": 0}}
    s = get_worker_settings()
    from runners.point import PointSpec

    fla, ours = (PointSpec("gdn", "none", backend, B=1, T=64, H=2, K=16, V=16) for backend in ("fla", "triton"))
    assert _first_call_s(ours) == 0.0 and _first_call_s(fla) >= 300.0
    assert point_time_limit_s(spec, s, _first_call_s(ours)) == s.POINT_OVERHEAD_S + 4
    assert point_time_limit_s(spec, s, _first_call_s(fla)) == min(s.JOB_TIMEOUT_S, s.POINT_OVERHEAD_S + 4 + _first_call_s(fla))


def test_store_outage_is_logged_once_and_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    from db.retry import StoreRetry, StoreUnavailable, is_transient

    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] <= 5:
            raise OperationalError("SELECT 1", {}, Exception("connection refused: server closed the connection"))
        return "ok"

    retry = StoreRetry(who="w", base_delay_s=0.001, max_delay_s=0.002)
    with caplog.at_level(logging.WARNING, logger="db.retry"):
        assert retry.call("claim", flaky) == "ok"
    lines = [r.getMessage() for r in caplog.records if r.name == "db.retry"]
    assert len(lines) == 2 and "unavailable" in lines[0] and "available again" in lines[1]
    assert retry.outages == 1 and calls["n"] == 6
    assert not is_transient(OperationalError("x", {}, Exception("no such table: points")))
    with pytest.raises(StoreUnavailable):
        StoreRetry(who="w", base_delay_s=0.001).call("claim", lambda: flaky() if calls.update(n=0) is None else "", give_up=lambda: True)


def test_heartbeats_renew_the_worker_row_during_a_point(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    from db import crud
    from db.models import Point
    from db.queue import claim_point
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec
    from runners.worker import Worker, _Heartbeat

    with session_scope(store_url) as s:
        submit_spec(s, load_spec(write_spec(tmp_path)))
    w = Worker(store_url, lease_s=5, heartbeat_s=0.2, device_kind="cpu", devices=1, artifact_dir=tmp_path / "art")
    w._start(None)
    try:
        with session_scope(store_url) as s:
            point = claim_point(s, worker=w.name, lease_s=5)
            (row,) = crud.list_workers(s)
            first_beat, first_lease = row.last_heartbeat, point.lease_expires_at
        hb = _Heartbeat(w, point.id)
        hb.start()
        time.sleep(1.0)
        hb.stop()
        with session_scope(store_url) as s:
            (row,) = crud.list_workers(s)
            assert row.last_heartbeat > first_beat + timedelta(seconds=0.5)
            assert s.get(Point, point.id).lease_expires_at > first_lease
        assert not hb.lost
    finally:
        w.pool.close()


def test_killed_worker_is_shown_lost_not_busy(store_url: str) -> None:  # noqa: F811
    from db import crud
    from db.clock import store_now
    from db.models import Worker as WorkerRow
    from db.session import session_scope

    with session_scope(store_url) as s:
        crud.register_worker(s, name="h:1:dead", host="h", pid=1, devices={}, environment_id=None, lease_s=30)
        crud.touch_worker(s, name="h:1:dead", status="busy", current_point_id=7)
    with session_scope(store_url) as s:
        row = s.query(WorkerRow).one()
        now = store_now(s)
        assert crud.worker_state(row, now, 60) == "busy"
        assert crud.worker_state(row, now + timedelta(seconds=31), 60) == "lost"
    code, out, _ = _cli("status", "--db", store_url)
    assert code == 0 and "busy" in out


def test_gc_removes_orphan_traces_and_spool_files_only(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    from db import crud
    from db.session import session_scope

    art = tmp_path / "art"
    (art / "sweep1").mkdir(parents=True)
    (art / "spool").mkdir()
    kept = art / "sweep1" / "point1-aaaa1111.trace.json.gz"
    orphan = art / "sweep1" / "point2-bbbb2222.trace.json.gz"
    spool = art / "spool" / "point3-a1-bbbb2222.json"
    for f in (kept, orphan, spool):
        f.write_bytes(b"x" * 10)
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    with session_scope(store_url) as s:
        sweep = crud.create_sweep(s, name="gc", tags=[], spec={}, points=[])
        crud.store_artifact(s, point_id=None, kind="chrome_trace", path=str(kept), size_bytes=10, sha256="0" * 64)
        crud.register_worker(s, name="h:2:bbbb2222", host="h", pid=2, devices={}, environment_id=None)
        crud.touch_worker(s, name="h:2:bbbb2222", status="stopped")
        assert sweep.id
    code, out, err = _cli("gc", "--db", store_url, "--artifact-dir", str(art), "--dry-run")
    assert code == 0 and "would remove 2" in err and kept.exists() and orphan.exists()
    code, out, err = _cli("gc", "--db", store_url, "--artifact-dir", str(art))
    assert code == 0 and "removed 2" in err
    assert kept.exists() and not orphan.exists() and not spool.exists()


@pytest.mark.multiproc
def test_markup_in_user_text_does_not_crash_the_cli(tmp_path: Path, store_url: str) -> None:  # noqa: F811
    from db.models import Point
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec

    with session_scope(store_url) as s:
        sweep_id = submit_spec(s, load_spec(write_spec(tmp_path)).model_copy(update={"name": "[/oops] markup [bold]x"})).id
    with session_scope(store_url) as s:
        point = s.query(Point).one()
        point.status, point.error = "failed", "RuntimeError: [/__w/pytorch/pytorch/gloo.cc:123] Timed out"
    for args in (["status"], ["status", str(sweep_id)], ["results", str(sweep_id)]):
        code, out, err = _cli(*args, "--db", store_url)
        assert code == 0, err
        assert "[/oops] markup [bold]x" in out.replace("\n", "")
    code, out, _ = _cli("status", str(sweep_id), "--db", store_url)
    assert "[/__w/pytorch/pytorch/gloo.cc:123]" in out and "[queued]" in out  # the sweep's status, not swallowed
