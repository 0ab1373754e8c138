"""The multi-host worker (`runners.multihost`) under real torchrun agents: two "hosts" on the loopback address, each
`python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT
-m bench_server worker --multi-host --cpu --once`, against a SQLite store file.

Scenarios:
- torchrun's variables give each rank its place (the node from GROUP_RANK, else from the local world size);
- outside torchrun, `--multi-host` is one clear line and exit 1;
- a sweep with W in {1, 2, 4} (gdn, torch backend, forward, all_gather and true_cp) runs to completion on the
  two-host gang: every point done once by its rank 0, both agents exit 0; the same sweep run by the ordinary
  single-host gang (`cpbench worker --cpu --once`, at the same time on a store of its own) gives bitwise the same correctness errors and the same
  collectives and bytes; the topology columns say 2 hosts x 2 ranks at W=4 ("loopback+tcp/lo"), one host below;
  the single-host gang's W=4 is one host of 4;
- one "host" is killed (its torchrun agent and every rank process under it, SIGKILL) while the gang runs a slow
  W=4 point: the ranks left fail the point's attempt and exit, their agent restarts them (`--max-restarts`), a new
  "host" joins the rendezvous, and the re-formed gang finishes the point; nothing is lost and nothing is stored
  twice (one Measurement and one Profile row per point). The recovery time (kill -> point done) is printed.
Agents run in their own sessions; the finally block kills every process under them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from runners.errors import CpbenchError
from runners.multihost import TorchrunEnv
from tests.runners.engine_fixtures import REPO, store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli

DEADLINE_S = 300  # generous: what the tests wait for at most on a loaded 2-core box, never a timing assertion
FAST_TIMING = {"min_samples": 2, "max_samples": 3, "timeout_s": 1.0}
# the stop rule never converges, so the point's timing runs until timeout_s: long enough to kill a host in it
SLOW_TIMING = {"min_samples": 100000, "max_samples": 1000000, "max_rel_iqr": 1e-12, "timeout_s": 6.0}
SWEEP = {"modes": ["all_gather", "true_cp"], "axes": {"T": 128, "H": 2, "K": 32, "V": 32, "W": [1, 2, 4]},
         "timing": FAST_TIMING, "check": {"reference_tokens": 64}}  # fmt: skip


def _env() -> dict[str, str]:
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: each rendezvous round publishes its master address, so a host that joins
    # a restarted gang (in place of a dead one) finds it (runners.multihost's docstring)
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
            "CPBENCH_POLL_S": "0.2", "CPBENCH_STOP_GRACE_S": "0", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (torchrun starts its ranks in sessions of their own, so a group kill misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Hosts:
    """torchrun agents standing for hosts, each in its own session, logging to files under `root`."""

    def __init__(self, url: str, root: Path, *extra: str) -> None:
        self.url, self.root, self.extra = url, root, extra
        self.port = _free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - the child holds it
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend",
               "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-conf", "join_timeout=240", "--max-restarts", "2",
               "-m", "bench_server", "worker", "--multi-host", "--cpu", "--once", "--db", self.url, *self.extra]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def start_two(self) -> None:
        """Host a first (it hosts the rendezvous store, and its lower pid makes it node 0, rank 0's), then b."""
        self.start("a")
        deadline = time.monotonic() + DEADLINE_S
        while not _listening(self.port):
            assert self.procs["a"].poll() is None and time.monotonic() < deadline, self.logs()
            time.sleep(0.2)
        self.start("b")

    def kill(self, name: str) -> None:
        """The host dies: its agent and every process under it, SIGKILL."""
        proc = self.procs[name]
        for pid in [proc.pid, *_descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def wait(self, name: str) -> int:
        return self.procs[name].wait(timeout=DEADLINE_S)

    def logs(self) -> str:
        return "\n".join(
            f"--- {n} (rc={p.poll()}):\n{(self.root / f'{n}.log').read_text()[-4000:]}" for n, p in self.procs.items()
        )

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                self.kill(name)


def _submit(url: str, path: Path) -> int:
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.spec import load_spec

    with session_scope(url) as s:
        sweep = submit_spec(s, load_spec(path))
        s.flush()
        return sweep.id


def _results(url: str, sweep_id: int) -> dict[tuple[str, int], dict]:
    """Per (mode, W): the point's status and attempts, and its stored figures."""
    from db import crud
    from db.session import session_scope

    with session_scope(url) as s:
        rows, _ = crud.list_results(s, sweep_id=sweep_id)
    keep = ("status", "attempts", "worker", "err_vs_none", "err_vs_reference", "collectives", "collective_bytes", "median_ms",
            "hosts", "ranks_per_host", "interconnect", "report")  # fmt: skip
    return {(r["mode"], r["W"]): {k: r[k] for k in keep} for r in rows}


def _row_counts(url: str, sweep_id: int) -> tuple[dict[int, int], dict[int, int]]:
    from db.models import Measurement, Point, Profile
    from db.session import session_scope

    with session_scope(url) as s:
        ids = select(Point.id).where(Point.sweep_id == sweep_id)
        meas = dict(s.execute(select(Measurement.point_id, func.count()).where(Measurement.point_id.in_(ids))
                              .group_by(Measurement.point_id)).all())  # fmt: skip
        profs = dict(s.execute(select(Profile.point_id, func.count()).where(Profile.point_id.in_(ids))
                               .group_by(Profile.point_id)).all())  # fmt: skip
    return meas, profs


def test_torchrun_env_gives_each_rank_its_place() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert TorchrunEnv.from_environ({**env, "GROUP_RANK": "1"}) == TorchrunEnv(3, 4, 1, 2, node=1)
    assert TorchrunEnv.from_environ(env).node == 1  # without GROUP_RANK: rank // local world size
    with pytest.raises(CpbenchError, match="RANK, WORLD_SIZE"):
        TorchrunEnv.from_environ({"LOCAL_RANK": "0"})


def test_multi_host_outside_torchrun_is_one_clear_error(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    code, _, err = _cli("worker", "--multi-host", "--cpu", "--once", "--db", store_url)
    assert code == 1 and "--multi-host runs under torchrun" in err and "Traceback" not in err, err


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_hosts_run_a_sweep_like_the_single_host_gang(
    store_url: str,  # noqa: F811
    tmp_path: Path,
    migrated_sqlite: Callable[[Path], str],
) -> None:
    # the single-host gangs run the same sweep at the same time, on a store of their own (workers claim any sweep)
    ref_url = migrated_sqlite(tmp_path / "single-host")
    two = _submit(store_url, write_spec(tmp_path, "two.yaml", **SWEEP))
    one = _submit(ref_url, write_spec(tmp_path, "one.yaml", **SWEEP))
    hosts = Hosts(store_url, tmp_path)
    t0 = time.monotonic()
    with open(tmp_path / "single-host.log", "w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "bench_server", "worker", "--cpu", "--once", "--db", ref_url],
                                  cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        hosts.start_two()
        assert hosts.wait("a") == 0 and hosts.wait("b") == 0, hosts.logs()
        two_host_s = time.monotonic() - t0
        worker.wait(timeout=DEADLINE_S)
        both_s = time.monotonic() - t0
    finally:
        hosts.stop()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, (tmp_path / "single-host.log").read_text()[-3000:]

    got, ref = _results(store_url, two), _results(ref_url, one)
    print(f"\ntwo-host gang (2 hosts x 2 ranks): {len(got)} points in {two_host_s:.1f} s; with the single-host gangs: {both_s:.1f} s")  # fmt: skip
    for (mode, W), r in sorted(got.items()):
        print(f"  {mode:10s} W={W}  {r['hosts']}x{r['ranks_per_host']} {r['interconnect']:16s} median {r['median_ms']:.3f} ms "
              f"(single host {ref[mode, W]['median_ms']:.3f} ms)  err_vs_none {r['err_vs_none']:.3g}  "
              f"err_vs_reference {r['err_vs_reference']:.3g}")  # fmt: skip
    assert set(got) == {(m, W) for m in SWEEP["modes"] for W in (1, 2, 4)}
    assert {(r["status"], r["attempts"]) for r in got.values()} == {("done", 1)}, hosts.logs()
    assert len({r["worker"] for r in got.values()}) == 1  # rank 0 stored them all
    meas, profs = _row_counts(store_url, two)
    assert list(meas.values()) == [1] * len(got) and list(profs.values()) == [1] * len(got)
    # the same sweep on one host's gangs: bitwise the same errors (deterministic CPU kernels), the same collectives
    same = ("err_vs_none", "err_vs_reference", "collectives", "collective_bytes")
    assert {k: {f: r[f] for f in same} for k, r in got.items()} == {k: {f: r[f] for f in same} for k, r in ref.items()}
    topo = {k: (r["hosts"], r["ranks_per_host"], r["interconnect"]) for k, r in got.items()}
    assert {W: topo[m, W] for m, W in topo} == {1: (1, 1, "none"), 2: (1, 2, "loopback"), 4: (2, 2, "loopback+tcp/lo")}
    assert got["true_cp", 4]["report"]["topology"]["ranks_by_host"] == [2, 2]
    assert {W: (ref[m, W]["hosts"], ref[m, W]["ranks_per_host"]) for m, W in ref} == {1: (1, 1), 2: (1, 2), 4: (1, 4)}


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_killed_host_loses_nothing_and_stores_nothing_twice(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    from db.models import Point
    from db.session import session_scope

    lease_s = 6.0
    sweep = _submit(store_url, write_spec(tmp_path, "slow.yaml", modes=["all_gather"], timing=SLOW_TIMING,
                                          axes={"T": 128, "H": 2, "K": 32, "V": 32, "W": 4}, check={"reference_tokens": 64}))  # fmt: skip
    fast = _submit(store_url, write_spec(tmp_path, "fast.yaml", **{**SWEEP, "axes": {**SWEEP["axes"], "W": [2]}}))
    with session_scope(store_url) as s:
        (slow,) = s.scalars(select(Point.id).where(Point.sweep_id == sweep))

    def held_and_renewed() -> str | None:
        """The first gang's rank 0 holds the slow point and has renewed its lease (it is inside the point)."""
        with session_scope(store_url) as s:
            p = s.get(Point, slow)
            renewed = p.status == "running" and p.lease_expires_at > p.claimed_at + timedelta(seconds=lease_s + 0.5)
            return p.lease_owner if renewed else None

    hosts = Hosts(store_url, tmp_path, "--lease-s", str(lease_s), "--heartbeat-s", "1")
    try:
        hosts.start_two()
        deadline = time.monotonic() + DEADLINE_S
        while (owner := held_and_renewed()) is None:
            assert time.monotonic() < deadline and hosts.procs["b"].poll() is None, hosts.logs()
            time.sleep(0.2)
        hosts.kill("b")
        killed_at = time.monotonic()
        hosts.start("b2")  # the scheduler brings the host back; torchrun re-forms the gang with it
        while True:
            with session_scope(store_url) as s:
                if s.get(Point, slow).status == "done":
                    break
            assert time.monotonic() < killed_at + DEADLINE_S, hosts.logs()
            time.sleep(0.2)
        recovery_s = time.monotonic() - killed_at
        assert hosts.wait("a") == 0 and hosts.wait("b2") == 0, hosts.logs()
    finally:
        hosts.stop()

    print(f"\nkilled host b mid-point (W=4, lease {lease_s:g} s): point {slow} done again {recovery_s:.1f} s after the kill")
    got = _results(store_url, sweep)["all_gather", 4]
    assert (got["status"], got["attempts"]) == ("done", 2), hosts.logs()
    assert got["worker"] != owner  # stored by the re-formed gang's rank 0, not by the one that held it
    assert (got["hosts"], got["ranks_per_host"]) == (2, 2)
    assert {(r["status"], r["attempts"]) for r in _results(store_url, fast).values()} == {("done", 1)}
    for sid in (sweep, fast):
        meas, profs = _row_counts(store_url, sid)
        assert set(meas.values()) == {1} == set(profs.values())
    a_log = (tmp_path / "a.log").read_text()
    assert "broken" in a_log, a_log[-3000:]  # the ranks left said why they exit
