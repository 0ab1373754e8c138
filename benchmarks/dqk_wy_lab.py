"""The backward's gradient kernels on the GPU: the pair `chunk_bwd_dqk` + `wy_bwd` (`kernels.common.chunk_bwd.
pair_grads`) against the fused `chunk_bwd_dqk_wy` (`kernels.common.dqk_wy_bwd`), on the same intermediates, per op.

    python3 benchmarks/dqk_wy_lab.py --out $OUT [--ops gdn kda] [--shapes 1x65536 1x131072 8x8192] [--H 16] [--HV 16]
    TRITON_INTERPRET=1 python3 benchmarks/dqk_wy_lab.py --out /tmp/lab --dry-run   # plumbing on the CPU

bf16 inputs, K = V = 128, 64-token chunks, gates logsigmoid(randn) (GDN [B, T, HV], KDA [B, T, HV, K]), fp32. The
intermediates (T, h, dh, v_new, dv_new, w, u) come from the backward's own steps 1-2 (`chunk_bwd`'s recompute and
reverse state pass). Per op and shape:
- `pair` and `fused` at each launch config below, timed alone (`triton.testing.do_bench` median, ms), beside the
  bytes floor at 4.2 TB/s (`runners.bench.floors.bwd_launcher_bytes`: every tensor a launcher reads or writes once);
  the pair's split per kernel from the profiler (`chunk_bwd_dqk`, `wy_bwd`, each beside its own floor);
- the fused gradients against the pair's (rel_l2 per gradient: the bf16 rounding of two orders of summation);
- the whole training step (forward + backward, `kernels.forward`, recompute policy "inputs") with each: median ms
  and the peak allocated above the inputs (GB).
Prints one JSON line per row; writes $OUT/dqk_wy_lab.json and $OUT/dqk_wy_lab.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.common import chunk_bwd as cb  # noqa: E402
from kernels.common.dqk_wy_bwd import dqk_wy_bwd  # noqa: E402
from kernels.common.index import prepare_chunk_index  # noqa: E402
from kernels.configs import LaunchConfig  # noqa: E402
from kernels.plan import LaunchPlan  # noqa: E402
from runners.bench.floors import bwd_launcher_bytes, floor_ms  # noqa: E402
from runners.correctness import rel_l2  # noqa: E402

NAMES = ("dq", "dk", "dv", "dg", "dbeta")
# the pair's configs (the default; the tuned KDA config of the shipped file, 8 warps) and the fused kernel's
PAIR_CONFIGS = {"default": {}, "w8": {"BK": 64, "BV": 64, "num_warps": 8, "num_stages": 2}}
FUSED_CONFIGS = {
    "default": {},  # BK = BV = 64, 8 warps
    "w4": {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2},
    "bk32_w8": {"BK": 32, "BV": 32, "num_warps": 8, "num_stages": 2},
    "bk128_w8": {"BK": 128, "BV": 64, "num_warps": 8, "num_stages": 2},
}


def inputs(op: str, B: int, T: int, H: int, HV: int, K: int, device: str, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=device, generator=gen).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=device, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, K, device=device, generator=gen).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, *((K,) if op == "kda" else ()), device=device, generator=gen))
    beta = torch.rand(B, T, HV, device=device, generator=gen).sigmoid().to(dtype)
    do = torch.randn(B, T, HV, K, device=device, generator=gen).to(dtype)
    return q, k, v, g, beta, do


def intermediates(op: str, q, k, v, g, beta, do, *, scale: float) -> dict[str, Any]:  # noqa: ANN001
    """What the gradient kernels read, made by `chunk_bwd`'s steps 1-2 (the WY recompute, T, the chunk states and
    the reverse state pass, the automatic split)."""
    gate_vector = op == "kda"
    index = prepare_chunk_index(None, batch=q.shape[0], seq_len=q.shape[1], chunk_size=64, device=q.device)
    plan = LaunchPlan()
    w, u, ks, gs, qs, aqk = cb._wy_factors(gate_vector, q, k, v, g, beta, scale=scale, index=index, launch=plan, wy=None)
    extra = {"kg": ks, "gc": gs} if gate_vector else {}
    tt = cb.wy_inverse(k, g, beta, index=index, gate_vector=gate_vector, launch=plan, **extra)
    h, v_new, dh, dv_new = cb._state_pass(qs, ks, w, u, gs, aqk, do, index=index, gate_vector=gate_vector, scale=scale,
                                          h0=None, dht=None, dh0=None, launch=plan, split_chunks=None, states=True)  # fmt: skip
    return {"tt": tt, "w": w, "u": u, "h": h, "dh": dh, "v_new": v_new, "dv_new": dv_new, "index": index}


def timer(dry_run: bool):  # noqa: ANN201
    if dry_run:

        def bench(fn) -> float:  # noqa: ANN001
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

        return bench
    import triton.testing

    return lambda fn: triton.testing.do_bench(fn)


def pair_split(fn, reps: int = 10) -> dict[str, float]:  # noqa: ANN001
    """Per kernel of the pair, the device ms per call (torch.profiler over `reps` calls)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {"chunk_bwd_dqk": 0.0, "wy_bwd": 0.0}
    for e in prof.key_averages():
        for name in out:
            if e.key.startswith(f"{name}_kernel"):
                out[name] += e.device_time_total / 1e3 / reps  # us -> ms
    return out


def step_ms(op: str, xs, do, plan: LaunchPlan, bench) -> tuple[float, float]:  # noqa: ANN001
    """(the training step's median ms, its peak allocated GB above what was allocated before it)."""
    leaves = [x.detach().clone().requires_grad_() for x in xs]

    def step() -> None:
        o, _ = kernels.forward(op, *leaves, backend="triton", plan=plan)
        o.backward(do)

    ms = bench(step)
    for x in leaves:
        x.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return ms, (torch.cuda.max_memory_allocated() - base) / 1e9


