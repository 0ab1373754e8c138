"""Server CPU of the sweep page of a 56-point sweep, computed (cache cleared) and served per sweep revision (issue 28
"Targets": <= 50 ms).

    python benchmarks/sweep_page.py [--requests 20]

Seeds a scratch SQLite store with one 56-point sweep (gdn, modes none / warmup_correct at W=1 and headwise /
all_gather / ring / true_cp at W=2 and 4 over seven lengths, every point measured and profiled), serves the app with
uvicorn in this process (127.0.0.1, a free port) and requests /sweeps/<id> one at a time. The CPU time of the
process (`time.process_time`, server and client together: an upper bound of the server's) per request is printed
twice: with the page cache cleared before each request (the figures are computed) and with it kept (the page of an
unchanged sweep revision, the cache's case). Prints the 1-minute load average beside the figures: other processes
on the machine slow the wall time, not the CPU time. A figure, not a test.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-token-0123456789abcdef"
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
RUNS = (
    ("none", 1),
    ("warmup_correct", 1),
    ("headwise", 2),
    ("all_gather", 2),
    ("ring", 2),
    ("ring", 4),
    ("true_cp", 2),
    ("true_cp", 4),
)


def _points() -> list[dict[str, Any]]:
    out = []
    for T in LENGTHS:
        for mode, W in RUNS:
            p: dict[str, Any] = {
                "idx": len(out),
                "op": "gdn",
                "mode": mode,
                "backend": "triton",
                "B": 1,
                "T": T,
                "H": 4,
                "K": 64,
                "V": 64,
                "lb": -1.0,
                "W": W,
                "layout": "contiguous",
                "direction": "fwd",
                "dtype": "bfloat16",
                "seed": 0,
            }
            p["key"] = "/".join(f"{k}={p[k]}" for k in ("op", "mode", "backend", "T", "W"))
            p["params"] = {k: p[k] for k in ("B", "T", "H", "K", "V", "lb", "W", "layout", "direction", "dtype")}
            out.append(p)
    return out


def seed(url: str) -> int:
    """One done sweep of 56 measured and profiled points; its id."""
    from benchmarks.synthetic_store import store_samples
    from dashboards.cost_model import comm_cost
    from db import crud
    from db.models import Point
    from db.session import session_scope

    rng = random.Random(0)
    pts = _points()
    with session_scope(url) as s:
        env = crud.get_or_create_environment(
            s, facts={"device_name": "cpu", "host": "bench", "torch": "-", "python": "3.11", "cpbench": "-"}
        )
        sweep = crud.create_sweep(s, name="page-bench", tags=["bench"], spec={"name": "page-bench"}, points=pts)
        s.flush()
        for pt in s.query(Point).filter(Point.sweep_id == sweep.id):
            p = pts[pt.idx]
            ms = 1e-3 * p["T"] / (p["W"] if p["mode"] in ("headwise", "true_cp") else 1) * rng.uniform(0.97, 1.03)
            samples = [ms * rng.uniform(0.98, 1.02) for _ in range(20)]
            pt.status = "done"
            err_vs_none = None if p["mode"] == "none" else 1e-3
            cost = comm_cost(p["mode"], B=1, T=p["T"], H=4, K=64, V=64, W=p["W"], dtype_bytes=2)
            store_samples(
                s,
                point_id=pt.id,
                environment_id=env.id,
                samples=samples,
                err_vs_none=err_vs_none,
                collectives=cost.collectives if cost else {},
                collective_bytes=cost.payload_bytes if cost else {},
                kernel_launches=7,
            )
        sweep.status = "done"
        return sweep.id


def cpu_per_request(client: httpx.Client, path: str, n: int, *, clear: bool) -> list[float]:
    from bench_server import pages

    out = []
    for _ in range(n):
        if clear:
            pages.SWEEP_PAGES.clear()
        t0 = time.process_time()
        r = client.get(path)
        out.append((time.process_time() - t0) * 1e3)
        assert r.status_code == 200, r.text[:200]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    from bench_server.core.config import ServerSettings
    from bench_server.live import LiveServer
    from bench_server.main import create_app
    from db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        sweep_id = seed(url)
        app = create_app(ServerSettings(DATABASE_URL=url, API_TOKEN=TOKEN))
        with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            path = f"/sweeps/{sweep_id}"
            client.get(path)  # imports, templates, first connection
            load = os.getloadavg()[0]
            computed = cpu_per_request(client, path, args.requests, clear=True)
            cached = cpu_per_request(client, path, args.requests, clear=False)
    print(f"sweep page of a 56-point sweep, {args.requests} requests each, load average {load:.2f} on {os.cpu_count()} CPUs")
    for name, ms in (("computed (cache cleared)", computed), ("cached (same revision)", cached)):
        print(f"  {name:26s} CPU ms/request: median {statistics.median(ms):.1f}, max {max(ms):.1f}")


if __name__ == "__main__":
    main()
