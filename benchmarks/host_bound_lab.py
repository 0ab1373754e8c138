"""Is a short training step waiting on the host? Per shape and variant: the step's GPU time (do_bench median), the
host's time to issue one step (wall clock of back-to-back calls, no sync), the kernels' sum (torch profiler), the
step's peak memory above its inputs (`torch.cuda.max_memory_allocated`), the launches and ATen ops it issues
(`host_calls.count_step`), and its gradients against the default's.

Why (issue 26, session 16): on the H200 GDN's step at 1x8K took 2.82 ms for 1.34 ms of kernels
(`results/kernels_train_issue26_h200.md`), while from 32K on the step equals its kernel sum. The variants:
- `default`: the registry's plan (the warm split decides the sequence split; since session 18 GDN's default recompute
  policy keeps its Ag pass's outputs, `kernels.vocabulary.AUTO_KEEP`);
- `inputs` (session 18): the recompute policy "inputs", the default until session 18: the forward keeps nothing but its
  split's segment states, the backward runs the WY prep and the inverse again;
- `nosplit`: `split_chunks=0` in both passes (one chain per head: fewer launches, longer serial walks);
- `wy+states`: the forward keeps its WY factors and states (fewer backward launches, more memory held);
- `old-host` (session 17): the default before session 17's host cuts ("inputs"), in the same process: the backward recomputes the
  split's segment states (no `seg_states`) and each launch runs Triton's own `Heuristics.run` (an argument dict per
  entry);
- `api` (session 20): the same default through the public op `kernels.chunk_gdn` (its validation, dispatch and
  autograd node), the only step of grouped value heads (`--hv`, HV > H: every variant then runs as `api`; session
  20's HV=32 1x8K step took 3.48 ms for ~2.05 ms of kernels);
- `wy`, `ag+states` (session 21): those recompute policies. Session 20's bench train timed `wy` at 1.28 ms and the
  default at 2.59 ms at 1x8K in one process, for about the same launches and ATen ops (14 / 32 against 15 / 43).
On CUDA each row also gets a timeline (`timeline`: the GPU's busy fraction, the largest gaps between kernels, the
CUDA runtime calls that may block, and the synchronizing calls `torch.cuda.set_sync_debug_mode` reports), listed
under the table: what a step slower than its kernels waits on.

    python3 benchmarks/host_bound_lab.py --out $OUT [--shapes 1x8192,1x16384,1x32768] [--variants default,nosplit,wy+states]
        [--hv 32]
        [--profile 20]   # and where the host's time goes: cProfile over 20 steps per shape and variant, and what one
                         # bare Triton launch and one `torch.empty` cost on this host (host_profile.txt)
    TRITON_INTERPRET=1 python3 benchmarks/host_bound_lab.py --out /tmp/hb --dry-run   # plumbing on the CPU

bf16 on CUDA (fp32, H=1, K=V=32, T=128 in a dry run), H=16, K=V=128, lb -1. Writes $OUT/host_bound_lab.{json,md}
after each shape. A variant whose gradients differ from the default's by more than 5e-3 (rel_l2) is flagged `ok`
False.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "inputs": {"policy": "inputs"},
    "old-host": {"policy": "inputs", "seg_states": False, "triton_heuristics": True},
    "nosplit": {"split_chunks": 0},
    "wy+states": {"policy": "wy+states"},
    "wy": {"policy": "wy"},  # (session 21) the WY factors kept, no states: session 20 timed it 2x faster at 1x8K
    "ag+states": {"policy": "ag+states"},
    "api": {"api": True},  # (session 20) the public op `kernels.chunk_gdn` (validate, dispatch, autograd node)
    # (session 24) the TileLang reverse-walk backward (`LaunchPlan.bwd_grads="reverse"`; CUDA only: a dry run leaves
    # it out, and its launches are not counted, the walk being no Triton launch)
    "reverse": {"bwd_grads": "reverse", "cuda_only": True},
    "ag+states:reverse": {"policy": "ag+states", "bwd_grads": "reverse", "cuda_only": True},
}
BUDGET = 5e-3
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def host_issue_ms(step: Any, args: tuple[Any, ...], cuda: bool, n: int = 20, reps: int = 3) -> float:
    """Median wall ms the host spends issuing one step, over n back-to-back steps after a sync (the GPU's queue
    absorbs the launches, so this is the host's own cost unless the queue fills)."""
    import torch

    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step(*args)
        times.append((time.perf_counter() - t0) * 1e3 / n)
        if cuda:
            torch.cuda.synchronize()
    return statistics.median(times)


def host_profile(step: Any, args: tuple[Any, ...], cuda: bool, n: int) -> str:
    """cProfile of n back-to-back steps (after a sync): the top functions by own time and by cumulative time."""
    import cProfile
    import io
    import pstats

    import torch

    if cuda:
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step(*args)
    prof.disable()
    if cuda:
        torch.cuda.synchronize()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(35)
    return buf.getvalue()


RUNTIME_SYNCS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMalloc",
    "cudaFree",
    "cudaHostAlloc",
    "cudaMemset",
)


