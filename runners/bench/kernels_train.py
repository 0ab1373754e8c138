"""Forward+backward benchmark of our Triton GDN / KDA against FLA's `chunk_gated_delta_rule` / `chunk_kda` and
FlashQLA's GDN (GPU), all in one process.

    cpbench bench train [--ops gdn,kda] [--shapes 1x8192,...] [--hv 16,32] [--lb=-5,-1] [--preset issue26]
        [--peers fla,flash_qla] [--no-fla] [--deadline 540] [--out benchmarks/results/] [--autotune FILE]

Rows: shapes x HV x lb (`runners.bench.kernels_grid`, most important first; `--deadline` cuts the rest cleanly).
FlashQLA (`runners.bench.kernels_peers`, GDN only): `auto_cp=False` and its intra-card CP (its default `auto_cp=True`),
each step timed, with its first call, peak memory and the split it chose; where it cannot run, one line says why.
Ours' first call runs on Triton where the TileLang kernels its "auto" choices take are still building; every timing
waits for them first (`kernels.wait_for_builds`; the report names CPBENCH_TILELANG_BUILD's mode).

Per shape (bf16, H=16, K=V=128): ours ms (forward `chunk_*_fwd` + backward `chunk_*_bwd`, direct calls), FLA ms
(its autograd op, `o.backward(do)`), the ratio, the bytes floor of a forward+backward (FLA's count: 2828 B per
token-head for GDN, 3590 for KDA), the peak memory of one step above the inputs (ours and FLA's), our per-kernel
times (torch profiler, one step) for the miss analysis; our step under each other recompute policy
(`LaunchPlan.keep`: "inputs", "ag", "ag+states", "wy", "wy+states"; ours is "auto") with the MB each holds and its
peak; once per op, every gradient's rel_l2 vs
autograd through the fp32 per-token reference on a reduced shape, ours (each policy) and FLA's. `--autotune FILE`
applies an autotune JSON to ours (default: the registry's configs).

FLA 0.6.0 refuses its gated GDN backward on Hopper with Triton < 3.7.1 (its issue #640 guard, a version flag in
`fla.ops.common.chunk_o`): to time it anyway the flag is flipped before the first call and the table records the
bypass (`fla_hopper_guard_bypassed`); FLA's gradients are checked against the reference like ours. Ours needs no
bypass. Writes `<stem>.md` and `<stem>.json` (stem kernels_train_h200 on an H200) after every row, so a run cut
short keeps what it measured. FLA autotunes on its first call (on an H200 with a fresh Triton cache: about 4 min
for KDA's forward+backward, 1.5 min for GDN's); the gradient check runs at the timed shapes' H so that this
happens once per op. `--no-fla` measures ours alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import platform
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernels.builds import build_mode, first_call_note, wait_for_builds
from kernels.configs import LaunchConfig, get_spec
from kernels.plan import LaunchPlan, default_plan, plan_with, set_default_plan
from kernels.vocabulary import AG_PASSES, BWD_GRADS, FWD_PASSES, KEEP_POLICIES
from runners.bench import kernels_peers
from runners.bench.floors import BYTES_PER_TOKEN_HEAD, HBM_TBPS
from runners.bench.kernels_grid import PRESETS, SHAPE_ORDER, Deadline, expand_cases, parse_floats, parse_shapes
from runners.bench.kernels_ops import fla_inputs
from runners.bench.kernels_peers import FLASH_QLA_COLUMNS, FlashQLAColumns, first_call, flash_qla_reason, parse_peers
from runners.correctness import rel_l2
from runners.versions import driver_version, git_sha, peer_versions
from runners.workload import Workload

__all__ = ["BYTES_PER_TOKEN_HEAD", "main"]

SHAPES = SHAPE_ORDER
H, K, V = 16, 128, 128


def workload(op: str, B: int, T: int, Hh: int, *, device: str, seed: int = 0, HV: int | None = None,
             lb: float | None = None) -> Workload:
    """bf16 q, k (L2-normalised), v, beta = sigmoid(randn), g = logsigmoid(randn) (lb: lb * sigmoid(randn)), do:
    random, never zeros (FLA's recipe from the one maker, `runners.bench.kernels_ops.fla_inputs`); HV value heads."""
    w = fla_inputs(op, B, T, Hh, device=device, seed=seed, K=K, V=V, grad_out=True, HV=HV, lb=lb)
    assert w.do is not None  # asked for with grad_out
    return w


def make_inputs(op: str, B: int, T: int, Hh: int, *, device: str, seed: int = 0, HV: int | None = None,
                lb: float | None = None) -> tuple[torch.Tensor, ...]:
    """`workload`'s q, k, v, g, beta, do."""
    w = workload(op, B, T, Hh, device=device, seed=seed, HV=HV, lb=lb)
    assert w.do is not None  # asked for with grad_out
    return (*w.tensors, w.do)


POLICIES = KEEP_POLICIES[1:]  # the policies timed beside the default (KEEP_POLICIES[0], "auto": `AUTO_KEEP`'s per op)


def ours_step(op: str, configs: dict[str, LaunchConfig] | None = None, policy: str = "auto",
              bwd_grads: str | None = None, bwd_warm: int | None = None,
              warm_report: dict[str, torch.Tensor] | None = None, split_chunks: int | None = None,
              seg_states: bool = True) -> Callable[..., Any]:
    """Our forward + backward under a recompute policy (`LaunchPlan.keep`): "inputs" (recompute all), "ag" (GDN: the
    two-kernel forward's Ag and gate cumsum), "ag+states" (and its chunk states, v_new, segment maps), "wy" (the
    forward's WY factors handed to the backward), "wy+states" (and its chunk states, v_new, segment maps); and
    the backward's gradient kernels (`LaunchPlan.bwd_grads`; None: the plan's default, "auto"), its reverse pass's
    warm window (`LaunchPlan.bwd_warm`, chunks; 0 = exact; None: the plan's), a dict receiving its `certified` mask,
    and the sequence split of both passes (`split_chunks`: None automatic, 0 none, n segments of n chunks); seg_states:
    the forward hands its split's segment states to the backward (as the public op does; False: the backward
    recomputes them, as before session 17)."""
    import importlib

    fwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")
    bwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_bwd")
    plan = plan_with(None, configs or {}).replace(keep=policy)
    plan = plan if bwd_grads is None else plan.replace(bwd_grads=bwd_grads)
    plan = plan if bwd_warm is None else plan.replace(bwd_warm=bwd_warm)
    keep_wy, keep_states = plan.keeps(op)
    report = {} if warm_report is None else {"warm_report": warm_report}

    def step(q, k, v, g, beta, do):
        keep: dict[str, torch.Tensor] | None = {} if keep_wy else None
        seg: dict[str, Any] | None = {} if seg_states else None  # handed over as the public op's autograd node does
        o, _ = fwd(q, k, v, g, beta, scale=K**-0.5, plan=plan, keep=keep, keep_states=keep_states, split_chunks=split_chunks,
                   seg_states=seg)
        return o, bwd(q, k, v, g, beta, do, scale=K**-0.5, plan=plan, wy=keep or None, split_chunks=split_chunks,
                      seg_states=seg, **report)  # KDA under "ag": none kept

    return step


def held_mb(op: str, policy: str, q, k, v, g, beta) -> float:
    """MB the forward holds for the backward beyond its inputs under `policy` (the kept tensors)."""
    import importlib

    fwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")
    keep: dict[str, torch.Tensor] = {}
    plan = plan_with(None, {}).replace(keep=policy)
    fwd(q, k, v, g, beta, scale=K**-0.5, keep=keep, keep_states=plan.keeps(op)[1], plan=plan)
    return sum(t.numel() * t.element_size() for t in keep.values() if t.is_cuda) / 2**20


_FLA_BYPASS: list[bool] = []


def autograd_step(fn: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
    """A differentiable op's training step on fresh leaves: (o, the five input gradients)."""

    def step(q, k, v, g, beta, do):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, g, beta)]
        o, _ = fn(*leaves, scale=K**-0.5, **kw)
        o.backward(do)
        return o, [x.grad for x in leaves]

    return step


