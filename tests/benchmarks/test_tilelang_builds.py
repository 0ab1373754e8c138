"""`benchmarks.tilelang_builds.build_ahead` and `kernel_sources`, the labs' builds side by side: each job's module
`_build` runs with its arguments in spawned worker processes (not this one), one duration or generated source comes
back a job in the jobs' order, and no jobs start no pool. A stand-in module (`tests/benchmarks/build_probe.py`) takes
TileLang's place, which CI does not install."""

from __future__ import annotations

import os
from pathlib import Path

import benchmarks.tilelang_builds as builds  # (by its name: the workers unpickle its function from it)


def test_jobs_run_in_worker_processes(tmp_path: Path) -> None:
    jobs = [("tests.benchmarks.build_probe", (str(tmp_path), name)) for name in ("a", "b", "c")]
    secs = builds.build_ahead(jobs, workers=2)
    assert len(secs) == 3 and all(s >= 0 for s in secs)
    pids = {name: int((tmp_path / name).read_text()) for name in ("a", "b", "c")}
    assert os.getpid() not in pids.values()
    assert builds.build_ahead([], workers=4) == []


def test_sources_come_back_in_the_jobs_order_from_worker_processes(tmp_path: Path) -> None:
    jobs = [("tests.benchmarks.build_probe", (str(tmp_path), name)) for name in ("x", "y")]
    sources = builds.kernel_sources(jobs, workers=2)
    assert [s.split()[1] for s in sources] == ["x", "y"]
    assert all(int(s.split()[-1]) != os.getpid() for s in sources)
    assert builds.kernel_sources([], workers=2) == []
