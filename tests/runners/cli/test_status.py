"""`cpbench status` lists a regression run's sweeps as one row (issue 28, item 7's status part) and counts each
sweep's unreliable points.

Scenario: three sweeps of one regression run (their `regress-run:` tag, as `cpbench regress` submits them) and the
user's own sweep after them: the sweeps table has two rows, the user's sweep and `regress run <id> (3 sweeps)`
with the ids as a range and the points summed; `--limit 1` keeps the newest row.
"""

from __future__ import annotations

from pathlib import Path

from runners.baseline import RUN_TAG_PREFIX
from tests.runners.engine_fixtures import store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli


def _submit(url: str, spec: Path) -> None:
    from db.session import session_scope
    from runners.engine import submit_spec

    with session_scope(url) as s:
        submit_spec(s, spec)


def test_status_collapses_a_regression_runs_sweeps(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    for i in range(3):
        _submit(store_url, write_spec(tmp_path, name=f"r{i}.yaml", tags=["nightly", f"{RUN_TAG_PREFIX}abc123"]))
    _submit(store_url, write_spec(tmp_path, name="mine.yaml", tags=["mine"]))
    code, out, err = _cli("status", "--db", store_url)
    assert code == 0, err
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│ tiny" in line or "│ regress" in line]
    assert [r[:4] for r in rows] == [["4", "tiny", "queued", "1"], ["1-3", "regress run abc123 (3 sweeps)", "queued", "3"]], (
        rows
    )
    assert "sweeps (4 of 4" in out
    code, out, _ = _cli("status", "--db", store_url, "--limit", "1")
    assert code == 0 and "regress run" not in out and "sweeps (1 of 4" in out, out


def test_status_says_why_points_larger_than_every_gang_wait(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A W=8 point and a W=2 point queued, one live CPU worker whose multi-host gang has 4 ranks on 2 hosts: the
    overview and the sweep's view say the W=8 point waits for a larger gang, and nothing about the W=2 one; the
    workers table shows the gang's hosts. With no live worker, every width waits for one."""
    from db import crud
    from db.session import session_scope

    _submit(store_url, write_spec(tmp_path, modes=["all_gather"], axes={"W": [2, 8]}))
    code, out, err = _cli("status", "--db", store_url)
    assert code == 0, err
    assert "waiting: 1 point(s) W=2: no live worker" in out and "waiting: 1 point(s) W=8: no live worker" in out, out
    with session_scope(store_url) as s:
        gang = {"kind": "cpu", "count": 4, "hosts": 2}
        crud.register_worker(s, name="gang:1:x", host="h", pid=1, devices=gang, environment_id=None, lease_s=600)
    for args in (("status",), ("status", "1")):
        code, out, err = _cli(*args, "--db", store_url)
        assert code == 0, err
        waiting = [line for line in out.splitlines() if line.startswith("waiting:")]
        assert waiting == ["waiting: 1 point(s) W=8 > largest gang 4"], out
    code, out, _ = _cli("status", "--db", store_url)
    assert "4 cpu on 2 hosts" in out, out


def test_status_counts_unreliable_points(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    from db import crud
    from db.models import Point
    from db.session import session_scope

    _submit(store_url, write_spec(tmp_path, name="noisy.yaml"))
    with session_scope(store_url) as s:
        pt = s.query(Point).one()
        pt.status = "done"
        crud.store_measurement(
            s,
            point_id=pt.id,
            environment_id=None,
            worker="test",
            clock="wall",
            samples=[0.8, 2.0, 139.5],
            summary={
                "median_ms": 2.0,
                "p10_ms": 0.8,
                "p90_ms": 139.5,
                "iqr_ms": 70.0,
                "mean_ms": 47.4,
                "min_ms": 0.8,
                "max_ms": 139.5,
                "n": 3,
            },
            stop_reason="timeout",
            unreliable="stopped on timeout with n=3 < min_samples=10",
            err_vs_none=None,
            err_vs_reference=None,
        )
    code, out, err = _cli("status", "--db", store_url)
    assert code == 0, err
    header = next(line for line in out.splitlines() if "┃ id" in line)
    row = next(line for line in out.splitlines() if "│ tiny" in line)
    cells = dict(zip([c.strip() for c in header.split("┃")[1:-1]], [c.strip() for c in row.split("│")[1:-1]], strict=True))
    assert (cells["done"], cells["unreliable"]) == ("1", "1"), out


def test_status_says_an_owned_sweep_waits_for_its_run(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A sweep submitted by `cpbench run` (an owner token) whose run stopped: a plain worker never claims its points,
    so status names the command that takes it over; an unowned sweep beside it gets no such line."""
    from db.session import session_scope
    from runners.engine import new_owner, submit_spec

    with session_scope(store_url) as s:
        owned = submit_spec(s, write_spec(tmp_path, name="owned.yaml"), owner=new_owner("run")).id
    _submit(store_url, write_spec(tmp_path, name="free.yaml"))
    for args in (("status",), ("status", str(owned))):
        code, out, err = _cli(*args, "--db", store_url)
        assert code == 0, err
        lines = [line for line in out.splitlines() if "belongs to" in line]
        assert len(lines) == 1 and f"sweep {owned} belongs" in lines[0], out
        assert f"cpbench run --resume {owned}" in out.replace("\n", " "), out
    code, out, err = _cli("status", str(owned + 1), "--db", store_url)
    assert code == 0 and "belongs to" not in out, out


def test_worker_once_names_the_owned_sweep_it_left(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    """`cpbench worker --once` against a store whose only queued sweep is owned by a stopped `cpbench run`: it takes
    nothing (0 done) and says which command does."""
    from db.session import session_scope
    from runners.engine import new_owner, submit_spec

    with session_scope(store_url) as s:
        owned = submit_spec(s, write_spec(tmp_path, name="owned.yaml"), owner=new_owner("run")).id
    code, out, err = _cli("worker", "--once", "--cpu", "--db", store_url)
    assert code == 0, err
    assert ": 0 done, 0 failed" in err and f"cpbench run --resume {owned}" in err.replace("\n", " "), err
