"""The API under load, against a real `cpbench serve` process (issue 28's targets; figures, not tests).

    python benchmarks/api_load.py [--requests 400] [--clients 20] [--seconds 10] [--repeat 5]
                                  [--sections keepalive,results,bodies] [--out results/api_load_cpu.md]

On a scratch SQLite store, migrated and seeded with one sweep of 82 measured and profiled points (`seed`), it
starts `python -m bench_server serve --port 0` (`cpbench serve`) in a child process (the server does not share this process's GIL)
and measures, from this process:

1. keep-alive: `--requests` GET /healthz and GET /api/v1/sweeps/<id> on one kept-alive connection, one at a time
   (target: median <= 2 ms; without TCP_NODELAY each took >= 44 ms);
2. results under load: `--clients` threads, each on its own kept-alive connection, GET /api/v1/results?sweep=<id>
   (all 82 rows) for `--seconds` (target: p99 <= 100 ms);
3. 1 MiB bodies: valid specs of ~1 MiB (one varlen length list of 340,000 entries; 10,000 length lists of 32)
   validated in this process (`SweepSpec.model_validate_json`, the server's own parse, with the cyclic collector
   held off as the server holds it; wall and CPU time; target <= 50 ms) and POSTed (after one warm-up POST: the
   first submit imports the engine), while another connection polls /healthz (target: /healthz <= 10 ms
   meanwhile); the same probe with no POST running gives the load's own share. A POST's round trip also holds the
   submit: the grid expanded and its points inserted (10,000 points for the second body), in the submit process
   (`bench_server.core.submit_pool`) whose CPU is reported apart from the server's.

Each section gives the server's CPU time per request (from /proc: the load of other work on the host inflates it
far less than the wall times) and the host's load average before and after it. Prints a Markdown report (the
machine, the versions and the git sha with the figures); `--out` also writes it to a file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

TOKEN = "bench-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROOT = Path(__file__).resolve().parent.parent


def _ms(seconds: list[float]) -> list[float]:
    return sorted(s * 1e3 for s in seconds)


def _pct(ms: list[float], q: float) -> float:
    return ms[min(len(ms) - 1, int(q * len(ms)))]


def _summary(ms: list[float]) -> str:
    return f"n={len(ms)}, median {statistics.median(ms):.2f} ms, p90 {_pct(ms, 0.9):.2f}, p99 {_pct(ms, 0.99):.2f}, max {ms[-1]:.2f}"


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (the submit process)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError):
                pass
    return out


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def settled(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until the server's children (the submit process, importing at start) stop using CPU."""
    deadline = time.monotonic() + timeout_s
    last = -1.0
    while time.monotonic() < deadline:
        now = sum(map(cpu_s, children(pid)))
        if now == last:
            return
        last = now
        time.sleep(0.5)


