"""Where the time of GDN's TileLang reverse walk goes (issue 26): the kernel alone (`kernels.ops.gdn.reverse_bwd`),
built as it ships and with parts left out or swapped (`reverse_bwd.LAB_SWITCHES`), on the same inputs in one
process, beside its floor.

    python benchmarks/reverse_bwd_lab.py --out $OUT [--shapes 8x8192,1x65536] [--ranges 1,16]
        [--variants ,sync_loads,load_once,no_dg,no_reduce,no_store,load_once+no_dg+no_reduce+no_store] [--jobs 8]
    python benchmarks/reverse_bwd_lab.py --compile-only [--jobs 2]   # fill TileLang's cache (no GPU needed)

A variant is a "+"-joined set of switches ("" is the kernel as it ships; session 27's lockstep kernel, timed here as
"stages" in session 29, was removed in session 30). Every variant is compiled first, in
`--jobs` processes side by side (TileLang's disk cache then serves the timing process). Inputs: bf16, H = Hk = 16,
K = V = 128, chunk 64, random values of the forward's scale; shape BxT walked in `--ranges` ranges per sequence (one
shape's ranges: a comma list beside --shapes), so B x ranges x H programs of T / 64 / ranges chunk steps each.

Per variant and shape: the do_bench median (ms), the microseconds per chunk step of one program (ms over the steps a
program walks times the waves of 132 SMs), and its difference from the shipped kernel: what the part left out costs.
A variant that only swaps parts (`reverse_bwd.EXACT_SWITCHES`) also gives its largest relative difference from the
shipped kernel's outputs (max |a - b| / max |b| over dq, dk, dv, dg, dbeta, dh0).
The floor beside them: the walk's unique bytes at `runners.bench.floors.HBM_TBPS` and its matmul flops at the matmul
rate measured in this run. Writes $OUT/reverse_bwd_lab.{json,md} after every shape.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tilelang_builds import build_ahead  # noqa: E402
from runners.bench.floors import HBM_TBPS, bwd_launcher_bytes, floor_ms, reverse_walk_flops  # noqa: E402

H, DIM, BT, SMS = 16, 128, 64, 132
DEFAULT_VARIANTS = (
    "",
    "sync_mma",
    "sync_qkv",
    "sync_loads",
    "sync_stores",
    "unbatched",
    "sync_loads+sync_stores+unbatched+sync_mma",
    "load_once",
    "no_dg",
    "no_reduce",
    "no_store",
    "load_once+no_dg+no_reduce+no_store",
)


def _switches(variant: str) -> frozenset[str]:
    return frozenset(x for x in variant.split("+") if x)


def compile_all(variants: list[str], jobs: int) -> dict[str, float]:
    """Seconds per variant's compile, `jobs` side by side (`benchmarks.tilelang_builds.build_ahead`)."""
    args = [(H, H, DIM, DIM, BT, DIM**-0.5, "bfloat16", "float32", "bfloat16", _switches(v)) for v in variants]
    secs = build_ahead([("kernels.ops.gdn.reverse_bwd", a) for a in args], jobs)
    return dict(zip(variants, secs, strict=True))