def ours_api_step(op: str) -> Callable[..., Any]:
    """Our public differentiable op (`kernels.chunk_gdn` / `chunk_kda`, backend triton): the step timed where the
    direct passes do not apply (grouped value heads, HV > H: the op's dispatch serves them)."""
    import kernels

    return autograd_step(kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda, backend="triton")


def fla_step(op: str) -> tuple[Callable[..., Any], bool]:
    """FLA's forward+backward and whether the Hopper guard had to be bypassed."""
    import fla.ops.common.chunk_o as chunk_o

    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        _FLA_BYPASS.append(True)  # process-wide: every later FLA call runs with the guard bypassed too
    bypassed = bool(_FLA_BYPASS)
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from fla.ops.kda import chunk_kda as fn
    return autograd_step(fn), bypassed


def timed(fn: Callable[[], Any]) -> float:
    """do_bench median (ms) after one untimed call and the TileLang builds it may have left running
    (`kernels.wait_for_builds`): never a mix of Triton and TileLang steps."""
    from triton.testing import do_bench

    fn()
    wait_for_builds()
    return float(do_bench(fn, warmup=10, rep=100))


def peak_mb(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def kernel_times(fn: Callable[[], Any]) -> dict[str, float]:
    """CUDA time per kernel name (ms) over one step, from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name.split("(")[0][:60]] += e.device_time_total / 1e3
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def gradient_check(op: str, device: str, T: int = 1024, Hh: int = H, fla: bool = True,
                   qla: FlashQLAColumns | None = None) -> dict[str, Any]:
    """Every gradient's rel_l2 (ours, FLA, FlashQLA's columns) vs autograd through the fp32 per-token reference, B=1,
    lb=-1. H as the timed shapes: FLA's autotune keys hold H (not T), so its first-call autotune (minutes) happens
    once, here; each library's first step here is timed (`first_call_s`: its compile on the cache it found)."""
    import importlib

    ref_fn = getattr(importlib.import_module("kernels.ops.gdn.naive" if op == "gdn" else "kernels.ops.kda.naive"),
                     f"naive_recurrent_{op}")
    wl = workload(op, 1, T, Hh, device=device, seed=7, lb=-1.0)
    q, k, v, g, beta = wl.tensors
    do = wl.do
    assert do is not None  # asked for with grad_out
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, g, beta)]
    o, _ = ref_fn(*leaves, scale=K**-0.5)
    o.backward(do.float())
    ref = [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]
    names = ("dq", "dk", "dv", "dg", "dbeta")
    res: dict[str, Any] = {"shape": f"B=1 T={T} H={Hh} lb=-1"}
    auto = LaunchPlan().keep_for(op)  # the default policy: timed and checked as "ours"
    steps: list[tuple[str, Callable[[], Any]]] = [
        (who, functools.partial(ours_step(op, policy=policy), q, k, v, g, beta, do))
        for who, policy in (("ours", "auto"), *((f"ours {p}", p) for p in POLICIES if p != auto))]
    if fla:
        steps.append(("fla", lambda: fla_step(op)[0](q, k, v, g, beta, do)))
    else:
        res["fla"] = {"error": "not run (--no-fla)"}
    if qla is not None:
        why = flash_qla_reason(op, H=Hh, HV=Hh, K=K, V=V)
        for col in FLASH_QLA_COLUMNS:
            if why:
                res[col] = {"error": why}
            else:
                steps.append((col, qla.step(col, wl, do)))
    for who, step in steps:
        try:
            (o_, grads), first = first_call(step, cuda=device == "cuda")
            res[who] = {"o": rel_l2(o_, o.detach()), **{n: rel_l2(a, r) for n, a, r in zip(names, grads[:5], ref, strict=True)},
                        "first_call_s": first}
        except Exception as err:  # a peer failing is a result, not a crash of our benchmark
            res[who] = {"error": repr(err)[:200]}
    return res