def git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_shape(op: str, B: int, T: int, H: int, HV: int, K: int, *, device: str, dry_run: bool) -> list[dict[str, Any]]:
    dtype = torch.float32 if dry_run else torch.bfloat16
    bench = timer(dry_run)
    scale = K**-0.5
    q, k, v, g, beta, do = inputs(op, B, T, H, HV, K, device, dtype)
    im = intermediates(op, q, k, v, g, beta, do, scale=scale)
    common = {"op": op, "B": B, "T": T, "H": H, "HV": HV}
    floors = {
        n: floor_ms(bwd_launcher_bytes(op, n, B, T, HV, K, K), float("nan"), 0.0)["bytes_ms"]
        for n in ("dqk", "wy_bwd", "dqk_wy")
    }
    args = {"scale": scale, "index": im["index"], "gate_vector": op == "kda"}
    rows: list[dict[str, Any]] = []

    def pair(plan: LaunchPlan):  # noqa: ANN202
        return lambda: cb.pair_grads(q, k, v, g, beta, im["tt"], im["w"], im["u"], im["h"], im["dh"], im["v_new"],
                                     im["dv_new"], do, launch=plan, **args)  # fmt: skip

    def fused(plan: LaunchPlan):  # noqa: ANN202
        return lambda: dqk_wy_bwd(q, k, v, g, beta, im["tt"], im["h"], im["dh"], im["v_new"], im["dv_new"], do,
                                  dot_prec=cb.VECTOR_GATE_DOT, launch=plan, **args)  # fmt: skip

    ref = pair(LaunchPlan())()
    for name, cfg in PAIR_CONFIGS.items():
        plan = LaunchPlan(configs={n: LaunchConfig(**cfg) for n in ("chunk_bwd_dqk", "wy_bwd")} if cfg else {})
        row = {
            **common,
            "kernel": "pair",
            "config": name,
            "ms": bench(pair(plan)),
            "floor_ms": floors["dqk"] + floors["wy_bwd"],
        }
        if not dry_run:
            split = pair_split(pair(plan))
            row |= {"dqk_ms": split["chunk_bwd_dqk"], "dqk_floor_ms": floors["dqk"], "wy_bwd_ms": split["wy_bwd"],
                    "wy_bwd_floor_ms": floors["wy_bwd"]}  # fmt: skip
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)
    for name, cfg in FUSED_CONFIGS.items():
        if op == "kda" and cfg.get("BK") == 128:
            continue  # the per-key decayed products' [4, 64, BK] tiles at BK 128: past the register budget
        plan = LaunchPlan(configs={"chunk_bwd_dqk_wy": LaunchConfig(**cfg)} if cfg else {})
        got = fused(plan)()
        err = {f"rel_{n}": rel_l2(a.float(), b.float()) for n, a, b in zip(NAMES, got, ref, strict=True)}
        rows.append(
            {**common, "kernel": "fused", "config": name, "ms": bench(fused(plan)), "floor_ms": floors["dqk_wy"], **err}
        )
        print(json.dumps(rows[-1]), flush=True)
    if not dry_run:
        for grads in ("pair", "fused"):
            ms, peak = step_ms(op, (q, k, v, g, beta), do, LaunchPlan(bwd_grads=grads), bench)
            rows.append({**common, "kernel": f"step_{grads}", "config": "default", "ms": ms, "peak_GB": peak})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| op | shape | kernel | config | ms | bytes floor ms | x floor | dqk ms (floor) | wy_bwd ms (floor) | max rel_l2 vs pair |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        shape = f"{r['B']}x{r['T']} HV={r['HV']}"
        fl = r.get("floor_ms")
        split = (
            (f"{r['dqk_ms']:.3f} ({r['dqk_floor_ms']:.3f})", f"{r['wy_bwd_ms']:.3f} ({r['wy_bwd_floor_ms']:.3f})")
            if "dqk_ms" in r
            else ("", "")
        )
        err = max((v for n, v in r.items() if n.startswith("rel_")), default=None)
        lines.append(
            f"| {r['op']} | {shape} | {r['kernel']} | {r['config']} | {r['ms']:.3f} | {fl:.3f} | {r['ms'] / fl:.2f} | "
            f"{split[0]} | {split[1]} | {'' if err is None else f'{err:.1e}'} |"
            if fl
            else f"| {r['op']} | {shape} | {r['kernel']} | {r['config']} | {r['ms']:.3f} | | | | | peak {r.get('peak_GB', 0):.2f} GB |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--shapes", nargs="+", default=["1x65536", "1x131072", "8x8192"], help="BxT")
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=None, help="value heads (default H)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU and tiny shapes (1x100, H=1, K=32): plumbing only")
    args = ap.parse_args()
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    H, K = (1, 32) if dry else (args.H, 128)
    HV = 2 * H if dry else (args.HV or H)
    shapes = [(1, 100)] if dry else [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    import triton

    meta = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if not dry else "cpu (interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "sha": git_sha(),
        "K": K,
        "V": K,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = f"# The backward's gradient kernels: the pair vs the fused kernel ({meta['device']})\n\n"
    head += "".join(f"- {k}: `{v}`\n" for k, v in meta.items()) + "\n"
    rows: list[dict[str, Any]] = []
    for op in args.ops:
        for B, T in shapes:
            rows += run_shape(op, B, T, H, HV, K, device=device, dry_run=dry)
            # written after each shape: a run stopped at its time limit keeps what it measured
            (out / "dqk_wy_lab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
            (out / "dqk_wy_lab.md").write_text(head + table(rows) + "\n")


if __name__ == "__main__":
    main()
