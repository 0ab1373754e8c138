"""The backward's gradient kernels on the GPU: the pair `chunk_bwd_dqk` + `wy_bwd` (`kernels.common.chunk_bwd.
pair_grads`) against the fused `chunk_bwd_dqk_wy` (`kernels.common.dqk_wy_bwd`), on the same intermediates, per op.

    python3 benchmarks/dqk_wy_lab.py --out $OUT [--ops gdn kda] [--shapes 1x65536 1x131072 8x8192] [--H 16] [--HV 16]
        [--configs [gdn:|kda:]NAME|all|JSON ...] [--pair-configs default w8 bk32_w8 bk16_w4 | none] [--no-split]
        [--no-step]
        [--precompile N] [--deadline-s S]
    TRITON_INTERPRET=1 python3 benchmarks/dqk_wy_lab.py --out /tmp/lab --dry-run   # plumbing on the CPU

bf16 inputs, K = V = 128, 64-token chunks, gates logsigmoid(randn) (GDN [B, T, HV], KDA [B, T, HV, K]), fp32. The
intermediates (T, h, dh, v_new, dv_new, w, u) come from the backward's own steps 1-2 (`chunk_bwd`'s recompute and
reverse state pass). Per op and shape:
- `pair` at `--pair-configs` and `fused` at each of `--configs` (names of `FUSED_CONFIGS`, `all`, or JSON such as
  '{"BK": 32, "BV": 32, "num_warps": 8, "num_stages": 2}': launch fields only, the kernel has no code variants), timed
  alone (`triton.testing.do_bench` median, ms), beside the bytes floor at 4.2 TB/s
  (`runners.bench.floors.bwd_launcher_bytes`: every tensor a launcher reads or writes once); the pair's split per
  kernel from the profiler (`chunk_bwd_dqk`, `wy_bwd`, each beside its own floor) unless `--no-split`;
- the fused gradients against the pair's at its default config (rel_l2 per gradient: the bf16 rounding of two orders
  of summation; the budget is 5e-3 for every gradient: `ok`);
- unless `--no-step`, the whole training step (forward + backward, `kernels.forward`, recompute policy "inputs") with
  each: median ms and the peak allocated above the inputs (GB).
A config prefixed `gdn:` or `kda:` runs for that op only. `--precompile N`: the fused configs are compiled first in N
worker processes (`warm_one`), while the main process makes the intermediates. `--deadline-s`: no config starts after
that many seconds. Prints one JSON line per row; writes $OUT/dqk_wy_lab.json and $OUT/dqk_wy_lab.md after each shape.

The candidates of FUSED_CONFIGS since session 12: the configs the compiler reports spill-free or at two or three
programs per SM; their registers, spills and occupancy (`ptxas_report.py`) are tabled in kernels/NOTES.md ("The fused
gradient kernel's registers and occupancy"), with the H200 command. Session 12's code variants (phased K-block body,
register caps) were removed after the H200 measured each slower than the default (`results/dqk_wy_configs_h200.md`);
their names (`REMOVED_CONFIGS`) and a JSON VARIANT are refused with that reason.
"""

from __future__ import annotations

import argparse
import json
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
from runners.versions import git_sha  # noqa: E402

NAMES = ("dq", "dk", "dv", "dg", "dbeta")
# the pair's configs (the default; the tuned KDA config of the shipped file, 8 warps) and the fused kernel's
W8, W4 = {"num_warps": 8, "num_stages": 2}, {"num_warps": 4, "num_stages": 2}
# the pair's configs (both kernels alike); session 29: the two that spill nothing in both of KDA's kernels
# (`results/ptxas_kda_bwd_s29_sm90.md`; the shipped chunk_bwd_dqk config, w8, spills 496 B a thread there)
PAIR_CONFIGS = {"default": {}, "w8": {"BK": 64, "BV": 64, **W8}, "bk32_w8": {"BK": 32, "BV": 32, **W8},
                "bk16_w4": {"BK": 16, "BV": 32, **W4}}  # fmt: skip