def busy_and_gaps(kernels: list[tuple[float, float, str]]) -> tuple[float, float, list[tuple[float, str, str]]]:
    """(busy, span, gaps) of kernel intervals (start, end, name), in their time unit: the union of the intervals, the
    first start to the last end, and each idle gap (length, the kernel that ended last before it, the one after it),
    longest first."""
    busy, gaps, end = 0.0, [], None
    for s, e, name in sorted(kernels):
        if end is not None and s > end[0]:
            gaps.append((s - end[0], end[1], name))
        busy += max(0.0, e - (s if end is None else max(s, end[0])))
        if end is None or e > end[0]:
            end = (e, name)
    span = max(e for _, e, _ in kernels) - min(s for s, _, _ in kernels) if kernels else 0.0
    return busy, span, sorted(gaps, key=lambda x: -x[0])


def timeline(step: Any, args: tuple[Any, ...], n: int = 5) -> dict[str, Any]:
    """(session 21) Where a step that is slower than its kernels waits, from one torch profiler trace of n
    back-to-back steps (after a sync): the GPU's busy fraction of the kernels' span, the largest idle gaps between
    kernels (ms, with the kernels either side), the CUDA runtime calls per step that may block the host or the stream
    (`RUNTIME_SYNCS`: synchronizes, copies, mallocs, memsets) and the synchronizing calls per step that
    `torch.cuda.set_sync_debug_mode("warn")` reports. The profiler's CPU tracing slows the host, so the span is
    longer than the step's do_bench time: the fractions and gaps compare variants, not absolute times."""
    import collections
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    step(*args)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(*args)
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = collections.Counter(str(w.message).splitlines()[0][:80] for w in caught)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step(*args)
        torch.cuda.synchronize()
    kernels, runtime = [], collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((e.time_range.start, e.time_range.end, e.name.split("(")[0][:48]))
        elif e.name.startswith(RUNTIME_SYNCS):
            runtime[e.name] += 1
    busy, span, gaps = busy_and_gaps(kernels)
    return {
        "gpu_busy": busy / span if span else 0.0,
        "span_ms": span / 1e3 / n,
        "gaps": [f"{us / 1e3:.3f} {a} -> {b}" for us, a, b in gaps[:4]],
        "runtime_calls": {k: v / n for k, v in runtime.items()},
        "sync_warnings": dict(syncs),
    }


