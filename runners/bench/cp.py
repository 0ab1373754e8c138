"""GPU benchmark of the CP schemes (not a test): `cpbench bench cp --out DIR` (= `python -m runners.bench.cp`).

Runs on the engine's rank gang (`runners.gang.Gang`: W processes, NCCL, one GPU each; `--cpu` runs the same code
on gloo + the torch backend with small shapes, as a smoke test) and measures, for GDN and KDA, bf16, B = 1 single sequence, H = 16,
K = V = 128, T in {64K, 128K}:

- `none` (our kernels, whole sequence on one GPU; every rank runs it on its own GPU) and FLA's one-GPU
  forward, the baselines;
- headwise, all_gather, ring, true_cp over W = 2 GPUs, and FLA's own CP (`cp_context`) on the same inputs;
- warmup_correct on one GPU at T in {16K, 64K}, lb in {-5, -1, -0.5}, fallback in {none, exact}
  (configs split over the GPUs, one GPU each).

Method: the engine's parts. Inputs are a sweep point's (`runners.workload.make_inputs`: q, v ~ N(0,1), k
L2-normalised, beta = sigmoid(N), g = lb sigmoid(N) fp32; identical on every rank from one seed), built before
timing. Timing is `runners.timing.time_step`: at least `--warmup` untimed steps (until the first-call costs are
over), then exactly `--iters` samples with CUDA events on every rank; a sample is the max over ranks; we report
the median and p20/p80. The inputs (>= 400 MB) are far larger than L2, so no flush.
Error: `runners.correctness.rel_l2` of the unsharded output vs `none` (and vs FLA's one-GPU output). One extra
profiled step per scheme (`runners.profile.profile_step`, the worker's counter) counts collectives and host syncs.
A deadline (`--deadline`, seconds) skips what no longer fits and records it as skipped.

Results: DIR/<stem>.json (every record, plus device, versions, git sha and the command) and DIR/<stem>.md, with
<stem> = `--name`, else cp_h200 on an H200 and cp_<device> elsewhere (a `--cpu` smoke run writes cp_cpu.*, so it
never overwrites the GPU table).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

import kernels
import kernels.cp as cp
from runners.bench.common import environment, result_stem
from runners.correctness import rel_l2
from runners.gang import Gang, RankContext
from runners.profile import profile_step
from runners.timing import StopRule, time_step
from runners.workload import make_inputs

TARGETS = {"true_cp W=2 T=128K": 2.8, "warmup_correct 1 GPU T=64K lb=-5": 0.6}
PEER = "fla"


# ----------------------------------------------------------------------------------------------------------- parts
def point_inputs(op: str, T: int, H: int, K: int, V: int, lb: float, dev: torch.device, seed: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """One sequence of T tokens as a sweep point builds it (`runners.workload.make_inputs`): (q, k, v, g, beta)."""
    name = str(dtype).removeprefix("torch.")
    return make_inputs(op, B=1, T=T, H=H, K=K, V=V, lb=lb, seed=seed, dtype=name, device=dev).tensors


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_steps(step: Any, dev: torch.device, iters: int, warmup: int, *, collective: bool) -> dict[str, Any]:
    """`runners.timing.time_step` with exactly `iters` samples after at least `warmup` calls, no L2 flush; the
    median and p20/p80 in ms of the max over ranks (collective=True) or of this rank alone."""
    rule = StopRule(min_samples=iters, max_samples=iters, min_time_s=0.0, max_rel_iqr=0.0, timeout_s=600.0,
                    warmup_min_iters=max(1, warmup), flush_l2=False)
    ms = sorted(time_step(step, rule=rule, device=dev, group=dist.group.WORLD if collective else None).samples_ms)
    q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
    return {"ms": statistics.median(ms), "ms_p20": q(0.2), "ms_p80": q(0.8), "iters": len(ms)}


def profile_counts(step: Any, dev: torch.device) -> dict[str, Any]:
    """One profiled step, counted as the worker counts it: collectives by kind and host syncs."""
    p = profile_step(step, device=dev)
    return {"collectives": p.collectives, "host_syncs": p.host_syncs, "sync_events": p.sync_events}


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.time() + seconds

    def left(self) -> float:
        return self.end - time.time()


# ----------------------------------------------------------------------------------------------------------- worker
def gather_shards(o: torch.Tensor, W: int) -> list[torch.Tensor]:
    outs = [torch.empty_like(o) for _ in range(W)]
    dist.all_gather(outs, o.contiguous())
    return outs


def fla_cp_fn(op: str, T: int, dev: torch.device, group: Any) -> Any:
    from fla.ops.cp import build_cp_context

    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from fla.ops.kda import chunk_kda as fn
    cu = torch.tensor([0, T], dtype=torch.long)
    ctx = build_cp_context(cu.to(dev), group=group, cu_seqlens_cpu=cu)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return fn(q, k, v, g, beta, cp_context=ctx)[0]
    return run


def run_cp_config(op: str, T: int, *, rank: int, W: int, args: argparse.Namespace, dev: torch.device, group: Any,
                  backend: str, dtype: torch.dtype, dl: Deadline, record: Any, ours: bool) -> None:
    """`none` on each GPU, then our W-GPU schemes (ours=True) or FLA's one-GPU forward and its CP (ours=False)."""
    H, K, V = args.H, args.K, args.V
    base = {"kind": "cp", "op": op, "T": T, "H": H, "K": K, "V": V, "W": W, "dtype": str(dtype).split(".")[-1], "lb": args.lb}
    if dl.left() < args.min_left:
        record(dict(base, scheme="*", skipped="deadline"))
        return
    q, k, v, g, beta = point_inputs(op, T, H, K, V, args.lb, dev, 1000 + T, dtype)
    cu = [0, T]
    ctx1 = cp.build_context(cu, 1, 0)

    def none_step() -> torch.Tensor:
        return cp.forward("none", op, q, k, v, g, beta, group=None, ctx=ctx1, backend=backend)

    def fla_step() -> torch.Tensor:
        return kernels.forward(op, q, k, v, g, beta, backend="fla")[0]

    try:
        t0 = time.time()
        o_ref = none_step()
        sync(dev)
        first = time.time() - t0
        r = time_steps(none_step, dev, args.iters, args.warmup, collective=True)
        if ours:
            record(dict(base, scheme="none", gpus=1, first_call_s=round(first, 2), **r))
        base_ms = r["ms"]
    except Exception as e:  # noqa: BLE001
        record(dict(base, scheme="none", error=repr(e), tb=traceback.format_exc()[-1500:]))
        return
    o_fla = None
    if not ours and dl.left() > args.min_left:
        try:
            t0 = time.time()
            o_fla = fla_step()
            sync(dev)
            first = time.time() - t0
            r = time_steps(fla_step, dev, args.iters, args.warmup, collective=True)
            record(dict(base, scheme="fla_1gpu", gpus=1, first_call_s=round(first, 2), err_vs_none=rel_l2(o_fla, o_ref), **r))
        except Exception as e:  # noqa: BLE001
            record(dict(base, scheme="fla_1gpu", error=repr(e), tb=traceback.format_exc()[-1500:]))
    ctx = cp.build_context(cu, W, rank, "contiguous")
    xs = [cp.shard(x, ctx).contiguous() for x in (q, k, v, g, beta)]
    schemes: list[tuple[str, Any]] = [(m, functools.partial(cp.forward, m, op, *xs, group=group, ctx=ctx, backend=backend))
                                      for m in (args.modes if ours else ())]
    if not ours:
        try:
            schemes.append(("fla_cp", functools.partial(fla_cp_fn(op, T, dev, group), *xs)))
        except Exception as e:  # noqa: BLE001
            record(dict(base, scheme="fla_cp", error=repr(e)))
    for name, step in schemes:
        if dl.left() < args.min_left:
            record(dict(base, scheme=name, skipped="deadline"))
            continue
        rec = dict(base, scheme=name, gpus=W)
        try:
            t0 = time.time()
            o = step()
            sync(dev)
            rec["first_call_s"] = round(time.time() - t0, 2)
            shards = gather_shards(o, W)
            if rank == 0:
                full = cp.unshard(shards, ctx)
                rec["err_vs_none"] = rel_l2(full, o_ref)
                if o_fla is not None:
                    rec["err_vs_fla"] = rel_l2(full, o_fla)
            rec.update(time_steps(step, dev, args.iters, args.warmup, collective=True))
            rec["speedup_vs_none"] = base_ms / rec["ms"]
            rec["counts"] = profile_counts(step, dev)
            rec["expected_collectives"] = cp.expected_collectives(name, ctx) if name in cp.MODES else None
        except Exception as e:  # noqa: BLE001
            rec.update(error=repr(e), tb=traceback.format_exc()[-1500:])
        dist.barrier()
        record(rec)