def run_shape(op: str, B: int, T: int, device: str, fla: bool = True, *, HV: int = H, lb: float | None = None,
              qla: FlashQLAColumns | None = None, also_grads: tuple[str, ...] = ()) -> dict[str, Any]:
    """One row: our step (the direct passes and the kept policies at HV = H; the public op at HV > H), FLA's, and
    FlashQLA's columns (or why not), each with its first call, peak memory and the floor; also_grads: the default
    policy's step again under each of these backward gradient kernels (`LaunchPlan.bwd_grads`), in this process
    (`rec["also_grads"]`: ms and peak MB, or the one line why not)."""
    wl = workload(op, B, T, H, device=device, HV=HV, lb=lb)
    q, k, v, g, beta = wl.tensors
    do = wl.do
    grouped = HV != H
    ours = ours_api_step(op) if grouped else ours_step(op)
    rec: dict[str, Any] = {"op": op, "B": B, "T": T, "H": H, "HV": HV, "lb": lb, "K": K, "V": V,
                           "ours_call": "kernels.chunk_" + op if grouped else f"chunk_{op}_fwd + chunk_{op}_bwd"}
    step = functools.partial(ours, q, k, v, g, beta, do)
    _, rec["ours_first_call_s"] = first_call(step, cuda=True)
    rec["ours_ms"] = timed(step)
    rec["ours_peak_MB"] = peak_mb(step)
    rec["ours_kernels_ms"] = kernel_times(step)
    rec["policies"] = {}
    auto = LaunchPlan().keep_for(op)
    for policy in POLICIES if not grouped else ():
        held = held_mb(op, policy, q, k, v, g, beta)
        if policy == auto:  # ours' own step ("auto"): its figures, not timed twice
            rec["policies"][policy] = {"ms": rec["ours_ms"], "held_MB": held, "peak_MB": rec["ours_peak_MB"]}
            continue
        kept = functools.partial(ours_step(op, policy=policy), q, k, v, g, beta, do)
        try:
            rec["policies"][policy] = {"ms": timed(kept), "held_MB": held, "peak_MB": peak_mb(kept)}
        except ValueError as err:  # a policy the chosen backward kernels refuse (--bwd-grads reverse needs Ag kept)
            rec["policies"][policy] = {"error": str(err)[:200]}
    rec["also_grads"] = {}
    for grads in also_grads if not grouped else ():
        alt = functools.partial(ours_step(op, bwd_grads=grads), q, k, v, g, beta, do)
        try:
            _, first = first_call(alt, cuda=True)
            rec["also_grads"][grads] = {"ms": timed(alt), "peak_MB": peak_mb(alt), "first_call_s": first}
        except ValueError as err:  # gradient kernels this op or shape refuses
            rec["also_grads"][grads] = {"error": str(err)[:200]}
    try:
        if not fla:
            raise RuntimeError("not run (--no-fla)")
        fla_fn, bypassed = fla_step(op)
        rec["fla_hopper_guard_bypassed"] = bypassed
        theirs = functools.partial(fla_fn, q, k, v, g, beta, do)
        _, rec["fla_first_call_s"] = first_call(theirs, cuda=True)
        rec["fla_ms"] = timed(theirs)
        rec["fla_peak_MB"] = peak_mb(theirs)
        rec["ratio"] = rec["ours_ms"] / rec["fla_ms"]
    except Exception as err:
        rec["fla_error"] = repr(err)[:300]
    if qla is not None:
        rec.update(flash_qla_steps(qla, op, wl, rec["ours_ms"]))
    rec["floor_bytes"] = BYTES_PER_TOKEN_HEAD[op] * B * T * HV
    rec["floor_ms"] = rec["floor_bytes"] / (HBM_TBPS * 1e12) * 1e3
    return rec


