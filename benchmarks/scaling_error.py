"""The scaling model's prediction error against every measured CP point in benchmarks/results/ (issue 29, Show).

    python benchmarks/scaling_error.py [--out benchmarks/results/scaling_model_error.md]

Reads the measured points (`cp_w48_cpu.csv`: the engine's W=1/4/8 gloo sweep on the 2-core CPU VM; `cp_h200.json`:
every scheme at W=2 on two H200s, forward), fits the kernel rate of each shape family on its own W=1 `none` points
and predicts every point with `dashboards.scaling_model.held_against`. The links: the CPU points use the
`cpbench bench comm --cpu --world 4` run in `comm_cpu.json` (gloo over loopback on the same VM); the H200 points
`comm_h200.json` when it exists, else the assumed H200 links (`DEFAULT_PARAMS`: no H200 run is committed yet). The CPU points are
predicted twice: as the model stands (one device per rank, the GPU case) and with the W ranks sharing the VM's 2
cores (`devices_per_host=2`). Prints a Markdown table per file (each point: measured, predicted = compute + comm,
error = predicted / measured - 1) and the median |error| per scheme; `--out` writes it too. A figure, not a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards.links import DEFAULT_PARAMS, CommParams  # noqa: E402
from dashboards.scaling_model import held_against  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def cpu_rows() -> list[dict[str, Any]]:
    rows = []
    with open(RESULTS / "cp_w48_cpu.csv") as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = dict(r)
            for k in ("point_id", "B", "T", "H", "K", "V", "W"):
                row[k] = int(r[k])
            row["id"], row["params"] = row["point_id"], json.loads(r["params"])
            row["median_ms"] = float(r["median_ms"]) if r["median_ms"] else None
            rows.append(row)
    return rows


def h200_rows() -> list[dict[str, Any]]:
    """cp_h200.json's W-GPU records as result rows (our schemes only; FLA's are the peer, warmup_correct unmodelled)."""
    recs = json.loads((RESULTS / "cp_h200.json").read_text())["records"]
    rows = []
    for i, r in enumerate(recs):
        if r.get("kind") != "cp" or "ms" not in r or r["scheme"].startswith("fla"):
            continue
        rows.append(
            {
                "id": i,
                "mode": r["scheme"],
                "op": r["op"],
                "backend": "triton",
                "B": 1,
                "T": r["T"],
                "H": r["H"],
                "K": r["K"],
                "V": r["V"],
                "W": r["gpus"],
                "layout": "contiguous",
                "direction": "fwd",
                "dtype": r["dtype"],
                "status": "done",
                "median_ms": r["ms"],
                "params": {},
            }
        )
    return rows


def table(
    title: str, pred: list[dict[str, Any]], extra: list[dict[str, Any]] | None = None, extra_name: str = ""
) -> list[str]:
    more = f" | predicted {extra_name} ms | error {extra_name}" if extra else ""
    lines = [
        f"### {title}",
        "",
        f"| op | T | layout | W | topology | mode | measured ms | predicted ms (compute + comm) | error{more} |",
        "|---|---|---|---|---|---|---|---|---" + ("|---|---" if extra else "") + "|",
    ]
    other = {r["id"]: r for r in extra or []}
    for r in sorted(pred, key=lambda r: (r["op"], r["T"], r["layout"] or "", r["W"], r["mode"])):
        if r["predicted_ms"] is None:
            continue
        cells = [
            r["op"],
            r["T"],
            r["layout"],
            r["W"],
            r["topology"],
            r["mode"],
            f"{r['median_ms']:.3f}",
            f"{r['predicted_ms']:.3f} ({r['compute_ms']:.3f} + {r['comm_ms']:.3f})",
            f"{100 * r['error']:+.0f}%",
        ]
        if extra:
            o = other[r["id"]]
            cells += [f"{o['predicted_ms']:.3f}", f"{100 * o['error']:+.0f}%"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines + [""]


def summary(name: str, pred: list[dict[str, Any]]) -> list[str]:
    by_mode: dict[str, list[float]] = defaultdict(list)
    for r in pred:
        if r["error"] is not None:
            by_mode[r["mode"]].append(abs(r["error"]))
    cells = ", ".join(f"{m} {100 * statistics.median(v):.0f}% (n={len(v)})" for m, v in sorted(by_mode.items()))
    allv = [v for vs in by_mode.values() for v in vs]
    return [f"- {name}: median |error| {100 * statistics.median(allv):.0f}% over {len(allv)} points; per scheme: {cells}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="also write the Markdown here")
    args = p.parse_args(argv)
    cpu_params = CommParams.load(str(RESULTS / "comm_cpu.json"))
    cpu = cpu_rows()
    cpu_gpu_like = held_against(cpu, cpu_params)
    cpu_shared = held_against(cpu, cpu_params, devices_per_host=2)
    h200_links = RESULTS / "comm_h200.json"  # `cpbench bench comm --world 2` on the H200s, once it is run
    h200_params = CommParams.load(str(h200_links)) if h200_links.is_file() else DEFAULT_PARAMS
    h200 = held_against(h200_rows(), h200_params)
    lines = [
        "# The scaling model against every measured CP point (issue 29)",
        "",
        "Command: `python benchmarks/scaling_error.py --out benchmarks/results/scaling_model_error.md`",
        "",
        "Model: `dashboards/scaling_model.py` (kernel rate fitted per shape family on the file's own W=1 `none` "
        "points; collectives on an alpha-beta link model). Links: CPU points from `comm_cpu.json` "
        f"(`cpbench bench comm --cpu --world 4`, {cpu_params.source}: intra {cpu_params.intra.alpha_s * 1e6:.0f} us, "
        f"{cpu_params.intra.gbytes_per_s:.2f} GB/s); H200 points {h200_params.source}. "
        "error = predicted / measured - 1. warmup_correct is not modelled.",
        "",
        "## Summary",
        "",
    ]
    lines += summary("CPU, one device per rank (the model as on GPUs)", cpu_gpu_like)
    lines += summary("CPU, the ranks sharing the VM's 2 cores (`devices_per_host=2`)", cpu_shared)
    lines += summary("H200, W=2", h200)
    lines += [
        "",
        "Reading:",
        "",
        "- H200 (W=2): ring, true_cp and tail_exchange within 1-25 % (median 6 %); all_gather and headwise "
        "under-predicted by 25-40 %: their all-gather / all-to-all moved megabytes at below the assumed 360 GB/s "
        "(packing copies and NCCL's small-message efficiency are not in the model). A `cpbench bench comm` run on "
        "the H200s replaces the assumed links (the lead's GPU command).",
        "- CPU: W ranks share 2 cores and the box ran other jobs: the two `none` runs of one shape differ up to 2x "
        "(cp_w48_cpu.md), so the fitted fixed cost per call is noise, and ring multiplies it by its W (2W zigzag) "
        "calls (its worst points: up to 7x the measured time); ring's median error is 15 %. Sharing the cores (`devices_per_host=2`) "
        "halves all_gather's error (every rank runs the whole sequence at once) but overshoots headwise and true_cp, "
        "whose ranks partly wait on each other.",
        "",
        "## Points",
        "",
    ]
    lines += table("H200, W=2 (cp_h200.json)", h200)
    lines += table("CPU gloo, W=1/4/8 (cp_w48_cpu.csv)", cpu_gpu_like, cpu_shared, "2 cores")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
