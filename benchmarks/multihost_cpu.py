"""Issue 29's show on the CPU: one sweep whose W <= 2 points run on one host's gang and whose W=4 points run on two
torchrun "hosts" of 2 gloo ranks on the loopback address, and the sweep figures drawn from it.

    python benchmarks/multihost_cpu.py [--out benchmarks/results/multihost_cpu]

A scratch SQLite store gets one sweep (gdn, torch backend, fp32, forward; none at W=1, all_gather / ring / true_cp at
W = 1, 2, 4; T 256 and 1024). `cpbench worker --cpu --devices 2 --once` works the points up to W=2 (the W=4 ones wait:
larger than its gang); then two `python -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d
... -m bench_server worker --multi-host --cpu --once` agents, one per "host", work the W=4 points as one gang of 2x2.
Writes to `--out`: `figures.md` (each point's topology as stored, the scaling figure's traces with their x and y, the
latency and mode-map columns, the predicted figure's columns, the two runs' wall times) and `figures.html`: the
scaling, latency and mode-map figures on one page (plotly.js from its CDN). CPU times are plumbing, not speed. A figure, not a
test.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards.data import sweep_rows  # noqa: E402
from dashboards.figures import best_mode, latency, predicted, scaling  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.session import get_sessionmaker, session_scope  # noqa: E402

SPEC = {
    "name": "multihost-cpu",
    "tags": ["cpu", "multi-host", "issue-29"],
    "ops": ["gdn"],
    "modes": ["none", "all_gather", "ring", "true_cp"],
    "backends": ["torch"],
    "axes": {"B": 1, "T": [256, 1024], "H": 2, "K": 32, "V": 32, "lb": -1.0, "W": [1, 2, 4], "dtype": "float32"},
    "timing": {"min_samples": 5, "max_samples": 100, "min_time_s": 0.0, "max_rel_iqr": 0.5, "timeout_s": 5.0, "warmup_s": 0.0},
    "check": {"reference_tokens": 64},
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "", "CPBENCH_POLL_S": "0.2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # fmt: skip


def _cli(*args: str, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    for p, log in zip(procs, logs, strict=True):
        if p.wait(timeout=900) != 0:
            raise SystemExit(f"{' '.join(map(str, p.args))} exited {p.returncode}:\n{log.read_text()[-3000:]}")


def run(url: str, work: Path) -> tuple[int, float, float]:
    """Submit the sweep, work it on one host up to W=2, then on two "hosts"; (sweep id, the two runs' seconds)."""
    from runners.engine import submit_spec
    from runners.spec import load_spec

    spec_path = work / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC))
    with session_scope(url) as s:
        sweep = submit_spec(s, load_spec(spec_path))
        s.flush()
        sweep_id = sweep.id
    t0 = time.monotonic()
    log = work / "single-host.log"
    _wait([_cli("bench_server", "worker", "--cpu", "--devices", "2", "--once", "--db", url, log=log)], [log])
    one_s = time.monotonic() - t0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = ["torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "bench_server", "worker", "--multi-host", "--cpu", "--once",
             "--db", url]  # fmt: skip
    t0 = time.monotonic()
    logs = [work / f"host{i}.log" for i in range(2)]
    procs = [_cli(*agent, log=logs[0])]
    time.sleep(3.0)  # the first agent hosts the rendezvous store (and its ranks become node 0)
    procs.append(_cli(*agent, log=logs[1]))
    _wait(procs, logs)
    return sweep_id, one_s, time.monotonic() - t0


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def report(rows: list[dict[str, Any]], one_s: float, two_s: float) -> list[str]:
    lines = ["# One sweep on one host (W <= 2) and on two torchrun \"hosts\" (W = 4), CPU (issue 29)", "",
             "Command: `python benchmarks/multihost_cpu.py --out benchmarks/results/multihost_cpu` (gloo over loopback "
             "on the 2-core VM: times are plumbing, not speed).", "",
             f"Wall time: single-host gangs (W <= 2) {one_s:.1f} s; the two-host gang (W = 4) {two_s:.1f} s.", "",
             "## The points as stored", ""]  # fmt: skip
    pts = sorted(rows, key=lambda r: (r["T"], r["W"], r["mode"]))
    lines += _table(["T", "W", "mode", "status", "hosts", "ranks_per_host", "interconnect", "median ms", "err_vs_none",
                     "unreliable"],
                    [[r["T"], r["W"], r["mode"], r["status"], r["hosts"], r["ranks_per_host"], r["interconnect"],
                      f"{r['median_ms']:.3f}" if r.get("median_ms") else "-",
                      f"{r['err_vs_none']:.2e}" if r.get("err_vs_none") is not None else "-", r.get("unreliable") or ""]
                     for r in pts if r["status"] != "skipped"])  # fmt: skip
    fig = scaling.figure(rows).to_plotly_json()
    lines += ["", "## Scaling figure: the speedup traces (x = W, y = t(1)/t(W) over the one-host W=1 none)", ""]
    lines += _table(["trace", "T", "W", "speedup"],
                    [[t["name"], t["meta"]["T"], list(t["x"]), [round(y, 3) for y in t["y"]]] for t in fig["data"]
                     if t["meta"].get("kind") == "measured" and t["meta"]["quantity"] == "speedup"])  # fmt: skip
    titles = {
        name: [
            a["text"] for a in f.to_plotly_json()["layout"]["annotations"] if a.get("xref") == "paper" and a["text"].strip()
        ]
        for name, f in (("latency", latency.figure(rows)), ("predicted", predicted.figure(rows)))
    }
    best = [t for t in best_mode.figure(rows).to_plotly_json()["data"] if t["meta"]["kind"] == "best"]
    lines += ["", "## Columns", "", f"- latency: {titles['latency']}", f"- predicted: {titles['predicted']}",
              f"- mode map: {list(best[0]['x']) if best else []}", ""]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "multihost_cpu"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/store.db"
        upgrade(url)
        sweep_id, one_s, two_s = run(url, Path(tmp))
        with get_sessionmaker(url)() as s:
            rows = sweep_rows(s, sweep_id, limit=10000)
    (out / "figures.md").write_text("\n".join(report(rows, one_s, two_s)))
    divs = [
        module.figure(rows).to_html(full_html=False, include_plotlyjs="cdn" if i == 0 else False)
        for i, module in enumerate((scaling, latency, best_mode))
    ]
    (out / "figures.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(divs) + "\n</body></html>\n")
    print(f"wrote {out}/figures.md and figures.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