def flash_qla_steps(qla: FlashQLAColumns, op: str, wl: Workload, ours_ms: float) -> dict[str, Any]:
    """FlashQLA's training step per column (`FLASH_QLA_COLUMNS`): first call, ms, peak MB, ours / it, the split it
    chose; or the one line saying why it cannot run here."""
    why = flash_qla_reason(op, H=H, HV=wl.v.shape[2], K=K, V=V)
    if why:
        return {"flash_qla_reason": why}
    out: dict[str, Any] = {}
    assert wl.do is not None  # asked for with grad_out
    for col in FLASH_QLA_COLUMNS:
        try:
            step = qla.step(col, wl, wl.do)
            _, out[f"{col}_first_call_s"] = first_call(step, cuda=True)
            out[f"{col}_split"] = qla.split()
            out[f"{col}_ms"] = timed(step)
            out[f"{col}_peak_MB"] = peak_mb(step)
            out[f"{col}_kernels_ms"] = kernel_times(step)  # (session 21) where the peer's step goes, beside ours
            out[f"ratio_{col}"] = ours_ms / out[f"{col}_ms"]
        except Exception as err:  # FlashQLA failing is a result, not a crash of our benchmark
            out[f"{col}_error"] = repr(err)[:300]
    return out


# --explore: one backward kernel's config changed at a time from the defaults (the lead's tuner does the real search)
EXPLORE = {
    "chunk_bwd_dqk": ({"BK": 32}, {"num_warps": 8}, {"BK": 32, "num_warps": 8}, {"BV": 128}, {"num_stages": 1}),
    "wy_bwd": ({"num_warps": 2}, {"num_warps": 8}, {"BK": 128, "BV": 128}, {"num_stages": 1}),
    "chunk_state_bwd": ({"num_warps": 8}, {"num_stages": 2}, {"BV": 32, "num_stages": 2}),
    "wy_inverse": ({"num_warps": 2}, {"num_warps": 4}, {"BK": 64}),
}