def run_wc_config(op: str, T: int, lb: float, fb: str, *, args: argparse.Namespace, dev: torch.device, backend: str,
                  dtype: torch.dtype, dl: Deadline) -> dict[str, Any]:
    """warmup_correct on this GPU alone, against `none` and FLA on the same GPU and inputs."""
    H, K, V = args.H, args.K, args.V
    base = {"kind": "warmup_correct", "op": op, "T": T, "H": H, "K": K, "V": V, "lb": lb, "fallback": fb, "gpus": 1,
            "scheme": f"warmup_correct[{fb}]", "dtype": str(dtype).split(".")[-1]}
    if dl.left() < args.min_left:
        return dict(base, skipped="deadline")
    try:
        q, k, v, g, beta = point_inputs(op, T, H, K, V, lb, dev, 2000 + T, dtype)
        ctx1 = cp.build_context([0, T], 1, 0)
        kw = {"cu_seqlens": [0, T], "tol": args.tol, "fallback": fb, "backend": backend, "window": args.window, "segments": args.segments}

        def none_step() -> torch.Tensor:
            return cp.forward("none", op, q, k, v, g, beta, group=None, ctx=ctx1, backend=backend)

        def wc_step() -> tuple[torch.Tensor, Any]:
            return cp.warmup_correct(op, q, k, v, g, beta, **kw)

        o_ref = none_step()
        none_r = time_steps(none_step, dev, args.iters, args.warmup, collective=False)
        t0 = time.time()
        o, rep = wc_step()
        sync(dev)
        first = time.time() - t0
        r = time_steps(wc_step, dev, args.iters, args.warmup, collective=False)
        rec = dict(base, first_call_s=round(first, 2), none_ms=none_r["ms"], speedup_vs_none=none_r["ms"] / r["ms"],
                   err_vs_none=rel_l2(o, o_ref), report=rep.to_dict(), **r)
        rec["report"].pop("segment_bounds", None)
        rec["report"]["window"] = sorted(set(rec["report"]["window"]))
        rec["counts"] = profile_counts(wc_step, dev)
        return rec
    except Exception as e:  # noqa: BLE001
        return dict(base, error=repr(e), tb=traceback.format_exc()[-1500:])
    finally:
        if dev.type == "cuda":
            torch.cuda.empty_cache()



