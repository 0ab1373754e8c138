"""`cpbench run --resume SWEEP_ID`: a run stopped part-way (its process gone, the sweep still owned by its token, so
no plain worker claims the rest) is taken over by a new process, which works the points left and keeps what was
measured; bad use gets a one-line error (no spec nor --resume, both, an unknown sweep, a finished one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runners.engine_fixtures import store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli


def test_resume_finishes_a_stopped_run_and_keeps_its_points(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    from db import crud
    from db.session import session_scope
    from runners.engine import run_until_done, submit_spec
    from runners.worker import run_worker

    spec = write_spec(tmp_path, axes={"T": [64, 128, 192], "H": 1, "K": 16, "V": 16})
    gone = "run:gone-host:1:deadbeef"  # the owner token of a run whose process no longer exists
    with session_scope(store_url) as s:
        sweep_id = submit_spec(s, spec, owner=gone).id
    # the run measured one point and was stopped
    run_until_done(store_url, sweep_id, devices=1, device_kind="cpu", owner=gone, max_points=1, name="first-run")
    with session_scope(store_url) as s:
        assert crud.sweep_progress(s, sweep_id=sweep_id)["done"] == 1
        first, _ = crud.list_results(s, sweep_id=sweep_id, status="done")
    # a plain worker does not touch the owned sweep
    stats = run_worker(store_url, once=True, devices=1, device_kind="cpu", name="bystander")
    assert stats.done == 0

    code, out, err = _cli("run", "--resume", str(sweep_id), "--db", store_url, "--cpu", "--devices", "1",
                          "--format", "json")
    assert code == 0, err
    assert "2 left to run" in err
    rows = json.loads(out)
    assert len(rows) == 3 and {r["status"] for r in rows} == {"done"}
    kept = next(r for r in rows if r["point_id"] == first[0]["point_id"])
    assert kept["worker"] == first[0]["worker"] and kept["worker"].startswith("first-run")  # not measured again
    assert sum(r["worker"].startswith("first-run") for r in rows) == 1
    with session_scope(store_url) as s:
        sweep = crud.get_sweep(s, sweep_id=sweep_id)
        assert sweep.status == "done" and sweep.owner != gone


@pytest.mark.parametrize(("args", "message"), [
    ((), "give a spec file or --resume SWEEP_ID"),
    (("spec.yaml", "--resume", "1"), "give a spec file or --resume SWEEP_ID"),
    (("--resume", "999"), "no sweep with id 999"),
])
def test_run_resume_errors(store_url: str, args: tuple[str, ...], message: str) -> None:  # noqa: F811
    code, out, err = _cli("run", *args, "--db", store_url, "--cpu")
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_resume_refuses_a_finished_sweep(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    code, out, err = _cli("run", str(write_spec(tmp_path)), "--db", store_url, "--cpu", "--devices", "1")
    assert code == 0, err
    code, out, err = _cli("run", "--resume", "1", "--db", store_url, "--cpu")
    assert code == 1 and "sweep 1 is done: nothing to resume" in err and len(err.strip().splitlines()) == 1, err