def explore(op: str, B: int, T: int, device: str) -> list[dict[str, Any]]:
    """Step time with one backward kernel's config changed at a time (same inputs as `run_shape`)."""
    import dataclasses

    q, k, v, g, beta, do = make_inputs(op, B, T, H, device=device)
    rows = [{"kernel": "-", "change": "defaults", "ms": timed(lambda: ours_step(op)(q, k, v, g, beta, do))}]
    for name, changes in EXPLORE.items():
        for ch in changes:
            cfg = {name: dataclasses.replace(get_spec(name).default, **ch)}
            ms: float | str
            try:
                ms = timed(functools.partial(ours_step(op, cfg), q, k, v, g, beta, do))
            except Exception as err:
                ms = repr(err)[:100]
            rows.append({"kernel": name, "change": ch, "ms": ms})
    return rows


def env(args: argparse.Namespace) -> dict[str, Any]:
    import triton

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "runners.bench.kernels_train", *sys.argv[1:]]),
        "git_sha": args.sha or git_sha(), "driver": driver_version(),
    }
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        info["fla"] = None
    info.update(peer_versions(), tilelang_build=build_mode())  # what ours' first call holds (`first_call_note`)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    else:
        info.update(device="cpu (no CUDA device)", sms=None, cuda=None)
    return info


