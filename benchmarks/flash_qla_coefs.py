"""FlashQLA's intra-card CP decision with coefficients refit on this GPU vs its shipped ones (issue 27, item 5); GPU.

    python benchmarks/flash_qla_coefs.py --out $OUT [--T 8192 32768 131072]
        [--varlen 16384:16384 65536:65536] [--H 16] [--lb -5 -0.05]
        [--directions fwd fwd+bwd] [--splits decide|all] [--samples 10] [--reps 30] [--deadline-s 540]
        [--tilelang-cache DIR|FILE.tar.xz] [--pack-cache $OUT/tilelang_cache.tar.xz] [--reuse-timings OLD.json]

    # one device call, cold cache, about 300 s on an H200: the forward at 32K and 128K (and their two-sequence cuts)
    python benchmarks/flash_qla_coefs.py --out $OUT --T 32768 131072 --directions fwd --deadline-s 270 \
        --pack-cache $OUT/tilelang_cache.tar.xz

1. Refit (what `cpbench tune --backend flash_qla --direction D` runs, `runners.tuner.flash_qla`; D is fwd+bwd when
   --directions has it, else fwd): per shape (B=1, T, H, K=V=128, bf16, gates `lb * sigmoid(x)`) and split size S,
   FlashQLA's step under the CP context of that split, each kernel launcher timed with CUDA events; the
   least-squares fit per coefficient row. The split sizes (`--splits`, `runners.tuner.flash_qla.time_splits`):
   "decide" (default) those FlashQLA's own `decide` prices at the shape and one partition either side, and no
   split; "all" every power of two and 2..8-partition cut. A new launch variant is a TileLang compile (15-50 s cold;
   the backward kernels the longest): at H=16 "decide" compiles only the CP forward at V tile 128 and the unsplit
   one (tile 32), so the fused forward's dv64 row is not timed and keeps its shipped coefficients. Each split's
   timings are written as they come (`timings` in the JSON); `--reuse-timings` takes a cut run's JSON and times
   only the splits it lacks.
   The fit is stored in `$OUT/store.db` (a migrated SQLite store, `db.crud.store_tuning`) and exported from it
   (`runners.tuner.flash_qla_coefs.build_flash_qla_csv`, what `cpbench configs export --format flash_qla` writes)
   as `$OUT/sm90_refit.csv`; the shipped file is copied beside it.
2. Compare, per shape and direction: FlashQLA's own `decide` (`autocp.decide`, as its CP context calls it: P = this
   GPU's SMs, chunk 64, no gate) with the shipped coefficients and with the refit ones, read by FlashQLA's own
   `load_coefs`; each decision's step (forward, or forward + backward) timed under the context it picks
   (`--reps` CUDA-event medians, the two decisions interleaved), and the fastest split of `split_sizes` measured
   the same way (the best either could pick).
Writes `$OUT/flash_qla_coefs.{json,md}` after every shape (a stopped run keeps its rows), with the command, GPU,
versions and sha. The refit stops starting shapes at 60 % of `--deadline-s`, the comparison at all of it.

TileLang's compile cache (TILELANG_CACHE_DIR, default ~/.tilelang/cache): `--pack-cache FILE` packs it (xz) after
the refit and again at the end if the comparison compiled more, printing its size (a file under $OUT comes back
from the device when it is at most 16 MiB); `--tilelang-cache` reuses a directory or such a file on the next call
(unpacked before FlashQLA is imported), so the kernels compiled once are not compiled again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _versions() -> dict[str, Any]:
    import importlib.metadata

    import torch

    from runners.versions import git_sha

    out: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "sha": git_sha()}
    for pkg in ("flash-qla", "tilelang"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _median_ms(fn: Any, reps: int, *args: Any) -> float:
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def store(result: Any, out: Path) -> str:
    """Store the fit in a fresh SQLite store `$OUT/store.db` (`db.crud.store_tuning`; the tables made from the models,
    as benchmarks/autotune_h200.py does), or say why not (the device may lack the store's packages)."""
    try:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        from db import crud
        from db.base import Base
    except ImportError as e:
        return f"not stored: {e}"
    engine = create_engine(f"sqlite:///{out / 'store.db'}")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        crud.store_tuning(session, result=result)
        session.commit()
    engine.dispose()
    return f"stored in {out / 'store.db'} (`cpbench configs export --format flash_qla --db sqlite:///store.db`)"


def cache_dir() -> Path:
    """TileLang's compile cache in use (its env.py: TILELANG_CACHE_DIR, else ~/.tilelang/cache)."""
    return Path(os.environ.get("TILELANG_CACHE_DIR") or Path.home() / ".tilelang" / "cache")


def _cache_files(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def reuse_cache(src: Path) -> str:
    """Point TileLang at `src` (a directory) or unpack `src` (a .tar.xz from `pack_cache`) into the cache in use."""
    if src.is_dir():
        os.environ["TILELANG_CACHE_DIR"] = str(src)
        return f"TileLang cache: {src} ({len(_cache_files(src))} files)"
    dest = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src, "r:xz") as tar:
        tar.extractall(dest, filter="data")
    os.environ["TILELANG_CACHE_DIR"] = str(dest)
    return (
        f"TileLang cache: {src} ({src.stat().st_size / 2**20:.1f} MiB) unpacked into {dest} ({len(_cache_files(dest))} files)"
    )


def pack_cache(dest: Path, state: dict[str, Any]) -> None:
    """Pack the cache in use into `dest` (xz) unless it is unchanged since the last pack; print and record its size."""
    folder = cache_dir()
    files = _cache_files(folder) if folder.is_dir() else []
    if not files or state.get("cache_files") == files:
        return
    t0 = time.monotonic()
    with tarfile.open(dest, "w:xz", preset=3) as tar:
        tar.add(folder, arcname=".")
    state["cache_files"] = files
    mib = dest.stat().st_size / 2**20
    state["cache"] = {"file": str(dest), "MiB": round(mib, 2), "files": len(files),
                      "raw_MiB": round(sum(n for _, n in files) / 2**20, 1), "pack_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    print(f"TileLang cache {folder} packed into {dest}: {mib:.1f} MiB ({len(files)} files, "
          f"{state['cache']['raw_MiB']} MiB raw, {state['cache']['pack_s']} s)"
          + ("; over the 16 MiB a file may have to come back from the device" if mib > 16 else ""), flush=True)  # fmt: skip


def _shapes(args: argparse.Namespace) -> list[Any]:
    """Every shape (`runners.tuner.Shape`): one sequence of each --T, and the sequences of each --varlen, at each
    head count (outermost: a new H compiles new kernels; the deadline stops between shapes) and gate bound."""
    from runners.tuner.tune import Shape

    seqs = [(T,) for T in args.T] + [tuple(int(n) for n in v.split(":")) for v in args.varlen]
    return [Shape(T=sum(ls), H=H, lb=lb, lengths=ls if len(ls) > 1 else None) for H in args.H for ls in seqs for lb in args.lb]


def _name(shape: Any) -> str:
    seqs = ":".join(map(str, shape.lengths)) if shape.lengths else str(shape.T)
    return f"T={seqs} H={shape.H} lb={shape.lb:g}"


def _refit_direction(args: argparse.Namespace) -> str:
    return "fwd+bwd" if "fwd+bwd" in args.directions else "fwd"


def _reused_timings(path: Path | None, direction: str) -> list[dict[str, Any]]:
    """The `timings` of an earlier run's JSON timed in `direction` (none without `path`)."""
    if path is None:
        return []
    old = json.loads(path.read_text())
    return [t for t in old.get("timings", []) if t["direction"] == direction]


def refit(args: argparse.Namespace, out: Path, state: dict[str, Any], deadline: float) -> dict[str, Path]:
    """Step 1: time (each split written as it comes), fit, store, export; returns the shipped and refit CSV paths."""
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import utils

    from runners.tuner.flash_qla import coef_results, flash_qla_device, time_splits
    from runners.tuner.flash_qla_coefs import Timing, csv_from_rows
    from runners.tuner.result import TuneResult
    from runners.tuner.spec import TuneSpec
    from runners.tuner.tune import device_facts

    dev = flash_qla_device()
    direction = _refit_direction(args)
    spec = TuneSpec(direction=direction, samples=args.samples)
    state["refit_direction"] = direction
    shapes = {_name(s): s for s in _shapes(args)}
    state["timings"] = [t for t in _reused_timings(args.reuse_timings, direction) if t["shape"] in shapes]
    t_start = time.monotonic()
    for name, shape in shapes.items():
        if time.monotonic() > deadline - 0.4 * args.deadline_s:  # the comparison keeps 40 % of the time
            state["stopped"] = f"deadline before the refit of {name}"
            break
        t0 = time.monotonic()
        done = {t["S"] for t in state["timings"] if t["shape"] == name}
        say = lambda line: print(f"[{time.monotonic() - t_start:5.0f} s] {line}", flush=True)  # noqa: E731
        for S, timings in time_splits(shape, spec, dev, say, splits=args.splits, skip=done):
            state["timings"] += [{"shape": name, "direction": direction, "S": S, **vars(t)} for t in timings]
            write(out, state)  # a run cut from here on keeps this split
        state["refit_shapes"].append({"shape": name, "wall_s": time.monotonic() - t0})
    timed = [(Timing(**{k: t[k] for k in ("row", "depth", "u", "ms")}), t["S"], shapes[t["shape"]])
             for t in state["timings"]]  # fmt: skip
    name, cc = device_facts("cuda")
    result = TuneResult(device_name=name, compute_capability=cc, kernels=tuple(coef_results(timed, spec, dev)))
    state["store"] = store(result, out)
    # the winners as the rows `cpbench configs export` reads back (plain objects: no SQLAlchemy needed here)
    text = csv_from_rows([SimpleNamespace(**w) for w in result.winner_rows()], device_name=name)
    paths = {"shipped": out / f"{dev.arch}_shipped.csv", "refit": out / f"{dev.arch}_refit.csv"}
    shutil.copyfile(utils.coefs_path_for(dev.arch), paths["shipped"])
    paths["refit"].write_text(text)
    state["fit"] = [{"row": k.kernel.split(".", 1)[1], **{c: k.config[c] for c in ("a", "b", "c", "source", "n", "rms_ms",
                    "shipped_rms_ms", "why")}, "shipped": k.config["shipped"]} for k in result.kernels]  # fmt: skip
    if args.pack_cache:
        pack_cache(args.pack_cache, state)
    return paths


def compare(args: argparse.Namespace, paths: dict[str, Path], state: dict[str, Any], deadline: float, out: Path) -> None:
    """Step 2: each coefficient set's decision and its measured step, and the fastest split, per shape and direction."""
    import torch
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import current_arch, decide, load_coefs

    from runners.tuner.flash_qla import (
        decided_splits,
        flash_qla_context,
        flash_qla_device,
        flash_qla_inputs,
        run_step,
        seq_chunks,
        split_sizes,
    )

    arch, dev = current_arch(), flash_qla_device()
    coefs = {side: load_coefs(str(p), arch=arch) for side, p in paths.items()}
    P = torch.cuda.get_device_properties().multi_processor_count
    for direction in args.directions:
        train = direction == "fwd+bwd"
        for shape in _shapes(args):
            if time.monotonic() > deadline:
                state["stopped"] = f"deadline before comparing {_name(shape)} {direction}"
                return
            x = flash_qla_inputs(shape, train=train)
            chunks = seq_chunks(x, 64)
            # with the gate, as FlashQLA's CP context calls it (each head's warmup depth from the gate's mean; session
            # 11's script left it out, so `decide` priced every warmup as the whole segment)
            picks = {side: decide(num_chunks=chunks, num_v_heads=shape.H, coefs=c, P=P, chunk=64, is_train=train, debug=True,
                                  g=x["g"])
                     for side, c in coefs.items()}  # fmt: skip
            lcp = {side: (d["lcp"] if d["use_cp"] else None) for side, d in picks.items()}
            whole = max(chunks)
            sizes = (
                split_sizes(whole, 4) if args.splits == "all" else decided_splits(chunks, shape.H, dev, train=train, g=x["g"])
            )
            picked = {S for S in lcp.values() if S is not None}  # each side's pick is timed, in the set or not
            splits = {S: flash_qla_context(S, x, 64) for S in sorted({*sizes, *picked})}
            print(f"compare {direction} {_name(shape)}: picks {lcp}, split sizes {sorted(splits)}", flush=True)
            for ctx in splits.values():
                run_step(x, ctx)  # compile every split's kernels before timing
            ms = {S: _median_ms(run_step, args.reps, x, ctx) for S, ctx in splits.items()}
            side_ms = {}
            for side in ("shipped", "refit", "shipped", "refit"):  # interleaved, the median of two blocks each
                S = lcp[side] or whole
                side_ms.setdefault(side, []).append(_median_ms(run_step, args.reps, x, splits[S]))
            best = min(ms, key=ms.__getitem__)
            row = {"direction": direction, "shape": _name(shape),
                   **{f"{side}_lcp": lcp[side] for side in lcp},
                   **{f"{side}_pred_ms": picks[side]["best_cp_ms"] if picks[side]["use_cp"] else picks[side]["nocp_pred_ms"]
                      for side in picks},
                   **{f"{side}_ms": min(v) for side, v in side_ms.items()},
                   "best_S": None if best == whole else best, "best_ms": ms[best],
                   "split_ms": {str(S): v for S, v in ms.items()}}  # fmt: skip
            row["refit_speedup"] = row["shipped_ms"] / row["refit_ms"]
            state["compare"].append(row)
            write(out, state)
            print(json.dumps({k: v for k, v in row.items() if k != "split_ms"}), flush=True)


def _split(lcp: Any) -> str:
    return "no CP" if lcp is None else f"S={lcp}"


def write(out: Path, state: dict[str, Any]) -> None:
    (out / "flash_qla_coefs.json").write_text(json.dumps(state, indent=1, default=str) + "\n")
    v = state["versions"]
    lines = [
        "# FlashQLA's intra-card CP: refit coefficients vs shipped (issue 27, item 5)", "",
        f"Command: `{state['command']}`  ",
        f"GPU: {v['gpu']}; torch {v['torch']}, flash-qla {v['flash-qla']}, tilelang {v['tilelang']}; sha {v['sha']}",
        "", f"Refit: {state.get('refit_direction')}, split sizes `{state['splits']}`, {len(state.get('timings', []))} "
        f"kernel timings over {len({(t['shape'], t['S']) for t in state.get('timings', [])})} (shape, split) pairs; "
        f"TileLang cache: {state.get('cache_from') or 'cold'}"
        + (f"; packed {state['cache']['MiB']} MiB ({state['cache']['files']} files)" if state.get("cache") else ""),
        "", "## Fit (ms = a·depth + b·u + c; RMS of each set's predictions over the timings)", "",
        "| row | source | n | a | b | c | shipped a | shipped b | shipped c | RMS refit | RMS shipped |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for f in state.get("fit", []):
        sh = f["shipped"] or {}
        lines.append(
            f"| {f['row']} | {f['source']} | {f['n']} | {f['a']:.4g} | {f['b']:.4g} | {f['c']:.4g} | "
            + " | ".join(f"{sh[c]:.4g}" if c in sh else "—" for c in ("a", "b", "c"))
            + " | "
            + " | ".join("—" if f[k] is None else f"{f[k]:.4f}" for k in ("rms_ms", "shipped_rms_ms"))
            + " |"
        )
    lines += ["", "## Decision and measured step", "",
              "| direction | shape | shipped pick | refit pick | shipped ms | refit ms | shipped/refit | fastest split | its ms |",
              "|---|---|---|---|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in state["compare"]:
        lines.append(
            f"| {r['direction']} | {r['shape']} | {_split(r['shipped_lcp'])} | {_split(r['refit_lcp'])} | "
            f"{r['shipped_ms']:.3f} | {r['refit_ms']:.3f} | {r['refit_speedup']:.3f} | {_split(r['best_S'])} | "
            f"{r['best_ms']:.3f} |"
        )
    if state.get("stopped"):
        lines += ["", f"Stopped: {state['stopped']}."]
    (out / "flash_qla_coefs.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--T", type=int, nargs="+", default=[8192, 32768, 131072])
    p.add_argument(
        "--varlen",
        nargs="*",
        default=["16384:16384", "65536:65536"],
        help="several sequences in one call (lengths joined by ':'): they set the correction rows apart",
    )
    p.add_argument("--H", type=int, nargs="+", default=[16])
    p.add_argument(
        "--lb",
        type=float,
        nargs="+",
        default=[-5.0, -0.05],
        help="gate bounds: the warmup FlashQLA's gate asks for (1 chunk at -5, about 7 at -0.05) sets the depth",
    )
    p.add_argument("--directions", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--samples", type=int, default=10, help="runs per split in the refit (medians)")
    p.add_argument("--reps", type=int, default=30, help="runs per timed step in the comparison (medians)")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument(
        "--splits",
        choices=["decide", "all"],
        default="decide",
        help="split sizes timed: those FlashQLA's decide prices and around them (few compiles), or all",
    )
    p.add_argument("--tilelang-cache", type=Path, help="reuse this TileLang cache: a directory, or a --pack-cache file")
    p.add_argument("--pack-cache", type=Path, help="pack TileLang's cache into this .tar.xz (put it under $OUT)")
    p.add_argument("--reuse-timings", type=Path, help="an earlier run's flash_qla_coefs.json: time only what it lacks")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.deadline_s
    for given in (args.tilelang_cache, args.reuse_timings):
        if given is not None and not given.exists():
            sys.exit(f"flash_qla_coefs: {given} does not exist")
    cache_from = reuse_cache(args.tilelang_cache) if args.tilelang_cache else None  # before FlashQLA imports TileLang
    if cache_from:
        print(cache_from, flush=True)
    from runners.tuner.flash_qla import require_flash_qla

    try:
        require_flash_qla()
    except ValueError as e:
        sys.exit(f"flash_qla_coefs: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "versions": _versions(), "refit_shapes": [],
                             "compare": [], "splits": args.splits, "cache_from": cache_from}  # fmt: skip
    paths = refit(args, args.out, state, deadline)
    write(args.out, state)
    print(f"[{time.monotonic() - t0:5.0f} s] refit written; comparing", flush=True)
    compare(args, paths, state, deadline, args.out)
    write(args.out, state)
    if args.pack_cache:
        pack_cache(args.pack_cache, state)
        write(args.out, state)
    print(f"[{time.monotonic() - t0:5.0f} s] done: {args.out / 'flash_qla_coefs.md'}", flush=True)


if __name__ == "__main__":
    main()