FUSED_CONFIGS = {
    "default": {},  # BK = BV = 64, 8 warps
    "w4": {"BK": 64, "BV": 64, **W4},
    "bk32_w8": {"BK": 32, "BV": 32, **W8},
    "bk128_w8": {"BK": 128, "BV": 64, **W8},
    # session 12: the configs the compiler reports spill-free or at two or three programs per SM (module docstring)
    "bk32_bv64_w8": {"BK": 32, "BV": 64, **W8},
    "bk32_w4": {"BK": 32, "BV": 32, **W4},
}
# session 12's code variants (phased K-block body, register caps), removed after the H200 measured them slower
REMOVED_CONFIGS = ("phased", "phased_r128", "r128", "bk32_phased", "bk32_phased_r128", "bk32_w4_phased",
                   "bk32_w4_phased_r168", "bk32_w4_phased_r128")  # fmt: skip
REMOVED_WHY = ("chunk_bwd_dqk_wy has no code variants since session 13: phased and the register caps (regs128, "
               "regs168) were removed after the H200 measured each slower than the default "
               "(benchmarks/results/dqk_wy_configs_h200.md)")  # fmt: skip
BUDGET = 5e-3  # rel_l2 of every bf16 gradient against the pair's


def launch_config(cfg: dict[str, Any]) -> LaunchConfig | None:
    """The LaunchConfig of a lab config (launch fields; a VARIANT refused: `REMOVED_WHY`); None: the default."""
    if not cfg:
        return None
    if "VARIANT" in cfg:
        raise SystemExit(f"fused config {cfg}: {REMOVED_WHY}")
    return LaunchConfig(**cfg)