@contextmanager
def served(url: str) -> Iterator[tuple[str, int]]:
    """`cpbench serve` on a free port in a child process; yields its base URL and pid."""
    env = {**os.environ, "CPBENCH_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench_server", "serve", "--port", "0", "--db", url, "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        base = None
        for line in proc.stdout:
            if m := re.match(r"dashboard: (http://[^/]+)/", line):
                base = m.group(1)
                break
        if base is None:
            raise RuntimeError(f"cpbench serve did not start (rc {proc.wait()})")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain its log
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("cpbench serve does not answer /healthz")
            time.sleep(0.1)
        settled(proc.pid)
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def keep_alive(base: str, path: str, n: int) -> list[float]:
    with httpx.Client(base_url=base, headers=AUTH) as client:
        client.get(path)
        out = []
        for _ in range(n):
            started = time.perf_counter()
            r = client.get(path)
            out.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text[:200]
    return out


def under_load(base: str, path: str, clients: int, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client_loop() -> None:
        mine = []
        with httpx.Client(base_url=base, timeout=60) as client:
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                r = client.get(path)
                mine.append(time.perf_counter() - started)
                if r.status_code != 200:
                    errors[0] += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


def bodies() -> dict[str, bytes]:
    base = {"name": "big", "ops": ["gdn"], "modes": ["none"], "backends": ["torch"], "axes": {"H": 1, "K": 16, "V": 16}}
    one = {**base, "axes": {**base["axes"], "lengths": [[1] * 340_000]}}
    many = {**base, "axes": {**base["axes"], "lengths": [[i + 1] + [1] * 31 for i in range(10_000)]}}
    return {
        "one varlen list of 340,000 lengths": json.dumps(one).encode(),
        "10,000 varlen lists of 32 lengths": json.dumps(many).encode(),
    }


def best_of(fn: Callable[[], object], n: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for _ in range(n):
        started = clock()
        fn()
        out.append(clock() - started)
    return out


def _prober(base: str, probes: list[float], done: threading.Event) -> threading.Thread:
    """A thread polling /healthz on its own kept-alive connection every 2 ms until `done`."""

    def probe() -> None:
        with httpx.Client(base_url=base) as other:
            while not done.is_set():
                started = time.perf_counter()
                other.get("/healthz")
                probes.append(time.perf_counter() - started)
                time.sleep(0.002)

    return threading.Thread(target=probe)


def probe_alone(base: str, seconds: float) -> list[float]:
    """/healthz polled as during the POSTs, with nothing else running: what the load alone costs."""
    probes: list[float] = []
    done = threading.Event()
    prober = _prober(base, probes, done)
    prober.start()
    time.sleep(seconds)
    done.set()
    prober.join()
    return probes


def collector_held(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` run as the server runs a submit: the cyclic collector held off (`routes.sweeps.COLLECTOR_PAUSE`)."""

    def run() -> object:
        gc.disable()
        try:
            return fn()
        finally:
            gc.enable()

    return run


def _post(client: httpx.Client, body: bytes) -> float:
    started = time.perf_counter()
    r = client.post("/api/v1/sweeps", content=body)
    assert r.status_code == 201, r.text[:300]
    return time.perf_counter() - started


def post_cpu(base: str, body: bytes, repeat: int, pid: int) -> tuple[list[float], float, float]:
    """`repeat` POSTs of `body` (after a warm-up one) with nothing else running: their round trips, and the CPU ms
    per POST of the server and of its children (the submit process)."""
    with httpx.Client(base_url=base, headers={**AUTH, "Content-Type": "application/json"}, timeout=60) as client:
        _post(client, body)
        kids = children(pid)
        server, others = cpu_s(pid), sum(map(cpu_s, kids))
        walls = [_post(client, body) for _ in range(repeat)]
        return walls, (cpu_s(pid) - server) * 1e3 / repeat, (sum(map(cpu_s, kids)) - others) * 1e3 / repeat


def big_posts(base: str, body: bytes, repeat: int) -> tuple[list[float], list[float]]:
    posts: list[float] = []
    probes: list[float] = []
    done = threading.Event()
    prober = _prober(base, probes, done)
    with httpx.Client(base_url=base, headers={**AUTH, "Content-Type": "application/json"}, timeout=60) as client:
        _post(client, body)  # warm-up: the first submit imports the engine
        prober.start()
        try:
            posts.extend(_post(client, body) for _ in range(repeat))
        finally:
            done.set()
            prober.join()
    return posts, probes


def seed(url: str, n: int = 82) -> int:
    """A sweep of `n` measured and profiled points (modes x W x T x lb), as a worker would have stored them."""
    from benchmarks.synthetic_store import store_samples
    from db import crud
    from db.session import session_scope

    facts = {"device_name": "cpu", "torch": "bench", "python": platform.python_version(), "cpbench": "bench", "host": "bench"}
    shapes = [
        (m, w, t, lb)
        for m in ("none", "all_gather", "ring", "true_cp")
        for w in (1, 2, 4)
        for t in (256, 1024, 4096)
        for lb in (-1.0, -4.0, -0.5)
    ]
    points = []
    for idx, (mode, W, T, lb) in enumerate(shapes[:n]):
        params = {
            "B": 1,
            "T": T,
            "H": 4,
            "K": 32,
            "V": 32,
            "lb": lb,
            "W": W,
            "layout": "contiguous",
            "direction": "fwd",
            "dtype": "bfloat16",
        }
        key = f"op=gdn/mode={mode}/backend=torch/" + "/".join(f"{k}={v}" for k, v in params.items())
        points.append(
            {"idx": idx, "key": key, "params": params, "op": "gdn", "mode": mode, "backend": "torch", "seed": 0, **params}
        )
    with session_scope(url) as s:
        env = crud.get_or_create_environment(s, facts=facts)
        s.flush()
        sweep = crud.create_sweep(s, name="load", tags=["bench"], spec={"name": "load"}, points=points)
        for p in sweep.points:
            ms = [1e-3 * p.T * (1 + 0.01 * i) for i in range(10)]
            launched = {"chunk_fwd": {"BV": 32, "num_warps": 4}}
            store_samples(
                s,
                point_id=p.id,
                environment_id=env.id,
                samples=ms,
                worker="bench:1",
                configs=launched,
                collectives={"all_gather": 1},
                collective_bytes={"all_gather": 4096},
                kernel_launches=12,
            )
            p.status = "done"
        return sweep.id


def environment() -> str:
    import fastapi
    import pydantic
    import sqlalchemy
    import uvicorn

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return (
        f"- machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), {platform.platform()}\n"
        f"- load average before the run: {load()}\n"
        f"- Python {platform.python_version()}, uvicorn {uvicorn.__version__}, FastAPI {fastapi.__version__}, "
        f"pydantic {pydantic.__version__}, SQLAlchemy {sqlalchemy.__version__}, SQLite {__import__('sqlite3').sqlite_version}\n"
        f"- git {sha}{' (with uncommitted changes)' if dirty else ''}"
    )


SECTIONS = ("keepalive", "results", "bodies")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sections", default=",".join(SECTIONS), help="which of keepalive, results, bodies to run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sections = [x for x in args.sections.split(",") if x]
    if unknown := sorted(set(sections) - set(SECTIONS)):
        ap.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    sys.path.insert(0, str(ROOT))
    from db.migrate import upgrade
    from db.session import dispose_engine
    from runners.spec import SweepSpec

    lines = [
        "# The API under load (CPU, `cpbench serve`, SQLite)",
        "",
        f"`python benchmarks/api_load.py --requests {args.requests} --clients {args.clients} --seconds {args.seconds:g} "
        f"--repeat {args.repeat} --sections {','.join(sections)}`",
        "",
        environment(),
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'cpbench.db'}"
        upgrade(url)
        sweep_id = seed(url)
        dispose_engine(url)
        with served(url) as (base, pid):
            if "keepalive" in sections:
                lines += ["## 1. One kept-alive connection (target: median <= 2 ms)", ""]
                for path in ("/healthz", f"/api/v1/sweeps/{sweep_id}"):
                    before, cpu = load(), cpu_s(pid)
                    ms = _ms(keep_alive(base, path, args.requests))
                    cpu_ms = (cpu_s(pid) - cpu) * 1e3 / (args.requests + 1)
                    lines.append(
                        f"- GET {path}: {_summary(ms)}; server CPU {cpu_ms:.2f} ms per request (load {before} -> {load()})"
                    )
            if "results" in sections:
                path = f"/api/v1/results?sweep={sweep_id}&limit=100"
                before, cpu = load(), cpu_s(pid)
                latencies, errors = under_load(base, path, args.clients, args.seconds)
                cpu_ms = (cpu_s(pid) - cpu) * 1e3 / max(1, len(latencies))
                ms = _ms(latencies)
                lines += [
                    "",
                    f"## 2. GET /api/v1/results (82 rows, one page) under {args.clients} clients for {args.seconds:g} s "
                    "(target: p99 <= 100 ms)",
                    "",
                    f"- {_summary(ms)}; {len(ms) / args.seconds:.0f} req/s; non-200: {errors}; server CPU {cpu_ms:.2f} ms "
                    f"per request (load {before} -> {load()})",
                ]
            if "bodies" in sections:
                lines += ["", "## 3. Valid ~1 MiB bodies (targets: validated in <= 50 ms; /healthz <= 10 ms meanwhile)", ""]
                before = load()
                alone = _ms(probe_alone(base, 5.0))
                lines.append(
                    f"- /healthz polled for 5 s with no POST running (the load's share): {_summary(alone)} "
                    f"(load {before} -> {load()})"
                )
                for name, body in bodies().items():
                    before = load()
                    validate = collector_held(lambda body=body: SweepSpec.model_validate_json(body))
                    validate()
                    wall = _ms(best_of(validate, args.repeat))
                    cpu = _ms(best_of(validate, args.repeat, clock=time.thread_time))
                    alone_posts, server_ms, kids_ms = post_cpu(base, body, args.repeat, pid)
                    posts, probes = big_posts(base, body, args.repeat)
                    lines.append(
                        f"- {name} ({len(body) / 2**20:.2f} MiB): validation median {statistics.median(wall):.1f} ms "
                        f"(min {wall[0]:.1f}; CPU median {statistics.median(cpu):.1f} ms); POST round trip median "
                        f"{statistics.median(_ms(alone_posts)):.1f} ms alone, {statistics.median(_ms(posts)):.1f} ms with the probe "
                        f"(CPU per POST: server {server_ms:.1f} ms, submit process "
                        f"{kids_ms:.1f} ms); /healthz meanwhile: {_summary(_ms(probes))} (load {before} -> {load()})"
                    )
    lines += ["", f"- load average after the run: {load()}"]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