def _inputs(B: int, T: int, ranges: int, seed: int = 0, dev: str = "cuda") -> dict[str, Any]:
    """The kernel's arguments: B sequences of T tokens, each walked in `ranges` chunk-aligned ranges."""
    bf = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (s * torch.randn(*shape, generator=gen, device=dev)).to(bf)

    q = torch.nn.functional.normalize(torch.randn(B, T, H, DIM, generator=gen, device=dev), dim=-1).to(bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, DIM, generator=gen, device=dev), dim=-1).to(bf)
    g = -torch.rand(B, T, H, generator=gen, device=dev) * 0.1
    gs = g.view(B, T // BT, BT, H).cumsum(2).view(B, T, H)
    beta = torch.rand(B, T, H, generator=gen, device=dev).to(bf)
    ag = randn(B, T, H, BT, s=0.05).view(B, T // BT, BT, H, BT).tril().view(B, T, H, BT)
    nt = T // BT
    per = math.ceil(nt / ranges)
    bounds = [b * T + r * per * BT for b in range(B) for r in range(ranges) if r * per < nt] + [B * T]
    starts = torch.tensor(bounds[:-1], device=dev)
    ranges_kw = {
        "cu": torch.tensor(bounds, device=dev),
        "chunk_offsets": starts // BT,
        "ends": 0.1 * torch.randn(len(bounds) - 1, H, DIM, DIM, generator=gen, device=dev),
        "final_idx": torch.tensor([i // ranges if (i % ranges) == 0 else -1 for i in range(len(bounds) - 1)], device=dev),
        "num_seqs": B,
    }
    args = (q, k, randn(B, T, H, DIM), g, gs, beta, ag, randn(B * nt, H, DIM, DIM, s=0.1), randn(B, T, H, DIM))
    return {"args": args, "ranges": ranges_kw, "programs": (len(bounds) - 1) * H, "steps": per}


def _markdown(state: dict[str, Any]) -> str:
    out = [
        "# GDN's reverse walk, the kernel alone: what each part costs (`benchmarks/reverse_bwd_lab.py`)",
        "",
        f"{state['device']}, torch {state['torch']}, tilelang {state['tilelang']}, git {state['sha']}. "
        f"Command: `{state['command']}`. Matmul rate measured here: {state['matmul_TFLOPs']:.0f} TFLOP/s. "
        "us/step: ms over (chunk steps per program x waves of 132 SMs). Switches: "
        + "; ".join(f"`{k}` {v}" for k, v in state["switches"].items()),
        "",
    ]
    for shape, rows in state["shapes"].items():
        f = rows["floor"]
        out += [
            f"## {shape} ({rows['programs']} programs x {rows['steps']} chunk steps; floor {f['floor_ms']:.3f} ms: "
            f"bytes {f['bytes_ms']:.3f}, flops {f['flops_ms']:.3f})",
            "",
            "| variant | ms | us/step | vs shipped ms | max rel diff vs shipped | compile s |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        base = rows["variants"].get("", {}).get("ms", float("nan"))
        for name, r in rows["variants"].items():
            out.append(
                f"| {name or 'shipped'} | {r['ms']:.3f} | {r['us_per_step']:.1f} | {r['ms'] - base:+.3f} | "
                f"{r['max_rel_diff']:.1e} | "
                f"{state['compile_s'].get(name, float('nan')):.0f} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/reverse_bwd_lab"))
    ap.add_argument("--shapes", default="8x8192,1x65536")
    ap.add_argument("--ranges", default="1,16", help="ranges per sequence, one per shape")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    from kernels.ops.gdn import reverse_bwd

    for v in variants:
        unknown = _switches(v) - set(reverse_bwd.LAB_SWITCHES)
        if unknown:
            ap.error(f"unknown switches {sorted(unknown)} in variant {v!r}; known: {sorted(reverse_bwd.LAB_SWITCHES)}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    ranges = [int(x) for x in a.ranges.split(",")]
    if len(ranges) != len(shapes):
        ap.error(f"--ranges takes one count per shape: {len(shapes)} shapes, {len(ranges)} counts")
    t0 = time.perf_counter()
    compile_s = compile_all(variants, a.jobs)
    print(f"compiled {len(variants)} variants in {time.perf_counter() - t0:.0f} s: {compile_s}", flush=True)
    if a.compile_only:
        return
    import tilelang

    from runners.bench.kernels_ops import Timer, measure_ceilings

    timer = Timer(cuda=True)
    state: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tilelang": tilelang.__version__,
        "sha": __import__("os").environ.get("CPBENCH_GIT_SHA", "?"),
        "command": " ".join(["python benchmarks/reverse_bwd_lab.py", *(argv or sys.argv[1:])]),
        "switches": dict(reverse_bwd.LAB_SWITCHES),
        "compile_s": compile_s,
        "matmul_TFLOPs": measure_ceilings(timer, "cuda")["matmul_TFLOPs"],
        "shapes": {},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    for (B, T), nr in zip(shapes, ranges, strict=True):
        x = _inputs(B, T, nr)
        waves = math.ceil(x["programs"] / SMS)
        nbytes = bwd_launcher_bytes("gdn", "reverse", B, T, H)
        rows: dict[str, Any] = {
            "programs": x["programs"],
            "steps": x["steps"],
            "floor": floor_ms(nbytes, reverse_walk_flops(B, T, H), state["matmul_TFLOPs"]),
            "variants": {},
        }
        shipped = None
        for v in variants:

            def call(v: str = v, x: dict[str, Any] = x) -> Any:
                return reverse_bwd.reverse_bwd_tilelang(*x["args"], scale=DIM**-0.5, lab=_switches(v), **x["ranges"])

            out = call()
            torch.cuda.synchronize()
            if v == "":
                shipped = [t.float().clone() for t in out]
            diff = float("nan")
            if shipped is not None and v and _switches(v) <= reverse_bwd.EXACT_SWITCHES:
                diff = max(
                    float((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-30))
                    for a, b in zip(out, shipped, strict=True)
                )
            ms = timer(call, warmup=10, rep=100)[0]
            rows["variants"][v] = {"ms": ms, "us_per_step": ms * 1e3 / (x["steps"] * waves), "max_rel_diff": diff}
            print(f"{B}x{T} {v or 'shipped'}: {ms:.3f} ms", flush=True)
        state["shapes"][f"{B}x{T}"] = rows
        (a.out / "reverse_bwd_lab.json").write_text(json.dumps(state, indent=1))
        (a.out / "reverse_bwd_lab.md").write_text(_markdown(state))
    print(_markdown(state))
    print(f"bytes at {HBM_TBPS} TB/s")


if __name__ == "__main__":
    main()
