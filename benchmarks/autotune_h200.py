"""Tune the GDN and KDA kernels (forward; backward with `--directions fwd fwd+bwd`) on an H200 and report default vs
tuned, per kernel, shape and direction (issues 5 and 11).

Two steps, because the GPU machine has no database:

    # on the GPU (device tool; SQLAlchemy carried as a wheel): tune, then time the whole forward default vs tuned
    python benchmarks/autotune_h200.py run --out $OUT/autotune_run.json [--budget 9] [--deadline-s 240]
        [--directions fwd fwd+bwd]
    # here: store the trials and winners in SQLite, export the autotune JSON, write the Markdown table
    python benchmarks/autotune_h200.py import RUN.json --json benchmarks/results/autotune_h200.json \
        --md benchmarks/results/autotune_h200.md [--db sqlite:///...]

Method (run): shapes bf16, H=16, K=V=128: B=1 T=8K, B=1 T=64K, B=8 T=8K. For each op and shape,
`runners.tuner.tune_case` tunes every Triton kernel the forward launches, in launch order (coordinate descent),
with successive halving (first rung: the default, the kernel's `hints` and random configs of the space up to
`budget`, 5 samples each; survivors x3 samples per rung, up to 45; CUDA events, L2 flushed before every sample, warmup first).
Every trial is checked against the default config's outputs (relative L2 <= 2e-2) before it is timed. Then
the whole forward is timed with all defaults vs all winners, interleaved A/B in 5 blocks of 20 samples, and
the medians are reported. A deadline stops new searches so the run fits the device lease. A device crash in a
search (CUDA error) records the culprit in "crashed" and the run resumes in a fresh process (`--restarts`).
Direction fwd+bwd: the kernels only the backward launches (what the training step launches beyond the forward's)
are tuned on the whole step (forward + `o.backward(do)`, `runners.tuner.tune.op_runner`); the forward's kernels
keep their forward winners; the A/B then times the whole step.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [
    {"B": 1, "T": 8192, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"},
    {"B": 1, "T": 65536, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"},
    {"B": 8, "T": 8192, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"},
]


def _shape_name(s: dict[str, Any]) -> str:
    return f"B={s['B']} T={s['T'] // 1024}K"


def cmd_run(args: argparse.Namespace) -> None:
    import torch
    import triton

    from kernels.configs import KERNELS, LaunchConfig
    from runners.tuner import TuneSpec, TuningStopped
    from runners.tuner.clock import StepTimer
    from runners.tuner.trials import is_device_crash
    from runners.tuner.tune import Shape, make_case, op_runner, tune_case
    from runners.versions import driver_version, git_sha

    global SHAPES
    if args.shapes:
        SHAPES = [{**SHAPES[0], "B": int(b), "T": int(t)} for b, t in (x.split("x") for x in args.shapes.split(","))]
    if args.tiny:  # a CPU dry run of the script itself (TRITON_INTERPRET=1), not a measurement
        SHAPES = [{"B": 1, "T": 128, "H": 1, "K": 16, "V": 32, "dtype": "float32"}, {"B": 1, "T": 192, "H": 1, "K": 16, "V": 32, "dtype": "float32"},
                  {"B": 2, "T": 64, "H": 1, "K": 16, "V": 32, "dtype": "float32"}]
    t_start = time.perf_counter()
    partial = json.loads(Path(args.partial).read_text()) if args.partial else None
    if partial is not None:  # a restart after a device crash: the time spent so far counts against the deadline
        t_start -= partial["env"]["elapsed_s"]
        bad = partial["crashed"]
    else:
        bad = [_parse_bad(b) for b in args.known_bad]
        bad += _precompile(args, until=t_start + args.deadline_s / 2) if args.workers > 0 else []
    dev = args.device
    timer = StepTimer(dev)
    cuda = dev == "cuda"
    out: dict[str, Any] = partial or {
        "env": {"device": torch.cuda.get_device_name() if cuda else "cpu",
                "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability()) if cuda else None,
                "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
                "driver": driver_version(), "git_sha": args.sha or git_sha(), "command": " ".join(sys.argv),
                "started_at": datetime.now(timezone.utc).isoformat()},
        "trials": [], "tuned": [], "ops": [], "crashed": bad,
    }  # out["crashed"] is `bad`: a crash found in the search below joins it
    for direction, op, sd in ((d, op, sd) for d in args.directions for op in args.ops for sd in SHAPES):
        if any(o["op"] == op and o["shape"] == sd and o["direction"] == direction for o in out["ops"]):
            continue  # done before a restart
        left = args.deadline_s - (time.perf_counter() - t_start)
        if left < 20:
            print(f"deadline: skipping {op} {_shape_name(sd)} {direction}", flush=True)
            continue
        shape = Shape.of(sd)
        case = make_case(op, shape, dev)
        run = op_runner(op, case, direction=direction)
        tuned_here = tuned_kernels(op, case, direction)
        t0 = time.perf_counter()
        known_bad: dict[str, dict[LaunchConfig, str]] = {}
        for b_op, b_kernel, b_cfg, b_err in bad:
            if b_op == op:
                known_bad.setdefault(b_kernel, {})[LaunchConfig.from_dict(b_cfg)] = f"crashed the device earlier in this run: {b_err}"
        spec = TuneSpec(kernels=tuple(tuned_here) if tuned_here is not None else None, strategy="halving",
                        budget=args.budget, seed=args.seed, min_samples=5, max_samples=45, eta=3, tol=2e-2)
        try:
            result = tune_case(run, device=dev, spec=spec, timer=timer, known_bad=known_bad)
        except Exception as e:  # a CUDA error poisons this process: record the culprit, let the parent restart
            last, crash = (e.result.trial_rows(), e.error) if isinstance(e, TuningStopped) else ([], e)
            if not (last and last[-1]["status"] == "failed" and is_device_crash(crash)):
                raise
            culprit = (op, last[-1]["kernel"], last[-1]["config"], f"{type(crash).__name__}: {str(crash).splitlines()[0]} (in the search)")
            bad.append(culprit)
            out["env"]["elapsed_s"] = time.perf_counter() - t_start
            Path(args.out).write_text(json.dumps(out, indent=1, default=str))
            print(f"device crash: {culprit}; this case restarts in a fresh process", flush=True)
            raise SystemExit(CRASH_EXIT) from e
        t_tune = time.perf_counter() - t0
        for t in result.trial_rows():
            out["trials"].append({"op": op, "shape": sd, "direction": direction, "kernel": t["kernel"], "key": t["key"],
                                  **{k: t[k] for k in ("config", "strategy", "rung", "status", "median_ms", "n", "error")}})
        rows = result.tuned_rows()
        for r in rows:
            out["tuned"].append({"op": op, "shape": sd, "direction": direction, "kernel": r.kernel, "key": r.key, "key_str": r.key_str,
                                 "device_name": r.device_name, "compute_capability": r.compute_capability,
                                 "config": r.config, "median_ms": r.median_ms, "default_ms": r.default_ms,
                                 "runner_up_ms": r.runner_up_ms, "source_hash": r.source_hash})
        defaults = {n: s.default for n, s in KERNELS.items()}
        # the step A/B keeps the forward's winners of this op and shape on both sides
        fwd_won = {t["kernel"]: LaunchConfig.from_dict(t["config"]) for t in out["tuned"]
                   if t["op"] == op and t["shape"] == sd and t["direction"] == "fwd"}
        defaults = {**defaults, **fwd_won} if direction != "fwd" else defaults
        tuned = {**defaults, **{r.kernel: LaunchConfig.from_dict(r.config) for r in rows}}
        ma, mb = _ab(timer, run, defaults, tuned, *((1, 3) if args.tiny else ()))
        out["ops"].append({"op": op, "shape": sd, "direction": direction, "default_ms": ma, "tuned_ms": mb, "speedup": ma / mb, "tune_s": t_tune,
                           "n_trials": len(result.trial_rows()),
                           "tuned": {r.kernel: r.config for r in rows if r.config != KERNELS[r.kernel].default.as_dict()}})
        print(f"{op} {_shape_name(sd)} {direction}: default {ma:.4f} ms, tuned {mb:.4f} ms ({ma / mb:.3f}x), tuning {t_tune:.1f} s, "
              f"{out['ops'][-1]['n_trials']} trials", flush=True)
        out["env"]["elapsed_s"] = time.perf_counter() - t_start
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))  # partial results survive a kill
        del case, run
        if cuda:
            torch.cuda.empty_cache()
    out["env"]["elapsed_s"] = time.perf_counter() - t_start
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out} in {out['env']['elapsed_s']:.1f} s")


def tuned_kernels(op: str, case: dict[str, Any], direction: str) -> list[str] | None:
    """The kernels a direction tunes: None (all the forward launches) for fwd; for fwd+bwd those the training step
    launches beyond the forward's (the backward's own), in launch order."""
    from kernels.plan import LaunchPlan, LaunchRecorder
    from runners.tuner.tune import op_runner

    if direction == "fwd":
        return None
    forward, step = LaunchRecorder(), LaunchRecorder()
    op_runner(op, case)(LaunchPlan(recorder=forward))
    op_runner(op, case, direction=direction)(LaunchPlan(recorder=step))
    return [n for n in step if n not in forward]


def _precompile_worker(task: tuple[str, dict[str, Any], list[tuple[str, dict[str, int]]], str]) -> dict[str, Any]:
    """Run the op once per (kernel, config), synchronising after each: compiles into the shared Triton cache.

    A CUDA error (e.g. an illegal address) poisons this process: it returns the culprit and the items it did
    not reach, and the parent retries those in a fresh process.
    """
    import torch

    from kernels.configs import LaunchConfig
    from kernels.plan import LaunchPlan
    from runners.tuner.tune import Shape, make_case, op_runner

    op, sd, items, dev, direction = task
    run = op_runner(op, make_case(op, Shape.of(sd), dev), direction=direction)
    ok = 0
    for i, (kernel, cfg) in enumerate(items):
        try:
            run(LaunchPlan(configs={kernel: LaunchConfig.from_dict(cfg)}))
            if dev == "cuda":
                torch.cuda.synchronize()
            ok += 1
        except Exception as e:  # noqa: BLE001 - invalid configs are the search's business; CUDA errors are reported
            if "CUDA error" in str(e) or type(e).__name__ == "AcceleratorError":
                return {"ok": ok, "bad": (op, kernel, cfg, f"{type(e).__name__}: {str(e).splitlines()[0]}"),
                        "rest": (op, sd, items[i + 1:], dev, direction)}
    return {"ok": ok, "bad": None, "rest": None}


def _precompile(args: argparse.Namespace, until: float) -> list[tuple[str, str, dict[str, int], str]]:
    """Compile the configs halving's first rung will draw, in parallel processes sharing Triton's disk cache.

    Compiling ~100 kernel variants one after another would take minutes of the device lease; the search then
    finds them in the cache. Every shape is probed, although shapes that differ only in T share compiled
    kernels (T is not specialised): a config that ran at T=8K crashed the device at T=64K (H200, 2026-11-30).
    Stops at `until` (perf_counter; half the run's deadline): what was compiled stays in the cache, the rest
    compiles during the search (a fwd+bwd precompile of 94 variants took 164 s on the H200 and once used up a
    whole deadline). Returns the configs that crashed the device.
    """
    import multiprocessing as mp

    from runners.tuner.tune import device_facts

    t0 = time.perf_counter()
    tasks = _precompile_tasks(args, device_facts(args.device)[1])
    bad: list[tuple[str, str, dict[str, int], str]] = []
    done = 0
    ctx = mp.get_context("spawn")
    while tasks:
        # a fresh process per task: one that met a CUDA error cannot be reused
        with ctx.Pool(min(args.workers, len(tasks)), maxtasksperchild=1) as pool:
            pending = pool.map_async(_precompile_worker, tasks, chunksize=1)
            pending.wait(max(0.0, until - time.perf_counter()))
            if not pending.ready():
                pool.terminate()
                print(f"precompile stopped at half the deadline ({time.perf_counter() - t0:.1f} s); the remaining "
                      "variants compile during the search", flush=True)
                return bad
            res = pending.get()
        done += sum(r["ok"] for r in res)
        bad += [r["bad"] for r in res if r["bad"]]
        tasks = [r["rest"] for r in res if r["rest"] and r["rest"][2]]
    print(f"precompiled {done} variants in {time.perf_counter() - t0:.1f} s; crashed: {bad}", flush=True)
    return bad


def _precompile_tasks(args: argparse.Namespace, capability: str | None,
                      triton_version: str | None = None) -> list[tuple[str, dict[str, Any], list[tuple[str, dict[str, int]]], str, str]]:
    """The precompile's work, split over `args.workers`: per (direction, op, shape), the configs halving's first rung
    draws for each kernel the case tunes, less those a miscompile rule rules out on `capability` (never launched,
    not even here; `known_bad` expands the rules over every kernel of the build: before session 16 it read only the
    modules imported so far, and on the H200 the precompile launched `chunk_state_fwd` and `wy_bwd` configs their
    rules name and crashed the device)."""
    from kernels.configs import KERNELS
    from kernels.plan import LaunchPlan, LaunchRecorder
    from runners.tuner.miscompiles import known_bad as known_bad_configs
    from runners.tuner.search import first_rung
    from runners.tuner.tune import Shape, make_case, op_runner

    ruled_out = known_bad_configs(capability, triton_version)
    tasks = []
    for direction, op, sd in ((d, op, sd) for d in args.directions for op in args.ops for sd in SHAPES):
        case = make_case(op, Shape.of(sd), args.device)
        run = op_runner(op, case, direction=direction)
        only = tuned_kernels(op, case, direction)
        run(LaunchPlan())
        seen = LaunchRecorder()
        run(LaunchPlan(configs={n: sp.default for n, sp in KERNELS.items()}, recorder=seen))
        items = [(n, c.as_dict()) for n, (_k, d) in seen.items() if KERNELS[n].space
                 and (only is None or n in only)
                 for c in first_rung(KERNELS[n], d, args.budget, args.seed)[1:] if c not in ruled_out.get(n, {})]
        per = max(1, -(-len(items) // args.workers))
        tasks += [(op, sd, items[i:i + per], args.device, direction) for i in range(0, len(items), per)]
    return tasks


def _parse_bad(text: str) -> tuple[str, str, dict[str, int], str]:
    """"gdn:chunk_state_output_fwd:BV=32,num_warps=4,num_stages=1" -> a known crasher (skipped, recorded failed)."""
    op, kernel, cfg = text.split(":", 2)
    return op, kernel, {k: int(v) for k, v in (p.split("=") for p in cfg.split(","))}, "known to crash the device (--known-bad)"


def _ab(timer: Any, run: Any, a_cfg: dict[str, Any], b_cfg: dict[str, Any], blocks: int = 5, n: int = 20) -> tuple[float, float]:
    """Medians of the whole forward with configs A vs B, interleaved in blocks (drift hits both alike)."""
    import statistics

    from kernels.plan import LaunchPlan

    a: list[float] = []
    b: list[float] = []
    plan_a, plan_b = LaunchPlan(configs=a_cfg), LaunchPlan(configs=b_cfg)
    for _ in range(blocks):
        a += timer(lambda: run(plan_a), n)
        b += timer(lambda: run(plan_b), n)
    return statistics.median(a), statistics.median(b)


def cmd_import(args: argparse.Namespace) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from db import crud
    from db.base import Base
    from runners.tuner.export import write_export

    run = merge_runs([json.loads(Path(f).read_text()) for f in args.run], sha=args.sha)
    env = run["env"]
    engine = create_engine(args.db)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        e = crud.get_or_create_environment(session, facts={
            "device_name": env["device"], "device_count": 1, "compute_capability": env["compute_capability"],
            "driver": env["driver"], "torch": env["torch"], "triton": env["triton"], "python": env["python"],
            "cpbench": "0.1.0", "git_sha": env["git_sha"], "host": "device-h200"})
        for t in run["trials"]:
            crud.store_trial(session, environment_id=e.id, device_name=env["device"], kernel=t["kernel"], key=t["key"],
                             key_str=_key_str(t["key"]), config=t["config"], strategy=t["strategy"], rung=t["rung"],
                             status=t["status"], median_ms=t["median_ms"], n=t["n"], error=t["error"])
        # one entry per (kernel, key): when several shapes share a key, keep the winner of the largest default time
        # (the shape where the kernel matters most); every shape's winner is in the Markdown table
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for r in run["tuned"]:
            k = (r["kernel"], r["key_str"])
            if k not in best or (r["default_ms"] or 0) > (best[k]["default_ms"] or 0):
                best[k] = r
        for r in best.values():
            crud.upsert_tuned_config(session, kernel=r["kernel"], key=r["key"], key_str=r["key_str"], device_name=r["device_name"],
                                     compute_capability=r["compute_capability"], config=r["config"], median_ms=r["median_ms"],
                                     default_ms=r["default_ms"], runner_up_ms=r["runner_up_ms"], source_hash=r["source_hash"],
                                     sweep_id=None, environment_id=e.id)
        session.commit()
        data = write_export(args.json, session, device_name=env["device"], allow_cpu=args.allow_cpu)
    Path(args.md).write_text(_markdown(run, data, args))
    print(f"wrote {args.json} ({sum(len(k['entries']) for k in data['kernels'].values())} entries) and {args.md}")


def merge_runs(runs: list[dict[str, Any]], sha: str | None = None) -> dict[str, Any]:
    """One run from several device runs of the same kernels (e.g. per op or direction, or a larger budget on some
    shapes).

    Every trial is kept. Per (op, shape, direction), the run whose whole-op A/B speedup is largest supplies the
    `ops` row and the tuned entries; the others' winners stay in the trials. "The same kernels": every kernel tuned
    in several runs has one source hash across them (a kernel's tuned entry is valid for its source only), so runs
    made at different commits merge when the kernels they share did not change; otherwise they are refused.
    sha: the code's git sha, for runs that did not record one (a run that recorded one keeps it).
    """
    if not runs:
        raise ValueError("no run files given")
    for r in runs:
        if r["env"].get("git_sha") is None:
            r["env"]["git_sha"] = sha
        # nvidia-smi prints one line per GPU
        r["env"]["driver"] = str(r["env"].get("driver") or "").splitlines()[0] if r["env"].get("driver") else None
    hashes: dict[str, set[str]] = {}
    for r in runs:
        for t in r["tuned"]:
            hashes.setdefault(t["kernel"], set()).add(t["source_hash"])
    changed = sorted(k for k, h in hashes.items() if len(h) > 1)
    shas = sorted({str(r["env"]["git_sha"]) for r in runs})
    if changed:
        raise ValueError(f"runs of different code cannot be merged: kernel(s) {', '.join(changed)} changed between "
                         f"them (git shas {shas})")
    best: dict[tuple[str, str], tuple[float, int]] = {}
    for i, r in enumerate(runs):
        for o in r["ops"]:
            k = (o["op"], _shape_name(o["shape"]), o.get("direction", "fwd"))
            if k not in best or o["speedup"] > best[k][0]:
                best[k] = (o["speedup"], i)
    env = dict(runs[0]["env"])
    env["git_shas"] = list(dict.fromkeys(str(r["env"]["git_sha"]) for r in runs))  # every commit, in run order
    env["command"] = " ; ".join(r["env"]["command"] for r in runs)
    env["elapsed_s"] = sum(r["env"]["elapsed_s"] for r in runs)
    env["started_at"] = min(r["env"]["started_at"] for r in runs)

    def chosen(i: int, row: dict[str, Any]) -> bool:
        return best.get((row["op"], _shape_name(row["shape"]), row.get("direction", "fwd")), (0.0, -1))[1] == i

    return {
        "env": env,
        "trials": [t for r in runs for t in r["trials"]],
        "ops": [o for i, r in enumerate(runs) for o in r["ops"] if chosen(i, o)],
        "tuned": [t for i, r in enumerate(runs) for t in r["tuned"] if chosen(i, t)],
        "crashed": list({json.dumps(c, sort_keys=True): c for r in runs for c in r.get("crashed", [])}.values()),
    }


def _key_str(key: dict[str, Any]) -> str:
    from kernels.autotune import key_str

    return key_str(key)


def _markdown(run: dict[str, Any], data: dict[str, Any], args: argparse.Namespace) -> str:
    env = run["env"]
    lines = [
        "# Autotuning on H200: default vs tuned launch configs (GDN and KDA, forward and forward+backward)",
        "",
        f"- device: {env['device']} (sm {env['compute_capability']}), driver {env['driver']}",
        f"- torch {env['torch']}, triton {env['triton']}, python {env['python']}",
        f"- code: working tree on git sha {' + '.join(env.get('git_shas') or [env['git_sha']])}",
        f"- command (device): `{env['command']}`; import: `python {' '.join(sys.argv)}`",
        f"- run started {env['started_at']}, {env['elapsed_s']:.0f} s on the device",
        "- method: successive halving per kernel (default + random draw of the space, 5 -> 15 -> 45 samples), "
        "CUDA events with L2 flush; correctness vs the default config's outputs before timing; whole forward "
        "then timed all-defaults vs all-winners, interleaved, 5 x 20 samples, medians",
        "",
        "## Whole op, per op, shape and direction (bf16, H=16, K=V=128)",
        "",
        "fwd: the forward, all defaults vs all winners. fwd+bwd: the training step, the backward's kernels at their "
        "defaults vs their winners (the forward's kernels at their forward winners on both sides).",
        "",
        "| op | shape | direction | default ms | tuned ms | speedup | trials | changed configs |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for o in run["ops"]:
        changed = "; ".join(f"{k}: {json.dumps(v)}" for k, v in o["tuned"].items()) or "none (defaults won)"
        lines.append(f"| {o['op']} | {_shape_name(o['shape'])} | {o.get('direction', 'fwd')} | {o['default_ms']:.4f} | "
                     f"{o['tuned_ms']:.4f} | {o['speedup']:.3f}x | {o['n_trials']} | {changed} |")
    lines += ["", "## Per kernel (the kernel's search: op time with that kernel at its default vs at the winner)", "",
              "| op | shape | direction | kernel | winner | winner ms | default ms | runner-up ms | gain |",
              "|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in run["tuned"]:
        gain = f"{(r['default_ms'] / r['median_ms'] - 1) * 100:+.1f}%" if r["default_ms"] else "n/a"
        ru = f"{r['runner_up_ms']:.4f}" if r["runner_up_ms"] else "n/a"
        dm = f"{r['default_ms']:.4f}" if r["default_ms"] else "n/a"
        lines.append(f"| {r['op']} | {_shape_name(r['shape'])} | {r.get('direction', 'fwd')} | {r['kernel']} | "
                     f"`{json.dumps(r['config'])}` | "
                     f"{r['median_ms']:.4f} | {dm} | {ru} | {gain} |")
    statuses: dict[str, int] = {}
    for t in run["trials"]:
        statuses[t["status"]] = statuses.get(t["status"], 0) + 1
    if run.get("crashed"):
        lines += ["", "Configs that crashed the device when compiled and run in a throwaway process (excluded from the "
                  "search, recorded `failed`; a kernel bug for its owner):", ""]
        lines += [f"- {op} {kernel} `{json.dumps(cfg)}`: {err}" for op, kernel, cfg, err in run["crashed"]]
    lines += ["", f"Trials: {len(run['trials'])} ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}).",
              f"Exported: `{args.json}` ({sum(len(k['entries']) for k in data['kernels'].values())} entries, "
              f"schema_version {data['schema_version']}); several shapes share a key (T and B are not in the "
              "kernels' keys), and the exported entry is the winner of the shape with the largest default time.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--ops", nargs="+", default=["gdn", "kda"])
    r.add_argument("--budget", type=int, default=9)
    r.add_argument("--shapes", default="", help="BxT,... (H=16, K=V=128 bf16) instead of the three default shapes; "
                   "T and B are not in the kernels' keys, so one shape gives one entry per kernel and key")
    r.add_argument("--directions", nargs="+", default=["fwd"], choices=["fwd", "fwd+bwd"],
                   help="fwd: the forward's kernels on the forward; fwd+bwd: the backward's kernels on the step")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--deadline-s", type=float, default=240.0)
    r.add_argument("--sha", default=None)
    r.add_argument("--device", default="cuda")
    r.add_argument("--known-bad", action="append", default=[], metavar="OP:KERNEL:BV=32,num_warps=4,num_stages=1",
                   help="a config that crashes the device: never launched, recorded failed (repeatable)")
    r.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU dry run of the script, not a measurement)")
    r.add_argument("--workers", type=int, default=12, help="processes that precompile the drawn configs (0: none)")
    i = sub.add_parser("import")
    i.add_argument("run", nargs="+", help="run JSON file(s) of the same code; several are merged (merge_runs)")
    i.add_argument("--json", required=True)
    i.add_argument("--md", required=True)
    i.add_argument("--db", default="sqlite://")
    i.add_argument("--sha", default=None, help="the code's git sha, for run files that did not record one (the others keep theirs)")
    i.add_argument("--allow-cpu", action="store_true", help="accept a --tiny CPU dry run (never for the shipped file)")
    r.add_argument("--restarts", type=int, default=4, help="fresh processes after device crashes in the search")
    r.add_argument("--partial", default=None, help=argparse.SUPPRESS)  # a restarted child: the run so far
    args = ap.parse_args()
    if args.cmd == "run" and args.partial is None and args.restarts > 0:
        raise SystemExit(run_with_restarts(args))
    cmd_run(args) if args.cmd == "run" else cmd_import(args)


CRASH_EXIT = 75  # a search met a CUDA error: the culprit is in --out's "crashed", the case restarts


def run_with_restarts(args: argparse.Namespace) -> int:
    """Run the search in child processes: a config that crashes the device mid-search (an illegal address poisons
    the CUDA context; the precompile probes each config alone and once, so some crashes surface only here) is
    recorded in "crashed" and never launched again, and a fresh process resumes with the cases not yet done."""
    import subprocess

    argv = sys.argv[1:]
    rc = subprocess.call([sys.executable, __file__, *argv, "--restarts", "0"])
    for _ in range(args.restarts):
        if rc != CRASH_EXIT:
            return rc
        rc = subprocess.call([sys.executable, __file__, *argv, "--restarts", "0", "--partial", args.out])
    return rc


if __name__ == "__main__":
    main()
