"""FlashQLA's intra-card CP decision with coefficients refit on this GPU vs its shipped ones (issue 27, item 5); GPU.

    python benchmarks/flash_qla_coefs.py --out $OUT [--T 8192 32768 131072]
        [--varlen 16384:16384 65536:65536] [--H 16] [--lb -5 -0.05]
        [--directions fwd fwd+bwd] [--samples 10] [--reps 30] [--deadline-s 540]

1. Refit (what `cpbench tune --backend flash_qla --direction fwd+bwd` runs, `runners.tuner.flash_qla`): per shape
   (B=1, T, H, K=V=128, bf16, gates `lb * sigmoid(x)`) and split size S, FlashQLA's training step under the CP
   context of that split, each kernel launcher timed with CUDA events; the least-squares fit per coefficient row.
   The fit is stored in `$OUT/store.db` (a migrated SQLite store, `db.crud.store_tuning`) and exported from it
   (`runners.tuner.flash_qla_coefs.build_flash_qla_csv`, what `cpbench configs export --format flash_qla` writes)
   as `$OUT/sm90_refit.csv`; the shipped file is copied beside it.
2. Compare, per shape and direction: FlashQLA's own `decide` (`autocp.decide`, as its CP context calls it: P = this
   GPU's SMs, chunk 64, no gate) with the shipped coefficients and with the refit ones, read by FlashQLA's own
   `load_coefs`; each decision's step (forward, or forward + backward) timed under the context it picks
   (`--reps` CUDA-event medians, the two decisions interleaved), and the fastest split of `split_sizes` measured
   the same way (the best either could pick).
Writes `$OUT/flash_qla_coefs.{json,md}` after every shape (a stopped run keeps its rows), with the command, GPU,
versions and sha. The first call of a shape family compiles FlashQLA's TileLang kernels (about 170 s cold); the
script stops starting new shapes at `--deadline-s`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
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


def _shapes(args: argparse.Namespace) -> list[Any]:
    """Every shape (`runners.tuner.Shape`): one sequence of each --T, and the sequences of each --varlen, at each
    head count (outermost: a new H compiles new kernels; the deadline stops between shapes) and gate bound."""
    from runners.tuner.tune import Shape

    seqs = [(T,) for T in args.T] + [tuple(int(n) for n in v.split(":")) for v in args.varlen]
    return [Shape(T=sum(ls), H=H, lb=lb, lengths=ls if len(ls) > 1 else None) for H in args.H for ls in seqs for lb in args.lb]


def _name(shape: Any) -> str:
    seqs = ":".join(map(str, shape.lengths)) if shape.lengths else str(shape.T)
    return f"T={seqs} H={shape.H} lb={shape.lb:g}"


def refit(args: argparse.Namespace, out: Path, state: dict[str, Any], deadline: float) -> dict[str, Path]:
    """Step 1: time, fit, store, export; returns the shipped and refit CSV paths."""
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import utils

    from runners.tuner.flash_qla import coef_results, flash_qla_device, time_shape
    from runners.tuner.flash_qla_coefs import csv_from_rows
    from runners.tuner.result import TuneResult
    from runners.tuner.spec import TuneSpec
    from runners.tuner.tune import device_facts

    dev = flash_qla_device()
    spec = TuneSpec(direction="fwd+bwd", samples=args.samples)
    timed = []
    for shape in _shapes(args):
        if time.monotonic() > deadline - 0.4 * args.deadline_s:  # the comparison keeps 40 % of the time
            state["stopped"] = f"deadline before the refit of {_name(shape)}"
            break
        t0 = time.monotonic()
        timed += [(t, S, shape) for t, S in time_shape(shape, spec, dev, lambda line: print(line, flush=True))]
        state["refit_shapes"].append({"shape": _name(shape), "wall_s": time.monotonic() - t0})
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
    return paths


def compare(args: argparse.Namespace, paths: dict[str, Path], state: dict[str, Any], deadline: float, out: Path) -> None:
    """Step 2: each coefficient set's decision and its measured step, and the fastest split, per shape and direction."""
    import torch
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import current_arch, decide, load_coefs

    from runners.tuner.flash_qla import flash_qla_context, flash_qla_inputs, run_step, seq_chunks, split_sizes

    arch = current_arch()
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
            picks = {side: decide(num_chunks=chunks, num_v_heads=shape.H, coefs=c, P=P, chunk=64, is_train=train, debug=True)
                     for side, c in coefs.items()}  # fmt: skip
            lcp = {side: (d["lcp"] if d["use_cp"] else None) for side, d in picks.items()}
            whole = max(chunks)
            splits = {S: flash_qla_context(S, x, 64) for S in split_sizes(whole, 4)}
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
    args = p.parse_args(argv)
    from runners.tuner.flash_qla import require_flash_qla

    try:
        require_flash_qla()
    except ValueError as e:
        sys.exit(f"flash_qla_coefs: {e}")
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "versions": _versions(), "refit_shapes": [],
                             "compare": []}  # fmt: skip
    paths = refit(args, args.out, state, deadline)
    write(args.out, state)
    compare(args, paths, state, deadline, args.out)
    write(args.out, state)


if __name__ == "__main__":
    main()
