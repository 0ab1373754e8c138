"""Several real `cpbench worker` processes on one store (SQLite file and PostgreSQL), through the CLI.

Scenarios, each on both stores (PostgreSQL marked `postgres`: a fresh database per test on the server at
CPBENCH_TEST_POSTGRES_URL):
- three `cpbench worker --once` processes on one sweep: every point is done, run exactly once (attempts == 1,
  one Measurement and one Profile row per point, measured by one of the three), every worker exits 0 and is
  recorded `stopped`, and their done counts add up to the sweep. Which worker runs which point is not asserted
  (on a busy machine one worker may take them all);
- a worker SIGKILLed mid-point (a slow point: its timing runs until the stop rule's timeout; killed once its
  heartbeat has renewed the short lease, so it is inside the point): the lease expires, a second worker
  reclaims the point (attempts == 2) and finishes it; every point of both sweeps is done, none twice, with
  exactly one Measurement and one Profile row each.
Workers run in their own session (process group), so the finally block can stop them (SIGTERM, then SIGKILL of
the group, which also takes their rank processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests.runners.engine_fixtures import REPO, pg_store_url, store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc

DEADLINE_S = 120  # generous: what the test waits for at most, never a timing assertion
FAST_TIMING = {"min_samples": 2, "max_samples": 3, "timeout_s": 1.0}
# a slow point: the stop rule never converges, so its timing runs until timeout_s
SLOW_TIMING = {"min_samples": 100000, "max_samples": 1000000, "max_rel_iqr": 1e-12, "timeout_s": 2.0}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("store_url" if request.param == "sqlite" else "pg_store_url")


class Workers:
    """`cpbench worker` subprocesses, each in its own process group, logging to files under `root`."""

    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "CPBENCH_POLL_S": "0.2", "CPBENCH_STOP_GRACE_S": "0", "OMP_NUM_THREADS": "1"}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process (the child holds it)
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners.cli", "worker", "--db", self.url, "--cpu", "--devices", "1", "--name", name, *args],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()[-3000:]

    def logs(self) -> str:
        return "\n".join(f"--- {n} (rc={p.poll()}):\n{self.log(n)}" for n, p in self.procs.items())

    def stop(self) -> None:
        """SIGTERM the live ones, wait a while, then SIGKILL every group (rank processes included)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + 30
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, end - time.monotonic()))
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # the group is the worker's own (start_new_session)
            if p.poll() is None:
                p.wait(timeout=10)


def _submit(url: str, path: Path) -> list[int]:
    from db.models import Point
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec

    with session_scope(url) as s:
        sweep = submit_spec(s, load_spec(path))
        s.flush()
        return list(s.scalars(select(Point.id).where(Point.sweep_id == sweep.id, Point.status == "queued").order_by(Point.id)))


def _wait(what: str, cond, workers: Workers, *, alive: tuple[str, ...] = ()) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        for n in alive:
            assert workers.procs[n].poll() is None, f"worker {n} exited while waiting for {what}\n{workers.logs()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{workers.logs()}"
        time.sleep(0.2)


def _prefix(identity: str | None) -> str | None:
    """The `--name` a worker identity starts with (the identity adds the pid and a random suffix)."""
    return identity.split(":")[0] if identity else identity


def _rows(url: str, ids: list[int]) -> dict:
    """Per point: status, attempts, measurement worker; plus the Measurement / Profile row counts per point."""
    from db.models import Measurement, Point, Profile
    from db.session import session_scope

    with session_scope(url) as s:
        points = {p.id: (p.status, p.attempts, p.error) for p in s.scalars(select(Point).where(Point.id.in_(ids)))}
        meas = dict(s.execute(select(Measurement.point_id, func.count()).where(Measurement.point_id.in_(ids))
                              .group_by(Measurement.point_id)).all())
        profs = dict(s.execute(select(Profile.point_id, func.count()).where(Profile.point_id.in_(ids))
                               .group_by(Profile.point_id)).all())
        by = {pid: _prefix(w) for pid, w in
              s.execute(select(Measurement.point_id, Measurement.worker).where(Measurement.point_id.in_(ids))).all()}
        n_meas = s.execute(select(func.count()).select_from(Measurement)).scalar_one()
    return {"points": points, "measurements": meas, "profiles": profs, "by": by, "n_measurements": n_meas}


