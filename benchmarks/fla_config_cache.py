"""FLA's first call with our exported config cache vs its own autotune (issue 13, benchmark (b)); GPU only.

    python benchmarks/fla_config_cache.py --ops gdn kda --T 8192 65536 --out $OUT [--budget 6] [--samples 10]
        [--direction fwd+bwd [--bypass-hopper-guard]]

Every step runs in a FRESH process with its own empty TRITON_CACHE_DIR (so compile and autotune caches start
cold), FLA_DISABLE_BACKEND_DISPATCH=1 (FLA's Triton path on every side), shapes B=1, H=16, K=V=128, bf16, forward
(`--direction fwd+bwd`: FLA's training step, forward + `o.backward(do)`, so its backward kernels are tuned, exported
and checked too; `--bypass-hopper-guard` lifts FLA's guard on the GDN backward, FLA #640, as the `fla` peer does):

1. own + tune, per op and T, one process: FLA with its own autotune (FLA_CACHE_MODE unset): wall time of the first
   call (compile + autotune), the number of autotune benchmark runs, its picks; then `runners.tuner.fla.tune_fla`
   (what `cpbench tune --backend fla` runs: each config of each autotuned FLA kernel the op touches pinned in turn,
   the whole op timed; FLA's own picks are already cached, so FLA autotunes once per op and T, not twice) with the
   winners merged into FLA's config-cache directory `$OUT/fla_configs/` (what `cpbench configs export --format fla`
   writes); then FLA's own picks vs the exported configs pinned, timed interleaved (A/B blocks, CUDA events, L2
   flushed), and the output with the exported configs pinned (`--skip-tune`: the export of an earlier run);
2. export, per op and T: FLA_CONFIG_DIR=$OUT/fla_configs FLA_CACHE_MODE=strict: wall time of the first call, the
   number of autotune benchmark runs (target: 0), whether every pick equals the exported config, and whether the
   output equals step 1's output with the same configs pinned (bitwise).

Writes $OUT/fla_config_cache.{json,md} after every op and T, so a stopped run keeps its rows. Targets (issue 13):
first call with the export <= 15 s; steady state with our configs <= FLA's own picks at every shape. The forward
takes ~1-2 min per op and T at --budget 6 on an H200; the training step is dominated by FLA's own first call
(its own autotune of the forward and backward: 2-4 min per op at T=8K).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"B": 1, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16"}


def _child(step: str, args: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run `step` in a fresh process with an empty Triton cache; returns its JSON result."""
    res_path = out / f"_{step}_{args.get('op', 'all')}_{args.get('T', 0)}.json"
    env = {**os.environ, "FLA_DISABLE_BACKEND_DISPATCH": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("FLA_CACHE_MODE", None)
    env.pop("FLA_CONFIG_DIR", None)
    if step == "export":
        env.update(FLA_CONFIG_DIR=str(out / "fla_configs"), FLA_CACHE_MODE="strict")
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        cmd = [sys.executable, __file__, "--child", step, "--child-args", json.dumps(args), "--out", str(out),
               "--result", str(res_path)]
        proc = subprocess.run(cmd, env=env, cwd=REPO, timeout=args.get("timeout_s", 1800))
    if proc.returncode != 0:
        return {"error": f"{step} exited {proc.returncode}"}
    return json.loads(res_path.read_text())


def _count_benchmarks() -> list[int]:
    """Count Triton autotune benchmark runs (each config timed once per tuned key) from now on."""
    from triton.runtime.autotuner import Autotuner

    count = [0]
    original = Autotuner._bench

    def bench(self: Any, *a: Any, **kw: Any) -> Any:
        count[0] += 1
        return original(self, *a, **kw)

    Autotuner._bench = bench  # type: ignore[method-assign]
    return count


def _load_export(out: Path) -> dict[str, dict[str, Any]]:
    d = out / "fla_configs"
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}


def _first_call(op: str, T: int, direction: str, options: dict[str, Any]) -> tuple[Any, Any, float, list[tuple[str, tuple[Any, ...]]]]:
    import torch

    from runners.peers import fla_autotune as fa
    from runners.tuner.fla import _fla_runner
    from runners.tuner.tune import Shape, make_case

    case = make_case(op, Shape.of({**SHAPE, "T": T}), "cuda")
    run = _fla_runner(op, case, direction, options)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    touched = fa.record_touched(lambda: (run(), torch.cuda.synchronize()))
    first_s = time.perf_counter() - t0
    return case, run, first_s, touched


def _outputs(got: Any) -> list[Any]:
    """Every output of the run on the host (o and the final state; at fwd+bwd every input gradient too)."""
    return [x.detach().cpu() for x in got if x is not None]


