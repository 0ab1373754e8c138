"""Engine overheads on this machine (not a test): the store's per-point cost and the gang's per-point latency.

    python benchmarks/engine_overhead.py --db sqlite:////tmp/x.db [--db postgresql+psycopg://...] [--points 200]
    python benchmarks/engine_overhead.py --gang [--gang-jobs 50]
    python benchmarks/engine_overhead.py --worker sqlite:////tmp/w.db [--worker-points 12]

1. claim + store, per point (issue 4 target: < 50 ms): on a migrated store, a sweep of N points; each iteration
   is what the worker does around a point's run: `claim_point`, `touch_worker(busy)`, then in one transaction
   `store_artifact` + `store_measurement` (200 samples) + `store_profile` + `complete_point`, then
   `refresh_sweep_status` and `touch_worker(idle)`. Wall time per point: median, p90, max.
2. gang reuse (target: a second W=2 point starts < 100 ms after the first ends): cold start of a W=2 gloo gang
   (spawn + init_process_group), then the round trip of a trivial job on the warm gang (the latency a point
   adds between two points of the same W), median and max over the jobs.
3. the same seen from the store (`--worker`): a real worker runs N tiny W=2 `ring` points (torch, T=128) with
   different seeds; the gap between one point's `finished_at` and the next one's `claimed_at`, and the first
   point's claim-to-finish time (it pays the gang start) against the later ones'.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from runners.stats import summarize


def bench_store(url: str, points: int) -> dict[str, float]:
    from db import crud
    from db.migrate import upgrade
    from db.queue import claim_point, complete_point, refresh_sweep_status
    from db.session import session_scope

    upgrade(url)
    rows = []
    for i in range(points):
        rows.append({
            "idx": i, "key": f"bench/{i}", "params": {"i": i}, "op": "gdn", "mode": "none", "backend": "torch", "B": 1,
            "T": 256, "H": 2, "K": 32, "V": 32, "lb": -1.0, "W": 1, "layout": "contiguous", "direction": "fwd",
            "dtype": "float32", "seed": 0,
        })  # fmt: skip
    with session_scope(url) as s:
        sweep_id = crud.create_sweep(s, name="overhead", tags=["bench"], spec={}, points=rows).id
        env_id = crud.get_or_create_environment(s, facts={"device_name": "cpu", "torch": "x", "python": "3", "cpbench": "0", "host": "h"}).id
        crud.register_worker(s, name="bench", host="h", pid=1, devices={}, environment_id=env_id)
    samples = [1.0 + 0.001 * i for i in range(200)]
    summary = {f"{k}_ms" if k != "n" else k: v for k, v in summarize(samples).as_dict().items()}
    times = []
    for _ in range(points):
        t0 = time.perf_counter()
        with session_scope(url) as s:
            p = claim_point(s, worker="bench", lease_s=60)
            pid = p.id
            crud.touch_worker(s, name="bench", status="busy", current_point_id=pid)
        with session_scope(url) as s:
            art = crud.store_artifact(s, point_id=pid, kind="chrome_trace", path="/dev/null", size_bytes=0, sha256="0" * 64)
            crud.store_measurement(s, point_id=pid, environment_id=env_id, worker="bench", clock="wall", samples=samples,
                                   summary=summary, stop_reason="noise", err_vs_none=0.0, err_vs_reference=1e-7,
                                   configs={}, report={"timing": {}})
            crud.store_profile(s, point_id=pid, collectives={"all_gather": 1}, collective_bytes={"all_gather": 1024},
                               host_syncs=0, sync_events={}, kernel_launches=3, peak_memory_bytes=None, artifact_id=art.id)
            assert complete_point(s, point_id=pid, worker="bench")
        with session_scope(url) as s:
            refresh_sweep_status(s, sweep_id=sweep_id)
        with session_scope(url) as s:
            crud.touch_worker(s, name="bench", status="idle", points_done_inc=1)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))], "max_ms": times[-1], "n": len(times)}


def whoami(ctx: Any, payload: Any) -> dict[str, Any]:
    """A gang job with one real collective (rank processes import this script by reference, as `__mp_main__`)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=ctx.group)
    return {"rank": ctx.rank, "pid": os.getpid(), "sum": float(t[0]), "payload": payload}


def bench_gang(jobs_n: int) -> dict[str, float]:
    from runners.gang import Gang

    gang = Gang(2, device_kind="cpu")
    t0 = time.perf_counter()
    gang.start()
    cold = time.perf_counter() - t0
    lat = []
    try:
        for i in range(jobs_n):
            t = time.perf_counter()
            gang.run(whoami, i, timeout_s=60)
            lat.append((time.perf_counter() - t) * 1e3)
    finally:
        gang.close()
    return {"cold_start_s": cold, "job_median_ms": statistics.median(lat), "job_max_ms": max(lat), "n": len(lat)}


def bench_worker(url: str, points: int) -> dict[str, float]:
    from db import crud
    from db.migrate import upgrade
    from db.session import session_scope
    from runners.engine import run_until_done, submit_spec
    from runners.spec import parse_spec

    upgrade(url)
    spec = parse_spec({
        "name": "gang-reuse", "ops": "gdn", "modes": "ring", "seeds": list(range(points)),
        "axes": {"T": 128, "H": 2, "K": 32, "V": 32, "W": 2, "dtype": "float32"},
        "timing": {"min_samples": 2, "max_samples": 3, "min_time_s": 0, "max_rel_iqr": 0.5, "timeout_s": 1, "warmup_s": 0},
        "check": {"reference": False}, "profile": False,
    })  # fmt: skip
    with session_scope(url) as s:
        sid = submit_spec(s, spec).id
    run_until_done(url, sid, devices=2, device_kind="cpu")
    with session_scope(url) as s:
        rows, _ = crud.list_results(s, sweep_id=sid, limit=points)
    rows.sort(key=lambda r: r["claimed_at"])
    gaps = [(b["claimed_at"] - a["finished_at"]).total_seconds() * 1e3 for a, b in zip(rows, rows[1:], strict=False)]
    runs = [(r["finished_at"] - r["claimed_at"]).total_seconds() for r in rows]
    return {"gap_median_ms": statistics.median(gaps), "gap_max_ms": max(gaps), "first_s": runs[0],
            "later_median_s": statistics.median(runs[1:]), "n": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", default=[], help="store URL (repeatable)")
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--gang", action="store_true", help="measure the W=2 gloo gang")
    ap.add_argument("--gang-jobs", type=int, default=50)
    ap.add_argument("--worker", default=None, help="store URL for the worker measurement")
    ap.add_argument("--worker-points", type=int, default=12)
    args = ap.parse_args()
    for url in args.db:
        r = bench_store(url, args.points)
        print(f"claim+store per point on {url.split('://')[0]}: median {r['median_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, "
              f"max {r['max_ms']:.2f} ms (n={r['n']})")
    if args.gang:
        r = bench_gang(args.gang_jobs)
        print(f"W=2 gloo gang: cold start (spawn + init) {r['cold_start_s']:.2f} s; warm job round trip median "
              f"{r['job_median_ms']:.2f} ms, max {r['job_max_ms']:.2f} ms (n={r['n']})")
    if args.worker:
        r = bench_worker(args.worker, args.worker_points)
        print(f"worker, W=2 points back to back: finished -> next claimed median {r['gap_median_ms']:.1f} ms, max "
              f"{r['gap_max_ms']:.1f} ms; first point {r['first_s']:.2f} s (gang start), later median {r['later_median_s']:.2f} s (n={r['n']})")


if __name__ == "__main__":
    main()