def _all_done(url: str, ids: list[int]) -> bool:
    return all(st == "done" for st, _, _ in _rows(url, ids)["points"].values())


def test_three_workers_run_every_point_once(tmp_path: Path, url: str) -> None:
    from db import crud
    from db.session import session_scope

    ids = _submit(url, write_spec(tmp_path, axes={"T": [64, 128], "H": 1, "K": 16, "V": 16}, seeds=[0, 1, 2, 3],
                                  timing=FAST_TIMING, check={"reference_tokens": 32}))
    assert len(ids) == 8
    names = ("w0", "w1", "w2")
    workers = Workers(url, tmp_path)
    try:
        for n in names:
            workers.start(n, "--once")
        for n in names:
            assert workers.procs[n].wait(timeout=DEADLINE_S) == 0, workers.logs()
    finally:
        workers.stop()

    rows = _rows(url, ids)
    assert rows["points"] == dict.fromkeys(ids, ("done", 1, None)), workers.logs()
    assert rows["measurements"] == dict.fromkeys(ids, 1) and rows["profiles"] == dict.fromkeys(ids, 1)
    assert rows["n_measurements"] == len(ids)
    assert set(rows["by"].values()) <= set(names)
    with session_scope(url) as s:
        registered = {_prefix(w.name): w for w in crud.list_workers(s)}
        assert len(registered) == len(names)  # three identities, one per --name
        assert set(registered) == set(names)
        assert {w.status for w in registered.values()} == {"stopped"}
        # each worker counted exactly the points whose measurement it stored
        assert {n: w.points_done for n, w in registered.items()} == {
            n: sum(1 for b in rows["by"].values() if b == n) for n in names
        }


def test_sigkilled_worker_lease_expires_and_another_finishes(tmp_path: Path, url: str) -> None:
    from db.models import Point
    from db.session import session_scope

    lease_s = 3.0
    # the slow sweep is older, so its point is claimed first
    (slow,) = _submit(url, write_spec(tmp_path, "slow.yaml", axes={"H": 1, "K": 16, "V": 16},
                                      timing=SLOW_TIMING, check={"reference_tokens": 32}))
    fast = _submit(url, write_spec(tmp_path, "fast.yaml", axes={"T": 64, "H": 1, "K": 16, "V": 16},
                                   seeds=[0, 1, 2], timing=FAST_TIMING, check={"reference_tokens": 32}))
    ids = [slow, *fast]

    def held_by_victim_and_renewed() -> bool:
        with session_scope(url) as s:
            p = s.get(Point, slow)
            # renewed by a heartbeat: the victim is inside the point, not just past the claim
            return (p.status == "running" and _prefix(p.lease_owner) == "victim"
                    and p.lease_expires_at > p.claimed_at + timedelta(seconds=lease_s + 0.5))

    workers = Workers(url, tmp_path)
    try:
        victim = workers.start("victim", "--lease-s", str(lease_s), "--heartbeat-s", "1")
        _wait("the victim to hold the slow point", held_by_victim_and_renewed, workers, alive=("victim",))
        workers.start("rescuer", "--lease-s", "60", "--heartbeat-s", "5")
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
        with session_scope(url) as s:
            p = s.get(Point, slow)
            assert (p.status, p.attempts, _prefix(p.lease_owner), p.measurement) == ("running", 1, "victim", None)
        _wait("every point done", lambda: _all_done(url, ids), workers, alive=("rescuer",))
    finally:
        workers.stop()

    rows = _rows(url, ids)
    assert rows["points"][slow] == ("done", 2, None), workers.logs()
    assert rows["by"][slow] == "rescuer"
    assert {i: rows["points"][i][0] for i in ids} == dict.fromkeys(ids, "done")
    assert {rows["points"][i][1] for i in fast} == {1}  # the victim held only the slow point
    assert rows["measurements"] == dict.fromkeys(ids, 1) and rows["profiles"] == dict.fromkeys(ids, 1)
    assert rows["n_measurements"] == len(ids)
    assert "victim" not in rows["by"].values()
