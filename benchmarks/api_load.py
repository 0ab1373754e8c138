"""The API under load, against a real `cpbench serve` process (issue 28's targets; figures, not tests).

    python benchmarks/api_load.py [--requests 400] [--clients 20] [--seconds 10] [--out results/api_load_cpu.md]

On a scratch SQLite store, migrated and seeded with one sweep of 82 measured and profiled points (`seed`), it
starts `python -m bench_server serve --port 0` (`cpbench serve`) in a child process (the server does not share this process's GIL)
and measures, from this process:

1. keep-alive: `--requests` GET /healthz and GET /api/v1/sweeps/<id> on one kept-alive connection, one at a time
   (target: median <= 2 ms; without TCP_NODELAY each took >= 44 ms);
2. results under load: `--clients` threads, each on its own kept-alive connection, GET /api/v1/results?sweep=<id>
   (all 82 rows) for `--seconds` (target: p99 <= 100 ms);
3. 1 MiB bodies: valid specs of ~1 MiB (one varlen length list of 340,000 entries; 10,000 length lists of 32)
   validated in this process (`SweepSpec.model_validate_json`, the server's own parse, target <= 50 ms) and POSTed
   (after one warm-up POST: the first submit imports the engine), while another connection polls /healthz (target:
   /healthz <= 10 ms meanwhile). A POST's round trip also holds the submit: the grid expanded and its points
   inserted (10,000 points for the second body), in the server's thread pool.

Prints a Markdown report (the machine, its load average, the versions and the git sha with the figures); `--out`
also writes it to a file.
"""

from __future__ import annotations

import argparse
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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def best_of(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def big_posts(base: str, body: bytes, repeat: int) -> tuple[list[float], list[float]]:
    posts: list[float] = []
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=base) as other:
            while not done.is_set():
                started = time.perf_counter()
                other.get("/healthz")
                probes.append(time.perf_counter() - started)
                time.sleep(0.002)

    prober = threading.Thread(target=probe)
    with httpx.Client(base_url=base, headers={**AUTH, "Content-Type": "application/json"}, timeout=60) as client:
        assert client.post("/api/v1/sweeps", content=body).status_code == 201  # warm-up: the first submit imports the engine
        prober.start()
        try:
            for _ in range(repeat):
                started = time.perf_counter()
                r = client.post("/api/v1/sweeps", content=body)
                posts.append(time.perf_counter() - started)
                assert r.status_code == 201, r.text[:300]
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
        f"- load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
        f"- Python {platform.python_version()}, uvicorn {uvicorn.__version__}, FastAPI {fastapi.__version__}, "
        f"pydantic {pydantic.__version__}, SQLAlchemy {sqlalchemy.__version__}, SQLite {__import__('sqlite3').sqlite_version}\n"
        f"- git {sha}{' (with uncommitted changes)' if dirty else ''}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from db.migrate import upgrade
    from db.session import dispose_engine
    from runners.spec import SweepSpec

    lines = [
        "# The API under load (CPU, `cpbench serve`, SQLite)",
        "",
        f"`python benchmarks/api_load.py --requests {args.requests} --clients {args.clients} --seconds {args.seconds:g} "
        f"--repeat {args.repeat}`",
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
            lines += ["## 1. One kept-alive connection (target: median <= 2 ms)", ""]
            for path in ("/healthz", f"/api/v1/sweeps/{sweep_id}"):
                cpu = cpu_s(pid)
                ms = _ms(keep_alive(base, path, args.requests))
                cpu_ms = (cpu_s(pid) - cpu) * 1e3 / (args.requests + 1)
                lines.append(f"- GET {path}: {_summary(ms)}; server CPU {cpu_ms:.2f} ms per request")
            path = f"/api/v1/results?sweep={sweep_id}&limit=100"
            cpu = cpu_s(pid)
            latencies, errors = under_load(base, path, args.clients, args.seconds)
            cpu_ms = (cpu_s(pid) - cpu) * 1e3 / max(1, len(latencies))
            ms = _ms(latencies)
            lines += [
                "",
                f"## 2. GET /api/v1/results (82 rows, one page) under {args.clients} clients for {args.seconds:g} s "
                "(target: p99 <= 100 ms)",
                "",
                f"- {_summary(ms)}; {len(ms) / args.seconds:.0f} req/s; non-200: {errors}; server CPU {cpu_ms:.2f} ms per request",
            ]
            lines += ["", "## 3. Valid ~1 MiB bodies (targets: validated in <= 50 ms; /healthz <= 10 ms meanwhile)", ""]
            for name, body in bodies().items():
                SweepSpec.model_validate_json(body)
                parse = _ms(best_of(lambda body=body: SweepSpec.model_validate_json(body), args.repeat))
                posts, probes = big_posts(base, body, args.repeat)
                lines.append(
                    f"- {name} ({len(body) / 2**20:.2f} MiB): validation median {statistics.median(parse):.1f} ms "
                    f"(min {parse[0]:.1f}); POST round trip median {statistics.median(_ms(posts)):.1f} ms; "
                    f"/healthz meanwhile: {_summary(_ms(probes))}"
                )
    lines += ["", f"- load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