def to_markdown(res: dict[str, Any]) -> str:
    e = res["env"]
    lines = [
        "# Forward+backward: ours vs FLA vs FlashQLA (bf16, H=16, K=V=128)", "",
        f"device {e['device']}, torch {e['torch']}, triton {e['triton']}, fla {e['fla']}, flash-qla {e.get('flash_qla')}, "
        f"tilelang {e.get('tilelang')}, driver {e['driver']}, git {e['git_sha']}, {e['date']}", f"command: `{e['command']}`",
        f"our launch configs: {e.get('autotune') or 'the registry defaults'}; our backward's gradient kernels: "
        f"{e.get('bwd_grads') or 'auto'}; the forward's state+output pass: {e.get('fwd_pass') or 'auto'}; its Ag pass: {e.get('ag_pass') or 'auto'}", "",
        f"ms: triton.testing.do_bench median (L2 flushed), all in this process. floor: FLA's fwd+bwd bytes at the "
        f"{HBM_TBPS} TB/s copy ceiling. peak: max allocated during one step above the inputs.", "",
        "ours = the default recompute policy (`LaunchPlan.keep = \"auto\"`, `kernels.vocabulary.AUTO_KEEP`: since "
        "session 18 GDN's forward holds its Ag pass's outputs, as FLA's holds its WY inverse; since session 29 KDA's "
        "\"ag\" too, its gated outputs and T, on its two-kernel forward). Every forward also holds, where it splits the "
        "sequence, its segments' entering states (~17 MB). `inputs`: the inputs alone (the default until session 18, "
        "KDA's until 29). `ag` / `ag+states`: the Ag pass's outputs / and the walk's chunk states. "
        "`wy` / `wy+states`: the WY factors / and the chunk states, v_new and segment maps. held MB = what the policy "
        "holds beyond the inputs (FLA's WY inverse is not counted); peak MB = the step's peak above its inputs. At "
        "HV > H ours is the public op `kernels.chunk_<op>` (no policies).", "",
        "FlashQLA (GDN): `FlashQLA` = `auto_cp=False`; `FlashQLA CP` = its intra-card CP, what its default "
        "`auto_cp=True` runs; the batch flattened to varlen (`cu_seqlens`).", "",
        "| op | B | T | HV | lb | ours ms | FLA ms | ours/FLA | FlashQLA ms | FlashQLA CP ms | ours/FlashQLA | "
        "ours/FlashQLA CP | floor ms | ours peak MB | FLA peak MB | FlashQLA peak MB | "
        + " | ".join(f"{p} ms | {p}/FLA | {p} held MB | {p} peak MB" for p in POLICIES) + " | FLA guard bypassed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|---:|" * len(POLICIES)
        + "---|",
    ]
    nan = float("nan")
    for r in res["rows"]:
        pol = r.get("policies", {})
        cells = " | ".join(f"{pol.get(p, {}).get('ms', nan):.2f} | {pol.get(p, {}).get('ms', nan) / r.get('fla_ms', nan):.2f}"
                           f" | {pol.get(p, {}).get('held_MB', nan):.0f} | {pol.get(p, {}).get('peak_MB', nan):.0f}"
                           for p in POLICIES)
        gate = "logsigmoid" if r.get("lb") is None else f"{r['lb']:g}"
        lines.append(f"| {r['op']} | {r['B']} | {r['T']} | {r.get('HV', H)} | {gate} | {r['ours_ms']:.2f} | "
                     f"{r.get('fla_ms', nan):.2f} | {r.get('ratio', nan):.2f} | {r.get('flash_qla_ms', nan):.2f} | "
                     f"{r.get('flash_qla_cp_ms', nan):.2f} | {r.get('ratio_flash_qla', nan):.2f} | "
                     f"{r.get('ratio_flash_qla_cp', nan):.2f} | {r['floor_ms']:.2f} | {r['ours_peak_MB']:.0f} | "
                     f"{r.get('fla_peak_MB', nan):.0f} | {r.get('flash_qla_cp_peak_MB', nan):.0f} | {cells} | "
                     f"{r.get('fla_hopper_guard_bypassed', r.get('fla_error'))} |")
    lines += _notes(res)
    lines += ["", "## Gradients vs the fp32 per-token reference (rel_l2; first_call_s: that library's first step)", ""]
    for op, c in res["grads"].items():
        for who in (w for w in c if w != "shape"):
            vals = ", ".join(f"{n} {x:.1e}" if isinstance(x, float) else f"{n} {x}" for n, x in c[who].items())
            lines.append(f"- {op} {who} ({c['shape']}): {vals}")
    lines += ["", "## Per-kernel times (one step, ms): ours, and FlashQLA's where it ran", ""]
    for r in res["rows"]:
        ks = ", ".join(f"{n} {t:.2f}" for n, t in list(r["ours_kernels_ms"].items())[:14])
        lines.append(f"- {r['op']} B={r['B']} T={r['T']} HV={r.get('HV', H)} (step {r['ours_ms']:.2f}, floor "
                     f"{r['floor_ms']:.2f}): {ks}")
        for col in FLASH_QLA_COLUMNS:
            if r.get(f"{col}_kernels_ms"):
                ks = ", ".join(f"{n} {t:.2f}" for n, t in list(r[f"{col}_kernels_ms"].items())[:14])
                lines.append(f"  - {col} (step {r[f'{col}_ms']:.2f}; kernels' sum "
                             f"{sum(r[f'{col}_kernels_ms'].values()):.2f}): {ks}")
    if res.get("cut"):
        lines += ["", f"## Not run: {len(res['cut'])} row(s) cut by --deadline", ""]
        lines += [f"- {x['op']} {x['case']}: {x['why']}" for x in res["cut"]]
    return "\n".join(lines) + "\n"


