"""Is our short forward waiting on the host? Per shape: the forward's time as the bench takes it (do_bench median,
`runners.bench.kernels_ops.Timer`), replayed as a CUDA graph (no host), the host's time to issue one call (back to
back, no sync), the kernels per call and the GPU's busy fraction (torch profiler), and a cProfile of the host's calls
(`host_profile.txt` beside the table): where the time between the graph's and the bench's figure goes.

Why (issue 26, session 32): on the H100 GDN's forward took 0.50 ms at 1x8K, 1x16K and 1x32K alike (the public op,
`results/kernels_fwd_gdn_s31_h100.json`), 0.19 ms replayed as a graph at 1x8K, against FlashQLA's CP 0.20-0.41 ms:
the gap at 32K and below is the host's. The step's host lab is `benchmarks/host_bound_lab.py` (whose measures this
reuses); this one times the forward alone, with grad off, as `runners.bench.kernels` does.

    python3 benchmarks/fwd_host_lab.py --out $OUT [--ops gdn,kda] [--shapes 1x8192,1x16384,1x32768] [--profile 20]
        [--direct]   # also the op's own forward (`chunk_<op>_fwd`, the same passes) without the public op's layers
    TRITON_INTERPRET=1 python3 benchmarks/fwd_host_lab.py --out /tmp/fh --dry-run   # plumbing on the CPU

bf16 on CUDA (fp32, H=1, K=V=32, T=128 in a dry run), H=16, K=V=128, lb -1, the public op `kernels.forward`.
Writes $OUT/fwd_host_lab.{json,md} after each shape and $OUT/host_profile.txt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def graph_ms(fn: Any, timer: Any) -> float:
    """do_bench median of fn captured once as a CUDA graph and replayed (the kernels without the host)."""
    from benchmarks.cuda_graph_step import capture

    graph, _ = capture(fn)
    return timer(graph.replay)[0]


def kernel_names(fn: Any) -> list[str]:
    """The GPU kernels one call of fn runs, in order (torch profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = sorted((e.time_range.start, e.name) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return [name.split("(")[0][:60] for _, name in evs]


def run_shape(op: str, B: int, T: int, H: int, K: int, cuda: bool, profile_n: int,
              api: bool = True) -> tuple[dict[str, Any], str]:  # fmt: skip
    """One row: the public op `kernels.forward` (api), or the op's own forward under it (`ours(api=False)`: session
    32's variants took 0.455 ms at 1x32K where the public op took 0.786, same passes, one process)."""
    import torch

    from benchmarks.host_bound_lab import host_issue_ms, host_profile, timeline
    from runners.bench.kernels_ops import Timer, fla_inputs, ours

    device = "cuda" if cuda else "cpu"
    wl = fla_inputs(op, B, T, H, device=device, K=K, V=K, lb=-1.0, HV=H, dtype="bfloat16" if cuda else "float32")
    args = wl.tensors
    timer = Timer(cuda)

    def fwd(*xs: Any) -> Any:
        return ours(op, *xs, api=api)

    row: dict[str, Any] = {"op": op, "B": B, "T": T, "H": H, "K": K, "call": "public" if api else "direct"}
    with torch.no_grad():
        row["ms"] = timer(lambda: fwd(*args))[0]
        row["host_issue_ms"] = host_issue_ms(fwd, args, cuda, **({} if cuda else {"n": 2, "reps": 1}))  # (dry run: few)
        if cuda:
            row["graph_ms"] = graph_ms(lambda: fwd(*args), timer)
            names = kernel_names(lambda: fwd(*args))
            row["kernels"] = len(names)
            row["kernel_names"] = names
            row.update({k: v for k, v in timeline(fwd, args).items() if k in ("gpu_busy", "gaps", "sync_warnings")})
        prof = host_profile(fwd, args, cuda, profile_n) if profile_n else ""
    return row, prof


def to_markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    out = ["# Our forward's host time (`benchmarks/fwd_host_lab.py`)", "",
           f"{env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}, sha {env.get('git_sha')}; "
           f"command: `{env.get('command')}`", "",
           "| op | shape | call | bench ms | graph ms | host issue ms | kernels | GPU busy |",
           "|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        busy = f"{r['gpu_busy']:.2f}" if "gpu_busy" in r else ""
        out.append(f"| {r['op']} | {r['B']}x{r['T']} | {r.get('call', 'public')} | {r['ms']:.3f} | {r.get('graph_ms', float('nan')):.3f} | "
                   f"{r['host_issue_ms']:.3f} | {r.get('kernels', '')} | {busy} |")  # fmt: skip
    for r in rows:
        if r.get("kernel_names"):
            out += ["", f"{r['op']} {r['B']}x{r['T']} ({r.get('call', 'public')}): " + ", ".join(r["kernel_names"]), "",
                    "largest gaps (ms, before -> after): " + "; ".join(r.get("gaps", []))]  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    import torch

    from runners.bench.common import environment
    from runners.bench.kernels_grid import parse_shapes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default="gdn")
    ap.add_argument("--shapes", default="1x8192,1x16384,1x32768")
    ap.add_argument("--profile", type=int, default=20, help="cProfile over this many calls per shape (0: none)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU's plumbing check: fp32, H=1, K=V=32, T=128")
    ap.add_argument("--direct", action="store_true", help="also the op's own forward under the public op (`chunk_<op>_fwd`)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        ap.error("no CUDA device: pass --dry-run for the CPU's plumbing check")
    shapes = [(1, 128)] if args.dry_run else parse_shapes(args.shapes)
    H, K = (1, 32) if args.dry_run else (16, 128)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python3 benchmarks/fwd_host_lab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    env = environment(
        torch.device("cuda", 0) if cuda else torch.device("cpu"),
        command=command,
        cpu_label="cpu (dry run, interpreter)",
        env_vars=("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"),
    )
    rows: list[dict[str, Any]] = []
    profiles: list[str] = []
    for op in args.ops.split(","):
        for (B, T), api in ((shape, api) for shape in shapes for api in ((True, False) if args.direct else (True,))):
            row, prof = run_shape(op, B, T, H, K, cuda, 2 if args.dry_run else args.profile, api=api)
            rows.append(row)
            profiles.append(f"## {op} {B}x{T} ({row['call']})\n{prof}")
            print(json.dumps({k: v for k, v in row.items() if k != "kernel_names"}, default=str), flush=True)
            (out / "fwd_host_lab.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
            (out / "fwd_host_lab.md").write_text(to_markdown(rows, env))
            (out / "host_profile.txt").write_text("\n".join(profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