def rank_job(rc: RankContext, args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """One rank's share of the run (a `Gang` job): every record on rank 0 (the others return None)."""
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    rank, W, dev = rc.rank, rc.world_size, rc.device
    if args.cpu:
        torch.set_num_threads(1)
    group = dist.group.WORLD
    backend = "torch" if args.cpu else "auto"
    dtype = torch.float32 if args.cpu else torch.bfloat16
    dl = Deadline(args.deadline)
    recs: list[dict[str, Any]] = []

    def log(*a: Any) -> None:
        if rank == 0:
            print(f"[{time.strftime('%H:%M:%S')} left {dl.left():.0f}s]", *a, flush=True)

    def record(rec: dict[str, Any]) -> None:
        recs.append(rec)
        if rank == 0:
            log(json.dumps({k: v for k, v in rec.items() if k not in ("counts",)}))

    # priority order under the deadline: our W-GPU schemes (largest T first), then warmup_correct (the target
    # config first; one GPU each, configs spread over the GPUs), then the FLA peers (their autotune is slow)
    cp_cfgs = [(op, T) for T in sorted(args.T, reverse=True) for op in args.ops]
    for op, T in cp_cfgs:
        run_cp_config(op, T, rank=rank, W=W, args=args, dev=dev, group=group, backend=backend, dtype=dtype, dl=dl,
                      record=record, ours=True)
    wc = [(op, T, lb, fb) for T in args.wc_T for op in args.ops for lb in args.wc_lb for fb in args.wc_fallback]
    wc.sort(key=lambda c: (c[1] != 65536 or c[2] != -5.0, -c[1]))
    for op, T, lb, fb in wc[rank::W]:
        recs.append(run_wc_config(op, T, lb, fb, args=args, dev=dev, backend=backend, dtype=dtype, dl=dl))
    dist.barrier()
    if not args.cpu and not args.no_fla:
        for op, T in cp_cfgs:
            run_cp_config(op, T, rank=rank, W=W, args=args, dev=dev, group=group, backend=backend, dtype=dtype, dl=dl,
                          record=record, ours=False)

    allrecs: list[Any] = [None] * W
    dist.all_gather_object(allrecs, recs)
    if rank == 0:
        merged = recs + [r for rr in allrecs[1:] for r in rr if r.get("kind") == "warmup_correct"]
        fla1 = {(r["op"], r["T"]): r["ms"] for r in merged if r.get("scheme") == "fla_1gpu" and "ms" in r}
        for r in merged:   # FLA's one-GPU time on the same shape (its speed does not depend on the gate values)
            if r.get("kind") == "warmup_correct" and "ms" in r and (r["op"], r["T"]) in fla1:
                r["fla_1gpu_ms"] = fla1[(r["op"], r["T"])]
                r["speedup_vs_fla"] = r["fla_1gpu_ms"] / r["ms"]
        return merged
    return None


# ----------------------------------------------------------------------------------------------------------- output
def fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.{nd}g}" if abs(x) < 1e-2 else f"{x:.{nd}f}"
    return str(x)