def parse_configs(specs: list[str], ops: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """--configs per op: each spec a name of FUSED_CONFIGS, "all", or a JSON object (named by its JSON), for every op,
    or for one op when prefixed "gdn:" / "kda:". KDA leaves out BK = 128 (the per-key decayed products' [4, 64, BK]
    tiles: past the register budget)."""
    out: dict[str, dict[str, dict[str, Any]]] = {op: {} for op in ops}
    for spec in specs:
        only, _, body = spec.partition(":") if spec.split(":", 1)[0] in ("gdn", "kda") else ("", "", spec)
        if body == "all":
            found = dict(FUSED_CONFIGS)
        elif body.lstrip().startswith("{"):
            found = {body.replace(" ", ""): json.loads(body)}
        elif body in FUSED_CONFIGS:
            found = {body: FUSED_CONFIGS[body]}
        elif body in REMOVED_CONFIGS:
            raise SystemExit(f"fused config {spec!r} removed: {REMOVED_WHY}")
        else:
            raise SystemExit(f"unknown fused config {spec!r}; the names are {sorted(FUSED_CONFIGS)}")
        for cfg in found.values():
            launch_config(cfg)  # refuses unknown fields or a VARIANT before any device work
        for op in out:
            if only in ("", op):
                out[op] |= {n: c for n, c in found.items() if not (op == "kda" and c.get("BK") == 128)}
    return out


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


def warm_one(op: str, H: int, HV: int, K: int, device: str, cfg: dict[str, Any]) -> None:
    """Compile the fused kernel at one config (and run it once) on random stand-ins for the intermediates, two chunks:
    the kernel specialises on neither T nor the values, so this fills Triton's cache for the timed run (`--precompile`
    runs it in worker processes, one config each)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    B, T, BT = 1, 128, 64
    q, k, v, g, beta, do = inputs(op, B, T, H, HV, K, device, dtype)
    index = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=BT, device=torch.device(device))

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    tt, v_new, dv_new = rand(B, T, HV, BT), rand(B, T, HV, K), rand(B, T, HV, K)
    h, dh = rand(T // BT, HV, K, K), rand(T // BT, HV, K, K)
    lc = launch_config(cfg)
    plan = LaunchPlan(configs={"chunk_bwd_dqk_wy": lc} if lc else {})
    dqk_wy_bwd(q, k, v, g, beta, tt, h, dh, v_new, dv_new, do, scale=K**-0.5, index=index, gate_vector=op == "kda",
               dot_prec=cb.VECTOR_GATE_DOT, launch=plan)  # fmt: skip
    if device != "cpu":
        torch.cuda.synchronize()


def precompile(configs: dict[str, dict[str, dict[str, Any]]], workers: int, *, H: int, HV: int, K: int,
               device: str) -> tuple[Any, dict[tuple[str, str], Any]]:  # fmt: skip
    """Submit `warm_one` for every (op, config) to a pool of `workers` spawned processes: (the pool, the futures)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {
        (op, name): pool.submit(warm_one, op, H, HV, K, device, cfg)
        for op, cfgs in configs.items()
        for name, cfg in cfgs.items()
    }
    return pool, futures


def timer(dry_run: bool):  # noqa: ANN201
    if dry_run:

        def bench(fn) -> float:  # noqa: ANN001
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

        return bench
    import triton.testing

    def bench_gpu(fn) -> float:  # noqa: ANN001
        fn()
        kernels.wait_for_builds()  # the TileLang kernels a first call left building: never time a mix
        return triton.testing.do_bench(fn)

    return bench_gpu


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


def run_shape(op: str, B: int, T: int, H: int, HV: int, K: int, *, device: str, dry_run: bool,
              fused_configs: dict[str, dict[str, Any]], pair_configs: list[str], split: bool, step: bool,
              deadline: float, warm: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
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

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    ref = pair(LaunchPlan())()
    t0 = time.monotonic()
    for name, fut in (warm or {}).items():  # the compiles in the worker processes: done before anything is timed
        left = deadline - time.monotonic()
        try:
            fut.result(timeout=max(left, 1.0) if left < float("inf") else None)
        except Exception as err:  # noqa: BLE001  (the timed launch reports it as the config's row)
            print(json.dumps({**common, "precompile_failed": name, "why": str(err).splitlines()[0][:200]}), flush=True)
    if warm:
        print(json.dumps({**common, "precompile_wait_s": round(time.monotonic() - t0, 1)}), flush=True)
    for name in pair_configs:
        if time.monotonic() > deadline:
            break
        cfg = PAIR_CONFIGS[name]
        plan = LaunchPlan(configs={n: LaunchConfig(**cfg) for n in ("chunk_bwd_dqk", "wy_bwd")} if cfg else {})
        ms, fl = bench(pair(plan)), floors["dqk"] + floors["wy_bwd"]
        row = {**common, "kernel": "pair", "config": name, "ms": ms, "floor_ms": fl, "x_floor": ms / fl}
        if split and not dry_run:
            parts = pair_split(pair(plan))
            row |= {"dqk_ms": parts["chunk_bwd_dqk"], "dqk_floor_ms": floors["dqk"], "wy_bwd_ms": parts["wy_bwd"],
                    "wy_bwd_floor_ms": floors["wy_bwd"]}  # fmt: skip
        emit(row)
    for name, cfg in fused_configs.items():
        if time.monotonic() > deadline:
            print(json.dumps({**common, "skipped": name, "why": "deadline"}), flush=True)
            continue
        lc = launch_config(cfg)
        plan = LaunchPlan(configs={"chunk_bwd_dqk_wy": lc} if lc else {})
        try:
            got = fused(plan)()
        except Exception as err:  # a config the compiler or the device refuses is a row, not the end of the run
            emit(
                {
                    **common,
                    "kernel": "fused",
                    "config": name,
                    "error": str(err).splitlines()[0][:200] if str(err) else repr(err),
                }
            )
            continue
        err = {f"rel_{n}": rel_l2(a.float(), b.float()) for n, a, b in zip(NAMES, got, ref, strict=True)}
        worst = max(err.values())
        ms = bench(fused(plan))
        emit({**common, "kernel": "fused", "config": name, "launch": lc.as_dict() if lc else {}, "ms": ms,
              "floor_ms": floors["dqk_wy"], "x_floor": ms / floors["dqk_wy"], **err, "max_rel": worst,
              "ok": worst <= BUDGET})  # fmt: skip
    if step and not dry_run:
        for grads in ("pair", "fused"):
            if time.monotonic() > deadline:
                break
            ms, peak = step_ms(op, (q, k, v, g, beta), do, LaunchPlan(bwd_grads=grads), bench)
            emit({**common, "kernel": f"step_{grads}", "config": "default", "ms": ms, "peak_GB": peak})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| op | shape | kernel | config | ms | bytes floor ms | x floor | dqk ms (floor) | wy_bwd ms (floor) | max rel_l2 vs pair |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        shape = f"{r['B']}x{r['T']} HV={r['HV']}"
        if "error" in r:
            lines.append(f"| {r['op']} | {shape} | {r['kernel']} | {r['config']} | error: {r['error'][:80]} | | | | | |")
            continue
        fl = r.get("floor_ms")
        split = (
            (f"{r['dqk_ms']:.3f} ({r['dqk_floor_ms']:.3f})", f"{r['wy_bwd_ms']:.3f} ({r['wy_bwd_floor_ms']:.3f})")
            if "dqk_ms" in r
            else ("", "")
        )
        err = r.get("max_rel")
        lines.append(
            f"| {r['op']} | {shape} | {r['kernel']} | {r['config']} | {r['ms']:.3f} | {fl:.3f} | {r['ms'] / fl:.2f} | "
            f"{split[0]} | {split[1]} | {'' if err is None else f'{err:.1e}'} |"
            if fl
            else f"| {r['op']} | {shape} | {r['kernel']} | {r['config']} | {r['ms']:.3f} | | | | | "
            + (f"peak {r['peak_GB']:.2f} GB |" if "peak_GB" in r else "|")
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--shapes", nargs="+", default=["1x65536", "1x131072", "8x8192"], help="BxT")
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=None, help="value heads (default H)")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["default", "w4", "bk32_w8", "bk128_w8"],
        help="fused kernel configs: names of FUSED_CONFIGS, 'all', or JSON objects; 'gdn:' or 'kda:' before one: that op only",
    )
    ap.add_argument("--pair-configs", nargs="+", default=list(PAIR_CONFIGS), choices=[*PAIR_CONFIGS, "none"])
    ap.add_argument("--no-split", action="store_true", help="no per-kernel profile of the pair")
    ap.add_argument("--no-step", action="store_true", help="no training-step timing")
    ap.add_argument("--deadline-s", type=float, default=float("inf"), help="start no config after this many seconds")
    ap.add_argument(
        "--precompile",
        type=int,
        default=0,
        metavar="N",
        help="compile the fused configs in N worker processes first (0: each in turn, when timed)",
    )
    ap.add_argument("--dry-run", action="store_true", help="the CPU and tiny shapes (1x100, H=1, K=32): plumbing only")
    args = ap.parse_args()
    deadline = time.monotonic() + args.deadline_s
    fused_configs = parse_configs(args.configs, args.ops)
    pair_configs = [n for n in args.pair_configs if n != "none"]
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
        "sha": git_sha() or "unknown",
        "K": K,
        "V": K,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = f"# The backward's gradient kernels: the pair vs the fused kernel ({meta['device']})\n\n"
    head += "".join(f"- {k}: `{v}`\n" for k, v in meta.items()) + "\n"
    rows: list[dict[str, Any]] = []
    pool, futures = (
        precompile(fused_configs, args.precompile, H=H, HV=HV, K=K, device=device) if args.precompile else (None, {})
    )
    for op in args.ops:
        for B, T in shapes:
            rows += run_shape(op, B, T, H, HV, K, device=device, dry_run=dry, fused_configs=fused_configs[op],
                              pair_configs=pair_configs, split=not args.no_split, step=not args.no_step,
                              deadline=deadline, warm={n: f for (o, n), f in futures.items() if o == op})  # fmt: skip
            # written after each shape: a run stopped at its time limit keeps what it measured
            (out / "dqk_wy_lab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
            (out / "dqk_wy_lab.md").write_text(head + table(rows) + "\n")
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main()