def _notes(res: dict[str, Any]) -> list[str]:
    """Why FlashQLA did not run (one line per reason), its errors, the split it chose, and each library's first call."""
    notes = dict.fromkeys(f"FlashQLA not run ({r['op']}): {r['flash_qla_reason']}" for r in res["rows"]
                          if r.get("flash_qla_reason"))
    for col in FLASH_QLA_COLUMNS:
        notes.update(dict.fromkeys(f"{col} failed ({r['op']} {r['B']}x{r['T']} HV={r.get('HV')}): {r[col + '_error']}"
                                   for r in res["rows"] if r.get(col + "_error")))
        notes.update(dict.fromkeys(f"{col} split ({r['op']} {r['B']}x{r['T']} HV={r.get('HV')} lb={r.get('lb')}): "
                                   f"{r[col + '_split']}" for r in res["rows"] if r.get(col + "_split")))
    for r in res["rows"]:  # ours under other backward gradient kernels (--also-bwd-grads), this process
        for grads, a in r.get("also_grads", {}).items():
            fig = (a["error"] if "error" in a else f"{a['ms']:.2f} ms ({a['ms'] / r.get('fla_ms', float('nan')):.2f}x "
                   f"FLA; ours {r['ours_ms']:.2f}), peak {a['peak_MB']:.0f} MB")  # fmt: skip
            notes[f"ours with bwd_grads={grads} ({r['op']} {r['B']}x{r['T']} HV={r.get('HV')} lb={r.get('lb')}): {fig}"] = None
    first: dict[str, float] = {}
    for r in res["rows"]:
        for who in ("ours", "fla", *FLASH_QLA_COLUMNS):
            if isinstance(r.get(f"{who}_first_call_s"), (int, float)):
                first[who] = max(first.get(who, 0.0), r[f"{who}_first_call_s"])
    for c in res["grads"].values():
        for who, v in c.items():
            if isinstance(v, dict) and isinstance(v.get("first_call_s"), (int, float)):
                first[who] = max(first.get(who, 0.0), v["first_call_s"])
    if first:
        mode = res.get("env", {}).get("tilelang_build")
        held = f"; {first_call_note(mode)}" if mode else ""
        notes[f"first call of each library in this run (s; compile / autotune on the cache it found{held}): "
              + ", ".join(f"{w} {t:.1f}" for w, t in first.items())] = None
    return ["", *(f"- {n}" for n in notes)] if notes else []


