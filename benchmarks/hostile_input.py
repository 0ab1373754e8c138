"""Validation cost of a hostile 1 MiB sweep body and /healthz latency meanwhile (issue 17 "Show").

    python benchmarks/hostile_input.py [--values 180000]

Serves the app with uvicorn on a scratch SQLite store (127.0.0.1, a free port), posts a spec whose `axes.T` holds
N distinct values (about 1 MiB of JSON), and meanwhile polls /healthz from another thread. Prints the POST's
status and wall time and the /healthz latencies (median, max) measured while the POST ran. A figure, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

TOKEN = "bench-token-0123456789abcdef"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--values", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import os

    os.environ.setdefault("CPBENCH_MAX_BODY_BYTES", str(4 << 20))
    from bench_server.core.config import ServerSettings
    from bench_server.live import LiveServer
    from bench_server.main import create_app
    from db.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        app = create_app(ServerSettings(DATABASE_URL=url, API_TOKEN=TOKEN))
        body = json.dumps({"name": "big", "ops": ["gdn"], "modes": ["none"],
                           "axes": {"T": list(range(1, args.values + 1)), "H": 2, "K": 16, "V": 16}})
        with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=120) as c:
            c.get("/healthz")
            latencies: list[tuple[float, float]] = []  # (start, ms)
            done = threading.Event()

            def poll() -> None:
                with httpx.Client(base_url=live.url, timeout=120) as h:
                    while not done.is_set():
                        t = time.perf_counter()
                        h.get("/healthz")
                        latencies.append((t, (time.perf_counter() - t) * 1e3))
                        time.sleep(0.005)

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(1.0)  # baseline
            posts: list[tuple[float, float, int]] = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = c.post("/api/v1/sweeps", content=body,
                           headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
                posts.append((t0, time.perf_counter(), r.status_code))
                time.sleep(0.3)
            done.set()
            poller.join()
        # the server's own validation time: the model on the parsed body, warm
        from runners.spec import SweepSpec

        data = json.loads(body)
        took = []
        for _ in range(5):
            t = time.perf_counter()
            with contextlib.suppress(Exception):  # the refusal is the point
                SweepSpec.model_validate(data)
            took.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        json.loads(body)
        parse_ms = (time.perf_counter() - t) * 1e3
        during = [ms for s0, ms in latencies if any(a <= s0 <= b for a, b, _ in posts)]
        before = [ms for s0, ms in latencies if s0 < posts[0][0]]
        walls = sorted((b - a) * 1e3 for a, b, _ in posts)
        print(f"body {len(body) / 2**20:.2f} MiB ({args.values} values): HTTP {sorted({c for *_, c in posts})}, "
              f"request wall median {statistics.median(walls):.1f} ms (upload + JSON parse {parse_ms:.1f} ms + validation)")
        print(f"spec validation of the parsed body: median {statistics.median(took):.2f} ms")
        if before:
            print(f"/healthz before: median {statistics.median(before):.1f} ms over {len(before)} calls")
        if during:
            print(f"/healthz during the POSTs: median {statistics.median(during):.1f} ms, max {max(during):.1f} ms "
                  f"over {len(during)} calls")


if __name__ == "__main__":
    main()
