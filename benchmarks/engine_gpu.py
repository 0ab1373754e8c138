"""Engine checks on a GPU (not a test): harness honesty, CUDA rank gangs, profiles of real points.

    python benchmarks/engine_gpu.py [--out DIR] [--world 1|2]

1. Harness honesty (issue 4 target: within 2%): for fixed kernel calls (GDN and KDA forwards, triton backend,
   B=1, T=32768, H=16, K=V=128, bf16; a bf16 8192^3 matmul as a control), the median of `runners.timing.time_step`
   (CUDA events, L2 flush of 2x the L2 size, warmup, stop rule) against `triton.testing.do_bench(...,
   return_mode="median")` in the same process, alternated over 3 rounds.
2. A CUDA gang of `--world` ranks (NCCL): cold start (spawn + init_process_group) and the warm round trip of a
   trivial job.
3. `runners.execute.run_point_job` on that gang for every mode that runs at that W, GDN and KDA, triton backend,
   B=1, T=8192, H=16, K=V=128, bf16: correctness errors, timing summary, profile (collectives vs kernels.cp's
   expectation, host syncs, kernel launches, peak memory); one Chrome trace is written to --out.
4. The profiler's host-sync count for `.item()` and `.cpu()` on a CUDA tensor (one each).
Needs only torch, triton and this repo (no database).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def trivial(ctx: Any, payload: Any) -> int:
    import torch.distributed as dist

    t = torch.ones(1, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return int(t.item())


def _inputs(op: str, T: int, H: int = 16, K: int = 128, V: int = 128) -> tuple[torch.Tensor, ...]:
    from runners.point import PointSpec
    from runners.workload import make_workload

    wl = make_workload(PointSpec(op, "none", "triton", B=1, T=T, H=H, K=K, V=V, lb=-1.0, dtype="bfloat16", seed=0),
                       device="cuda")
    return wl.tensors


def honesty(lines: list[str], rounds: int = 3) -> None:
    import triton.testing

    import kernels
    from runners.timing import L2Flush, StopRule, time_step

    dev = torch.device("cuda", 0)
    flush = L2Flush(dev)
    rule = StopRule(min_samples=50, max_samples=400, min_time_s=1.0, max_rel_iqr=0.01, timeout_s=20.0)
    calls = {}
    for op in ("gdn", "kda"):
        args = _inputs(op, 32768)
        calls[f"{op} forward triton T=32768"] = (lambda a=args, o=op: kernels.forward(o, *a, backend="triton"))
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    calls["matmul bf16 8192^3"] = lambda: a @ b
    lines.append(f"## harness honesty (L2 flush {flush.nbytes >> 20} MiB; do_bench flushes 256 MiB)")
    lines.append("| call | round | time_step median ms (n, stop) | do_bench median ms | ratio |")
    lines.append("|---|---|---|---|---|")
    for name, fn in calls.items():
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - report and go on
            lines.append(f"| {name} | - | failed: {type(err).__name__}: {str(err)[:200]} | | |")
            continue
        ratios = []
        for rnd in range(rounds):
            res = time_step(fn, rule=rule, device=dev, flush=flush)
            mine = statistics.median(res.samples_ms)
            theirs = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
            ratios.append(mine / theirs)
            lines.append(f"| {name} | {rnd} | {mine:.4f} ({len(res.samples_ms)}, {res.stop_reason}) | {theirs:.4f} | {mine / theirs:.4f} |")
        lines.append(f"| {name} | all | | | median ratio {statistics.median(ratios):.4f} |")


def points(world: int, out: Path, lines: list[str], ops: tuple[str, ...] = ("gdn", "kda")) -> None:
    from runners.execute import run_point_job
    from runners.gang import Gang
    from runners.point import PointJob, PointSpec

    gang = Gang(world, device_kind="cuda", start_timeout_s=300)
    t0 = time.perf_counter()
    gang.start()
    cold = time.perf_counter() - t0
    lat = []
    for _ in range(20):
        t = time.perf_counter()
        gang.run(trivial, None, timeout_s=60)
        lat.append((time.perf_counter() - t) * 1e3)
    lines.append(f"## CUDA gang W={world}")
    lines.append(f"cold start (spawn + NCCL init) {cold:.2f} s; warm trivial job round trip median {statistics.median(lat):.2f} ms, "
                 f"max {max(lat):.2f} ms (n=20)")
    modes = ["none", "warmup_correct", "all_gather", "true_cp", "ring", "headwise"] if world == 1 else \
        ["all_gather", "true_cp", "ring", "headwise"]
    options = {"timing": {"min_samples": 10, "max_samples": 100, "min_time_s": 0.2, "max_rel_iqr": 0.02, "timeout_s": 5.0},
               "check": {"reference_tokens": 256}, "profile": True}
    lines.append("| op | mode | W | err/none | err/ref | median ms | n | stop | collectives | expected | syncs | sync events | launches | peak MiB | wall s |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for op in ops:
        for mode in modes:
            wc = {"segments": "auto", "tol": 1e-3, "window": "auto", "fallback": "exact"} if mode == "warmup_correct" else {}
            point = PointSpec(op, mode, "triton", B=1, T=8192, H=16, K=128, V=128, lb=-1.0, W=world, layout="contiguous",
                              direction="fwd", dtype="bfloat16", seed=0, rep=0, mode_options=wc)
            trace = out / f"trace_{op}_{mode}_W{world}.json.gz" if (op, mode) == ("gdn", modes[-1]) else None
            t = time.perf_counter()
            try:
                res = gang.run(run_point_job, PointJob(point, options, str(trace) if trace else None), timeout_s=400)
            except Exception as err:  # noqa: BLE001 - report and go on
                lines.append(f"| {op} | {mode} | {world} | failed: {type(err).__name__}: {str(err).splitlines()[0][:300]} |")
                continue
            wall = time.perf_counter() - t
            r0 = res[0]
            if not r0.ok:
                lines.append(f"| {op} | {mode} | {world} | gate failed: {(r0.error or '')[:300]} |")
                continue
            g, tm, p = r0.gate, r0.timing, r0.profile
            exp = r0.expected_collectives
            lines.append(
                f"| {op} | {mode} | {world} | {g['err_vs_none']:.2e} | {g['err_vs_reference']:.2e} | "
                f"{statistics.median(tm['samples_ms']):.4f} | {len(tm['samples_ms'])} | {tm['stop_reason']} | {p['collectives']} | {exp} | "
                f"{p['host_syncs']} | {p['sync_events']} | {p['kernel_launches']} | "
                f"{(p['peak_memory_bytes'] or 0) / 2**20:.0f} | {wall:.1f} |"
            )
    gang.close()


def syncs(lines: list[str]) -> None:
    from runners.profile import profile_step

    dev = torch.device("cuda", 0)
    x = torch.randn(1024, device=dev)
    lines.append("## host syncs on CUDA")
    for name, fn in (("x.sum().item()", lambda: x.sum().item()), ("x.cpu()", lambda: x.cpu()), ("x * 2", lambda: x * 2)):
        fn()
        p = profile_step(fn, device=dev)
        lines.append(f"- `{name}`: host_syncs={p.host_syncs}, sync_events={p.sync_events}, kernel_launches={p.kernel_launches}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--skip-honesty", action="store_true")
    ap.add_argument("--ops", default="gdn,kda", help="ops of the point runs, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="harness-honesty rounds per call")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# engine_gpu W={args.world}: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, torch {torch.__version__}, "
             f"CUDA {torch.version.cuda}"]
    shown = 0
    for step in (("honesty", lambda: None if args.skip_honesty else honesty(lines, args.rounds)), ("syncs", lambda: syncs(lines)),
                 ("points", lambda: points(args.world, out, lines, tuple(args.ops.split(","))))):
        t = time.perf_counter()
        try:
            step[1]()
        except Exception as err:  # noqa: BLE001 - keep what the other steps found
            lines.append(f"{step[0]} failed: {type(err).__name__}: {err}")
        lines.append(f"({step[0]}: {time.perf_counter() - t:.1f} s)")
        (out / "engine_gpu.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines[shown:]), flush=True)
        shown = len(lines)


if __name__ == "__main__":
    main()