def launch_floor_us(device: str, n: int = 2000) -> dict[str, float]:
    """Host µs per call, no sync, of: one launch of a trivial Triton kernel with 12 tensor and 4 int arguments, the
    same through `triton.heuristics` (as most of ours), and `torch.empty` of 1 KB (one ATen op)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _touch(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, n0, n1, n2, n3, B: tl.constexpr):
        tl.store(a0 + tl.arange(0, B), tl.arange(0, B).to(tl.float32) + n0 + n1 + n2 + n3)

    touch_h = triton.heuristics({"B": lambda args: 16})(_touch)
    ts = [torch.zeros(64, device=device) for _ in range(12)]

    def per_call(fn: Any) -> float:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) * 1e6 / n
        if device == "cuda":
            torch.cuda.synchronize()
        return dt

    return {
        "triton_launch_us": per_call(lambda: _touch[(1,)](*ts, 1, 2, 3, 4, B=16)),
        "triton_heuristics_launch_us": per_call(lambda: touch_h[(1,)](*ts, 1, 2, 3, 4)),
        "torch_empty_us": per_call(lambda: torch.empty(256, device=device)),
    }


@contextlib.contextmanager
def triton_heuristics(on: bool) -> Iterator[None]:
    """While on: our kernels' heuristics run Triton's own `Heuristics.run` (one argument dict per entry)."""
    from triton.runtime.autotuner import Heuristics

    from kernels.common import chunk_program

    ours = chunk_program._Heuristics.run
    if on:
        chunk_program._Heuristics.run = Heuristics.run  # type: ignore[method-assign]
    try:
        yield
    finally:
        chunk_program._Heuristics.run = ours  # type: ignore[method-assign]


def flat(out: Any) -> list[Any]:
    """(o, (dq, dk, dv, dg, dbeta, dh0)) of `ours_step` -> [o, dq, dk, dv, dg, dbeta]."""
    o, grads = out
    return [o, *grads[:5]]


def run_shape(
    B: int,
    T: int,
    variants: list[str],
    *,
    dry_run: bool,
    profile: int = 0,
    profiles: dict[str, str] | None = None,
    HV: int | None = None,
) -> list[dict[str, Any]]:

    import kernels
    from benchmarks.host_calls import count_step
    from runners.bench.kernels_ops import fla_inputs
    from runners.bench.kernels_train import kernel_times, ours_api_step, ours_step, peak_mb, timed
    from runners.correctness import rel_l2

    cuda = not dry_run
    H, K = (1, 32) if dry_run else (16, 128)
    wl = fla_inputs(
        "gdn",
        B,
        T,
        H,
        device="cuda" if cuda else "cpu",
        dtype="float32" if dry_run else "bfloat16",
        grad_out=True,
        lb=-1.0,
        K=K,
        V=K,
        HV=HV,
    )
    args = (wl.q, wl.k, wl.v, wl.g, wl.beta, wl.do)
    rows, ref = [], None
    grouped = (HV or H) != H
    for name in variants:
        v = VARIANTS[name]
        api = grouped or v.get("api", False)
        if api:
            inner = ours_api_step("gdn")
        else:
            inner = ours_step(
                "gdn",
                policy=v.get("policy", "auto"),
                split_chunks=v.get("split_chunks"),
                seg_states=v.get("seg_states", True),
                bwd_grads=v.get("bwd_grads"),
            )

        def step(*xs: Any, inner: Any = inner, heur: bool = v.get("triton_heuristics", False)) -> Any:
            with triton_heuristics(heur):
                return inner(*xs)

        got = [t.float() for t in flat(step(*args))]
        kernels.wait_for_builds()  # the TileLang kernels that first call left building: never time a mix
        ref = ref or got
        err = {f"rel_{n}": rel_l2(a, b) for n, a, b in zip(NAMES, got, ref, strict=True)}
        counts = (
            {"n_launches": None, "n_aten_ops": None}
            if v.get("cuda_only")
            else count_step(
                "gdn",
                B,
                T,
                H,
                policy=v.get("policy", "auto"),
                sms=132,
                K=K,
                V=K,
                split_chunks=v.get("split_chunks"),
                seg_states=v.get("seg_states", True),
                HV=HV,
                api=api,
            )
        )
        row = {
            "B": B,
            "T": T,
            "H": H,
            "HV": HV or H,
            "variant": name if not grouped else f"{name} (api)",
            "launches": counts["n_launches"],
            "aten_ops": counts["n_aten_ops"],
            "host_ms": host_issue_ms(step, args, cuda, *((20, 3) if cuda else (1, 1))),
            **err,
            "ok": max(err.values()) <= BUDGET,
        }
        if cuda:
            row["step_ms"] = timed(lambda: step(*args))  # noqa: B023
            row["kernels_ms"] = sum(kernel_times(lambda: step(*args)).values())  # noqa: B023
            row["peak_MB"] = peak_mb(lambda: step(*args))  # noqa: B023
            row["timeline"] = timeline(step, args)
        if profile and profiles is not None:
            profiles[f"{B}x{T} {name}"] = host_profile(step, args, cuda, profile)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def timeline_notes(rows: list[dict[str, Any]]) -> str:
    """The timeline of each CUDA row (`timeline`) as a list under the table."""
    out = []
    for r in rows:
        t = r.get("timeline")
        if t:
            out.append(
                f"- {r['B']}x{r['T']} HV={r.get('HV', r['H'])} {r['variant']}: GPU busy {t['gpu_busy']:.0%} of "
                f"{t['span_ms']:.3f} ms a step; largest gaps (ms) {t['gaps']}; runtime calls per step "
                f"{t['runtime_calls']}; sync warnings {t['sync_warnings']}"
            )
    return "\n".join(out)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | HV | variant | step ms | kernels' sum ms | host issue ms | launches | ATen ops | peak MB | max rel_l2 vs default |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        errs = max(v for k, v in r.items() if k.startswith("rel_"))
        step = f"{r['step_ms']:.3f}" if "step_ms" in r else ""
        ks = f"{r['kernels_ms']:.3f}" if "kernels_ms" in r else ""
        peak = f"{r['peak_MB']:.0f}" if "peak_MB" in r else ""
        lines.append(
            f"| {r['B']}x{r['T']} | {r.get('HV', r['H'])} | {r['variant']} | {step} | {ks} | {r['host_ms']:.3f} | {r['launches']} | "
            f"{r['aten_ops']} | {peak} | {errs:.1e}{'' if r['ok'] else ' (over budget)'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x8192,1x16384,1x32768", help="BxT,...")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny shapes: plumbing only")
    ap.add_argument("--profile", type=int, default=0, help="cProfile this many steps per shape and variant (0: none)")
    ap.add_argument("--hv", type=int, default=None, help="value heads, a multiple of H=16 (grouped: the public op)")
    a = ap.parse_args()
    if a.hv is not None and (a.hv < 16 or a.hv % 16):
        ap.error(f"--hv must be a multiple of H=16, got {a.hv}")
    variants = a.variants.split(",")
    if bad := [v for v in variants if v not in VARIANTS]:
        ap.error(f"--variants: unknown {bad}; known: {', '.join(VARIANTS)}")
    if a.dry_run:  # the CPU: no TileLang walk
        variants = [v for v in variants if not VARIANTS[v].get("cuda_only")]
    try:
        shapes = [(1, 128)] if a.dry_run else [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    except ValueError:
        ap.error(f"--shapes: BxT,... (e.g. 1x8192), got {a.shapes!r}")
    import torch
    import triton

    from runners.versions import git_sha

    meta = {
        "command": " ".join(sys.argv),
        "device": "cpu (interpreter)" if a.dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "sha": git_sha() or "unknown",
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    if a.profile:
        meta["launch_floor"] = launch_floor_us("cpu" if a.dry_run else "cuda", n=20 if a.dry_run else 2000)
    for B, T in shapes:
        rows += run_shape(B, T, variants, dry_run=a.dry_run, profile=a.profile, profiles=profiles,
                          HV=None if a.dry_run or a.hv is None else a.hv)  # fmt: skip
        if profiles:
            text = "".join(f"## {k}\n\n{v}\n" for k, v in profiles.items())
            (out / "host_profile.txt").write_text(f"launch floor (host us per call): {meta['launch_floor']}\n\n{text}")
        (out / "host_bound_lab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        head = "# Host-bound steps: GDN at short T\n\n" + "".join(f"- {k}: `{v}`\n" for k, v in meta.items()) + "\n"
        (out / "host_bound_lab.md").write_text(head + table(rows) + "\n\n" + timeline_notes(rows) + "\n")


if __name__ == "__main__":
    main()