def method_line(args: argparse.Namespace) -> str:
    """The report's method, as this run measured: CUDA events and bf16 on GPUs; the wall clock and fp32 with `--cpu`
    (gloo ranks, the torch backend)."""
    clock, dtype = ("the wall clock", "fp32") if args.cpu else ("CUDA events", "bf16")
    where = "gloo ranks on the CPU, the torch backend (a smoke test)" if args.cpu else "one GPU per rank"
    return (f"Method: the engine's timer (runners.timing.time_step: {clock}, a sample = max over ranks, no L2 flush); "
            f"median (p20-p80) of {args.iters} samples after at least {args.warmup} warm-up steps; {where}. B=1, one "
            f"sequence, {dtype} inputs, fp32 g. Collectives and host syncs of rank 0 from the worker's profiler "
            "(runners.profile).")


def write_results(recs: list[dict[str, Any]], args: argparse.Namespace, dev: torch.device) -> None:
    env = environment(dev, command=args.command or " ".join(sys.argv), sha=args.git_sha,
                      cpu_label="cpu (smoke test, gloo + torch backend)",
                      env_vars=("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"))
    os.makedirs(args.out, exist_ok=True)
    stem = result_stem("cp", args.name, "cpu" if args.cpu else env.get("device"))
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"environment": env, "targets_ms": TARGETS, "records": recs}, f, indent=1, default=str)
    lines = [f"# CP schemes on {env.get('device')}", "",
             f"{env['date']} · torch {env['torch']} · triton {env.get('triton')} · NCCL {env.get('nccl')} · "
             f"driver {env.get('driver')} · fla {env.get('fla')} · git {env['git_sha']}", "",
             f"Command: `{env['command']}`", "",
             method_line(args),
             "", "## W-GPU schemes (forward)", "",
             "| op | T | scheme | GPUs | ms (p20-p80) | x vs none | err vs none | collectives | host syncs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        if r.get("kind") != "cp":
            continue
        if "ms" not in r:
            lines.append(f"| {r['op']} | {r['T']} | {r.get('scheme')} | | {r.get('skipped') or r.get('error', '')[:80]} "
                         "| | | | |")
            continue
        c = r.get("counts", {})
        coll = ", ".join(f"{k} {v}" for k, v in c.get("collectives", {}).items()) or "0"
        syncs = str(c.get("host_syncs", ""))
        lines.append(f"| {r['op']} | {r['T']} | {r['scheme']} | {r.get('gpus', '')} | {fmt(r['ms'])} ({fmt(r['ms_p20'])}-"
                     f"{fmt(r['ms_p80'])}) | {fmt(r.get('speedup_vs_none'), 2)} | {fmt(r.get('err_vs_none'))} | {coll} | "
                     f"{syncs if 'counts' in r else ''} |")
    lines += ["", "## warmup_correct on one GPU", "",
              "| op | T | lb | fallback | ms | none ms | x vs none | FLA 1-GPU ms | x vs FLA | err vs none | segments "
              "| window | fallback_count | violations | max bound | host syncs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in recs if r.get("kind") == "warmup_correct"), key=lambda r: (r["op"], r["T"], r["lb"], r["fallback"])):
        if "ms" not in r:
            lines.append(f"| {r['op']} | {r['T']} | {r['lb']} | {r['fallback']} | {r.get('skipped') or r.get('error', '')[:80]} "
                         "| | | | | | | | | | | |")
            continue
        rep, c = r["report"], r.get("counts", {})
        lines.append(f"| {r['op']} | {r['T']} | {r['lb']} | {r['fallback']} | {fmt(r['ms'])} | {fmt(r['none_ms'])} | "
                     f"{fmt(r['speedup_vs_none'], 2)} | {fmt(r.get('fla_1gpu_ms'))} | {fmt(r.get('speedup_vs_fla'), 2)} | "
                     f"{fmt(r['err_vs_none'])} | {rep['segments']} | {rep['window']} | {rep['fallback_count']} | "
                     f"{rep['violations']} | {fmt(rep['max_bound'])} | {c.get('host_syncs', '')} |")
    lines += ["", "## Targets", ""]
    if args.cpu:
        lines.append("- not judged: the targets are GPU figures (W=2 H200 at T=128K; one H200 at T=64K), this was a --cpu run")
    for name, target in ({} if args.cpu else TARGETS).items():
        if name.startswith("true_cp"):
            got = [r for r in recs if r.get("kind") == "cp" and r.get("scheme") == "true_cp" and r["T"] == 131072 and "ms" in r]
        else:
            got = [r for r in recs if r.get("kind") == "warmup_correct" and r["T"] == 65536 and r["lb"] == -5.0 and "ms" in r]
        vals = ", ".join(f"{r['op']}{'/' + r['fallback'] if 'fallback' in r else ''} {fmt(r['ms'])} ms "
                         f"({'met' if r['ms'] <= target else 'missed'})" for r in got) or "not measured"
        lines.append(f"- {name} <= {target} ms: {vals}")
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


# ----------------------------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cpbench bench cp", description=__doc__.split("\n")[0])
    csv = lambda f: lambda s: [f(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--name", default=None, help="file stem of the results (default: cp_h200 on an H200, cp_<device> elsewhere)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--ops", type=csv(str), default=["gdn", "kda"])
    p.add_argument("--T", type=csv(int), default=[65536, 131072])
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--lb", type=float, default=-1.0, help="gate lower bound of the W-GPU runs")
    p.add_argument("--modes", type=csv(str), default=["headwise", "all_gather", "ring", "true_cp", "tail_exchange"])
    p.add_argument("--wc-T", type=csv(int), default=[16384, 65536])
    p.add_argument("--wc-lb", type=csv(float), default=[-5.0, -1.0, -0.5])
    p.add_argument("--wc-fallback", type=csv(str), default=["auto", "none", "exact"])
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--window", default="auto", type=lambda s: s if s == "auto" else int(s))
    p.add_argument("--segments", default="auto", type=lambda s: s if s == "auto" else int(s))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--deadline", type=float, default=480.0, help="seconds for the whole run; later items are skipped")
    p.add_argument("--min-left", type=float, default=15.0)
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--cpu", action="store_true", help="smoke test on CPU: gloo, torch backend, fp32")
    p.add_argument("--git-sha", default=None)
    p.add_argument("--command", default=None, help="the command line to record (default: this process's argv)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    if args.cpu:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    elif torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world {args.world} needs {args.world} GPUs, found {torch.cuda.device_count()}")
    gang = Gang(args.world, device_kind="cpu" if args.cpu else "cuda", pg_timeout_s=600.0)
    try:
        recs = gang.run(rank_job, args, timeout_s=args.deadline + 600.0)[0]
    finally:
        gang.close()
    write_results(recs, args, torch.device("cpu") if args.cpu else torch.device("cuda", 0))


if __name__ == "__main__":
    main()