def write(res: dict[str, Any], out: Path, name: str) -> None:
    """The JSON and markdown as they stand (after every row: a run cut short keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    (out / f"{name}.md").write_text(to_markdown(res))


def _say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runners.bench.kernels_train", description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="gdn,kda")
    ap.add_argument("--shapes", default=None, help="BxT,... (default: the five shapes, longest B=1 first)")
    ap.add_argument("--hv", default=None, help="comma list of value-head counts, multiples of H=16 (default 16)")
    ap.add_argument("--lb", default=None, help="comma list of gate strengths, g = lb * sigmoid(randn) (write --lb=-5,-1); "
                    "default FLA's logsigmoid(randn)")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS), help="a named grid of shapes x HV x lb "
                    "(issue26); --shapes / --hv / --lb beside it replace its lists")
    ap.add_argument("--peers", default=None, help="fla, flash_qla (default both; none: ours alone)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds: start a row only if the elapsed time plus the "
                    "longest row so far fits (the first row always runs); the rest are listed as cut")
    ap.add_argument("--out", default="benchmarks/results/")
    ap.add_argument("--stem", default=None)
    ap.add_argument("--sha", default=None, help="git sha to record when the tree has no .git (device copies)")
    ap.add_argument("--no-grads", action="store_true", help="skip the gradient checks (ours and the peers')")
    ap.add_argument("--no-fla", action="store_true", help="leave FLA out of --peers (its first-call autotune takes minutes)")
    ap.add_argument("--explore", default="", help="BxT: time backward config variants at this shape")
    ap.add_argument("--autotune", default=None, help="an autotune JSON applied to ours (`kernels.use_autotune`)")
    ap.add_argument("--fwd-pass", default=None, choices=FWD_PASSES, help="the forward's state+output pass "
                    "(`LaunchPlan.fwd_pass`; default the plan's \"auto\": GDN's TileLang walk where it runs; KDA's "
                    "walk only with \"tilelang\", which also takes KDA's fused path)")
    ap.add_argument("--ag-pass", default=None, choices=AG_PASSES, help="the forward's Ag pass (`LaunchPlan.ag_pass`; "
                    "default the plan's \"auto\"); \"tilelang\": the TileLang kernels `kernels.ops.gdn.ag_hopper`, "
                    "`kernels.ops.kda.ag_hopper`")
    ap.add_argument("--bwd-grads", default=None, choices=BWD_GRADS, help="ours' backward gradient kernels "
                    "(`LaunchPlan.bwd_grads`; default the plan's \"auto\"); \"reverse\": GDN's TileLang reverse walk")
    ap.add_argument("--also-bwd-grads", default="", help="comma list of `LaunchPlan.bwd_grads` values: ours' default "
                    "step timed again under each, in this process (e.g. pair,tilelang: \"auto\"'s two choices for KDA)")
    args = ap.parse_args(argv)
    try:
        peers = parse_peers(args.peers, args.no_fla)
        cases = expand_cases(preset=args.preset, shapes=parse_shapes(args.shapes or ""),
                             hv=tuple(int(x) for x in parse_floats(args.hv, "--hv")), lb=parse_floats(args.lb, "--lb"),
                             H=H)
        also_grads = tuple(x for x in args.also_bwd_grads.split(",") if x)
        if bad := [x for x in also_grads if x not in BWD_GRADS]:
            raise ValueError(f"--also-bwd-grads: {', '.join(bad)} not in {', '.join(BWD_GRADS)}")
    except ValueError as err:
        ap.error(str(err))
    if not torch.cuda.is_available():
        sys.stderr.write("kernels_train: needs a CUDA device\n")
        return 1
    if args.autotune:
        import kernels

        kernels.use_autotune(args.autotune)
    if args.bwd_grads:
        set_default_plan(default_plan().replace(bwd_grads=args.bwd_grads))
    if args.fwd_pass:
        set_default_plan(default_plan().replace(fwd_pass=args.fwd_pass))
    if args.ag_pass:
        set_default_plan(default_plan().replace(ag_pass=args.ag_pass))
    ops = [o for o in args.ops.split(",") if o]
    res: dict[str, Any] = {"env": {**env(args), "autotune": args.autotune, "bwd_grads": args.bwd_grads,
                                  "fwd_pass": args.fwd_pass, "ag_pass": args.ag_pass}, "rows": [], "grads": {}, "cut": [],
                           "peers": list(peers), "cases": [c.label for c in cases]}
    name = args.stem or ("kernels_train_h200" if "H200" in res["env"]["device"] else "kernels_train_gpu")
    out = Path(args.out)
    fla = "fla" in peers
    qla = FlashQLAColumns() if "flash_qla" in peers else None
    deadline = Deadline(args.deadline)
    if not args.no_grads:
        for op in ops:
            res["grads"][op] = gradient_check(op, "cuda", fla=fla, qla=qla)
            _say(op, json.dumps(res["grads"][op]))
            write(res, out, name)
    for case in cases:
        for op in ops:
            if not deadline.allows():
                res["cut"].append({"op": op, "case": case.label, "why": deadline.why()})
                _say(op, case.label, deadline.why())
                continue
            rec = run_shape(op, case.B, case.T, "cuda", fla=fla, HV=case.HV, lb=case.lb, qla=qla, also_grads=also_grads)
            rec["row_s"] = round(deadline.done(kernels_peers.first_calls_s(rec)), 1)
            res["rows"].append(rec)
            _say(json.dumps(rec))
            write(res, out, name)
            torch.cuda.empty_cache()
    for op in ops if args.explore else ():
        Be, Te = (int(x) for x in args.explore.split("x"))
        res.setdefault("explore", {})[op] = explore(op, Be, Te, "cuda")
        for r in res["explore"][op]:
            _say("explore", op, r["kernel"], r["change"], r["ms"])
    write(res, out, name)
    _say(to_markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