def _picks(touched: list[Any]) -> dict[str, dict[str, Any]]:
    """{"name|entry hash": the config the call's Autotuner holds for its key} (FLA's pick, or the loaded one)."""
    from runners.peers import fla_autotune as fa

    return {f"{n}|{fa.entry_hash(k)}": fa.config_dict(t.cache[k]) for n, k, t in touched if k in t.cache}


def _merge_export(out: Path, files: dict[str, dict[str, Any]]) -> None:
    """Write FLA config-cache files into $OUT/fla_configs, keeping the entries of earlier ops and Ts."""
    d = out / "fla_configs"
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = d / name
        if path.exists():
            merged = json.loads(path.read_text())
            merged["autotune_entries"].update(content["autotune_entries"])
            content = {**content, "autotune_entries": merged["autotune_entries"]}
        path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")


def _tune(a: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """`cpbench tune --backend fla` for one op and T in this process (FLA's own picks already cached by its first
    call, so no second autotune); the winners merged into $OUT/fla_configs."""
    from runners.tuner import TuneSpec
    from runners.tuner.fla import tune_fla
    from runners.tuner.fla_export import fla_files_from_rows
    from runners.versions import software_versions

    rows = tune_fla(op=a["op"], shapes=[{**SHAPE, "T": a["T"]}], device="cuda", options=a["options"],
                    spec=TuneSpec(budget=a["budget"], samples=a["samples"], direction=a["direction"])).tuned_rows()
    _merge_export(out, fla_files_from_rows(rows, device_name=None, allow_cpu=False,
                                           triton_version=software_versions()["triton"]))
    return [{"kernel": r.kernel, "key": r.key_str, "config": r.config, "tuned_ms": r.median_ms,
             "fla_pick_ms": r.default_ms} for r in rows]


def child_own(a: dict[str, Any], out: Path) -> dict[str, Any]:
    import torch

    from runners.peers import fla_autotune as fa
    from runners.tuner.clock import StepTimer

    benches = _count_benchmarks()
    _case, run, first_s, touched = _first_call(a["op"], a["T"], a["direction"], a["options"])
    own_benchmarks = benches[0]
    print(f"{a['op']} T={a['T']}: first call with FLA's own autotune {first_s:.1f} s, {own_benchmarks} "
          "benchmark runs", flush=True)
    own = _picks(touched)
    own_cfg = {t: t.tuner.cache[t.key] for t in touched if t.key in t.tuner.cache}  # before the tuner pins
    tuned = _tune(a, out) if a.get("tune") else None
    export = _load_export(out)
    ours_cfg = dict(own_cfg)
    for t in touched:
        entry = export.get(t.name, {}).get("autotune_entries", {}).get(fa.entry_hash(t.key))
        if entry is not None:
            ours_cfg[t] = fa.config_of(entry["config"])

    def pin(cfgs: dict[Any, Any]) -> None:  # {touched call: config}
        for t, c in cfgs.items():
            fa.pin(t.tuner, t.key, c)

    timer = StepTimer("cuda")
    own_ms: list[float] = []
    ours_ms: list[float] = []
    for _ in range(a["blocks"]):
        pin(own_cfg)
        own_ms += timer(run, a["samples"])
        pin(ours_cfg)
        ours_ms += timer(run, a["samples"])
    pin(ours_cfg)
    torch.save(_outputs(run()), out / f"_pinned_{a['op']}_{a['T']}.pt")
    return {"first_call_s": first_s, "autotune_benchmarks": own_benchmarks, "picks": own, "tuned": tuned,
            "steady_own_ms": statistics.median(own_ms), "steady_ours_ms": statistics.median(ours_ms),
            "keys_in_export": sum(1 for n, k, _t in touched if fa.entry_hash(k) in export.get(n, {}).get("autotune_entries", {})),
            "keys_touched": len(touched)}


def child_export(a: dict[str, Any], out: Path) -> dict[str, Any]:
    import torch

    from runners.peers import fla_autotune as fa

    benches = _count_benchmarks()
    _case, run, first_s, touched = _first_call(a["op"], a["T"], a["direction"], a["options"])
    got = _picks(touched)
    export = _load_export(out)
    mismatched = []
    for n, k, _t in touched:
        entry = export.get(n, {}).get("autotune_entries", {}).get(fa.entry_hash(k))
        if entry is None or got.get(f"{n}|{fa.entry_hash(k)}") != entry["config"]:
            mismatched.append({"kernel": n, "key": list(k), "exported": entry and entry["config"],
                               "picked": got.get(f"{n}|{fa.entry_hash(k)}")})
    got_out = _outputs(run())
    ref_path = out / f"_pinned_{a['op']}_{a['T']}.pt"
    same = None
    if ref_path.exists():
        ref = torch.load(ref_path)
        same = len(ref) == len(got_out) and all(torch.equal(x, r) for x, r in zip(got_out, ref, strict=True))
    return {"first_call_s": first_s, "autotune_benchmarks": benches[0], "picks_match": not mismatched,
            "mismatched": mismatched, "identical_output": same}


def _markdown(rows: list[dict[str, Any]], tune: dict[str, Any], argv: list[str], direction: str = "forward") -> str:
    lines = [
        f"# FLA's first call: our exported config cache vs FLA's own autotune (H200, {direction}, bf16, B=1 H=16 K=V=128)",
        "",
        f"Command: `python benchmarks/fla_config_cache.py {' '.join(argv)}`; each cell a fresh process with an empty "
        "Triton cache, FLA_DISABLE_BACKEND_DISPATCH=1. Export: FLA_CONFIG_DIR + FLA_CACHE_MODE=strict. "
        f"Tuned: {tune.get('kernels')} kernels, {tune.get('entries')} entries.",
        "",
        "| op | T | first call, own autotune (s) | first call, export (s) | autotune runs with export | same picks | "
        "identical output | steady, FLA's picks (ms) | steady, ours (ms) | ours/own |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        own, exp = r["own"], r["export"]
        if "error" in own or "error" in exp:
            lines.append(f"| {r['op']} | {r['T']} | {own.get('error', '')} | {exp.get('error', '')} | | | | | | |")
            continue
        lines.append(
            f"| {r['op']} | {r['T']} | {own['first_call_s']:.1f} | {exp['first_call_s']:.1f} | {exp['autotune_benchmarks']} "
            f"| {exp['picks_match']} | {exp['identical_output']} | {own['steady_own_ms']:.3f} | {own['steady_ours_ms']:.3f} "
            f"| {own['steady_ours_ms'] / own['steady_own_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    p.add_argument("--T", nargs="+", type=int, default=[8192, 65536])
    p.add_argument("--budget", type=int, default=None, help="configs per kernel and key (FLA's pick always in); all")
    p.add_argument("--samples", type=int, default=10, help="samples per trial (tune) and per A/B block (own)")
    p.add_argument("--blocks", type=int, default=5, help="interleaved A/B blocks of the steady-state comparison")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skip-tune", action="store_true", help="reuse $OUT/fla_configs from an earlier run")
    p.add_argument("--direction", default="fwd", choices=["fwd", "fwd+bwd"], help="FLA's forward or its training step")
    p.add_argument("--bypass-hopper-guard", action="store_true", help="fwd+bwd: lift FLA's guard on the GDN backward")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-args", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        fn = {"own": child_own, "export": child_export}[args.child]
        args.result.write_text(json.dumps(fn(json.loads(args.child_args), args.out), indent=1, default=str))
        return
    side = {"direction": args.direction, "options": {"bypass_hopper_guard": True} if args.bypass_hopper_guard else {}}
    if args.skip_tune and not (args.out / "fla_configs").is_dir():
        p.error(f"--skip-tune: no {args.out / 'fla_configs'} from an earlier run")
    shown = sys.argv[1:] if argv is None else argv
    label = "forward" if args.direction == "fwd" else "forward+backward"
    rows: list[dict[str, Any]] = []
    tune: dict[str, Any] = {}

    def write() -> None:  # after every row: a call that runs out of time keeps what it measured
        export = _load_export(args.out) if (args.out / "fla_configs").is_dir() else {}
        tune.update(kernels=len(export), entries=sum(len(f["autotune_entries"]) for f in export.values()))
        (args.out / "fla_config_cache.json").write_text(json.dumps({"tune": tune, "rows": rows}, indent=1, default=str))
        (args.out / "fla_config_cache.md").write_text(_markdown(rows, tune, shown, label))

    write()
    for op in args.ops:
        for T in args.T:
            own = _child("own", {"op": op, "T": T, "samples": args.samples, "blocks": args.blocks,
                                 "tune": not args.skip_tune, "budget": args.budget, **side}, args.out)
            exp = _child("export", {"op": op, "T": T, **side}, args.out)
            rows.append({"op": op, "T": T, "own": own, "export": exp})
            print(json.dumps(rows[-1], default=str)[:2000], flush=True)
            write()
    print(_markdown(rows, tune, shown, label))


if __name__ == "__main__":
    main()
