"""Forward+backward benchmark of our Triton GDN / KDA against FLA's `chunk_gated_delta_rule` / `chunk_kda` (GPU).

    python -m runners.bench.kernels_train [--ops gdn,kda] [--shapes 1x8192,...] [--out benchmarks/results/] [--no-fla]
        [--autotune FILE]

Per shape (bf16, H=16, K=V=128): ours ms (forward `chunk_*_fwd` + backward `chunk_*_bwd`, direct calls), FLA ms
(its autograd op, `o.backward(do)`), the ratio, the bytes floor of a forward+backward (FLA's count: 2828 B per
token-head for GDN, 3590 for KDA), the peak memory of one step above the inputs (ours and FLA's), our per-kernel
times (torch profiler, one step) for the miss analysis; our step under the kept recompute policies
(`LaunchPlan.keep`: "wy", "wy+states") with the MB each holds; once per op, every gradient's rel_l2 vs
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

from kernels.configs import LaunchConfig, get_spec
from kernels.plan import LaunchPlan, plan_with
from kernels.vocabulary import KEEP_POLICIES
from runners.bench.kernels_ops import fla_inputs
from runners.correctness import rel_l2
from runners.versions import driver_version, git_sha

__all__ = ["BYTES_PER_TOKEN_HEAD", "main"]

# FLA's forward+backward bytes per token-head (bf16, K=V=128; fla-h200.md): the floor both implementations face
BYTES_PER_TOKEN_HEAD = {"gdn": 2828, "kda": 3590}
SHAPES = ((1, 8192), (1, 32768), (1, 65536), (1, 131072), (8, 8192))
H, K, V = 16, 128, 128
COPY_TBPS = 4.2  # measured device copy ceiling on the H200 (kernels/NOTES.md)


def make_inputs(op: str, B: int, T: int, Hh: int, *, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """bf16 q, k (L2-normalised), v, g = logsigmoid(randn), beta = sigmoid(randn), do: random, never zeros (FLA's
    recipe from the one maker, `runners.bench.kernels_ops.fla_inputs`)."""
    w = fla_inputs(op, B, T, Hh, device=device, seed=seed, K=K, V=V, grad_out=True)
    assert w.do is not None  # asked for with grad_out
    return (*w.tensors, w.do)


POLICIES = KEEP_POLICIES[1:]  # the kept policies timed beside the default (KEEP_POLICIES[0], "inputs")


def _kept(policy: str) -> tuple[bool, bool]:
    """(keep the WY factors, keep the chunk states) under `policy` (`LaunchPlan.keeps`: a one-line ValueError for an
    unknown one)."""
    return LaunchPlan(keep=policy).keeps


def ours_step(op: str, configs: dict[str, LaunchConfig] | None = None, policy: str = "inputs") -> Callable[..., Any]:
    """Our forward + backward under a recompute policy (`LaunchPlan.keep`): "inputs" (recompute all), "wy"
    (the forward's WY factors handed to the backward), "wy+states" (and its chunk states, v_new, segment maps)."""
    import importlib

    fwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")
    bwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_bwd")
    plan = plan_with(None, configs or {}).replace(keep=policy)
    keep_wy, keep_states = plan.keeps

    def step(q, k, v, g, beta, do):
        keep: dict[str, torch.Tensor] | None = {} if keep_wy else None
        o, _ = fwd(q, k, v, g, beta, scale=K**-0.5, plan=plan, keep=keep, keep_states=keep_states)
        return o, bwd(q, k, v, g, beta, do, scale=K**-0.5, plan=plan, wy=keep)

    return step


def held_mb(op: str, policy: str, q, k, v, g, beta) -> float:
    """MB the forward holds for the backward beyond its inputs under `policy` (the kept tensors)."""
    import importlib

    fwd = getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")
    keep: dict[str, torch.Tensor] = {}
    fwd(q, k, v, g, beta, scale=K**-0.5, keep=keep, keep_states=_kept(policy)[1])
    return sum(t.numel() * t.element_size() for t in keep.values() if t.is_cuda) / 2**20


_FLA_BYPASS: list[bool] = []


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

    def step(q, k, v, g, beta, do):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, g, beta)]
        o, _ = fn(*leaves, scale=K**-0.5)
        o.backward(do)
        return o, [x.grad for x in leaves]

    return step, bypassed


def timed(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

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


def gradient_check(op: str, device: str, T: int = 1024, Hh: int = H, fla: bool = True) -> dict[str, Any]:
    """Every gradient's rel_l2 (ours, FLA) vs autograd through the fp32 per-token reference, B=1. H as the timed
    shapes: FLA's autotune keys hold H (not T), so its first-call autotune (minutes) happens once, here."""
    import importlib

    ref_fn = getattr(importlib.import_module("kernels.ops.gdn.naive" if op == "gdn" else "kernels.ops.kda.naive"),
                     f"naive_recurrent_{op}")
    q, k, v, g, beta, do = make_inputs(op, 1, T, Hh, device=device, seed=7)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, g, beta)]
    o, _ = ref_fn(*leaves, scale=K**-0.5)
    o.backward(do.float())
    ref = [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]
    names = ("dq", "dk", "dv", "dg", "dbeta")
    res: dict[str, Any] = {"shape": f"B=1 T={T} H={Hh}"}
    for who, policy in (("ours", "inputs"), *((f"ours {p}", p) for p in POLICIES)):
        _, ours = ours_step(op, policy=policy)(q, k, v, g, beta, do)
        res[who] = {n: rel_l2(a, r) for n, a, r in zip(names, ours[:5], ref, strict=True)}
    if not fla:
        res["fla"] = {"error": "not run (--no-fla)"}
        return res
    try:
        _, theirs = fla_step(op)[0](q, k, v, g, beta, do)
        res["fla"] = {n: rel_l2(a, r) for n, a, r in zip(names, theirs, ref, strict=True)}
    except Exception as err:  # FLA failing is a result, not a crash of our benchmark
        res["fla"] = {"error": repr(err)[:200]}
    return res


def run_shape(op: str, B: int, T: int, device: str, fla: bool = True) -> dict[str, Any]:
    q, k, v, g, beta, do = make_inputs(op, B, T, H, device=device)
    ours = ours_step(op)
    rec: dict[str, Any] = {"op": op, "B": B, "T": T, "H": H, "K": K, "V": V}
    step = functools.partial(ours, q, k, v, g, beta, do)
    rec["ours_ms"] = timed(step)
    rec["ours_peak_MB"] = peak_mb(step)
    rec["ours_kernels_ms"] = kernel_times(step)
    rec["policies"] = {}
    for policy in POLICIES:
        kept = ours_step(op, policy=policy)
        rec["policies"][policy] = {"ms": timed(functools.partial(kept, q, k, v, g, beta, do)),
                                   "held_MB": held_mb(op, policy, q, k, v, g, beta)}
    try:
        if not fla:
            raise RuntimeError("not run (--no-fla)")
        fla_fn, bypassed = fla_step(op)
        rec["fla_hopper_guard_bypassed"] = bypassed
        theirs = functools.partial(fla_fn, q, k, v, g, beta, do)
        rec["fla_ms"] = timed(theirs)
        rec["fla_peak_MB"] = peak_mb(theirs)
        rec["ratio"] = rec["ours_ms"] / rec["fla_ms"]
    except Exception as err:
        rec["fla_error"] = repr(err)[:300]
    rec["floor_bytes"] = BYTES_PER_TOKEN_HEAD[op] * B * T * H
    rec["floor_ms"] = rec["floor_bytes"] / (COPY_TBPS * 1e12) * 1e3
    return rec


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
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
    return info


def to_markdown(res: dict[str, Any]) -> str:
    e = res["env"]
    lines = [
        "# Forward+backward: ours vs FLA (bf16, H=16, K=V=128)", "",
        f"device {e['device']}, torch {e['torch']}, triton {e['triton']}, fla {e['fla']}, driver {e['driver']}, "
        f"git {e['git_sha']}, {e['date']}", f"command: `{e['command']}`",
        f"our launch configs: {e.get('autotune') or 'the registry defaults'}", "",
        "ms: triton.testing.do_bench median (L2 flushed). floor: FLA's fwd+bwd bytes at the 4.2 TB/s copy ceiling. "
        "peak: max allocated during one step above the inputs.", "",
        "ours = the default recompute policy (`LaunchPlan.keep = \"inputs\"`, FLA's: the forward holds only its "
        "inputs). `wy` / `wy+states`: the forward also holds its WY factors / and its chunk states, v_new and segment "
        "maps for the backward; held MB = what it holds beyond the inputs (FLA keeps its [B, T, H, 64] WY inverse; not counted here).", "",
        "| op | B | T | ours ms | FLA ms | ours/FLA | floor ms | ours peak MB | FLA peak MB | "
        + " | ".join(f"{p} ms | {p}/FLA | {p} held MB" for p in POLICIES) + " | FLA guard bypassed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|" * len(POLICIES) + "---|",
    ]
    nan = float("nan")
    for r in res["rows"]:
        pol = r.get("policies", {})
        cells = " | ".join(f"{pol.get(p, {}).get('ms', nan):.2f} | {pol.get(p, {}).get('ms', nan) / r.get('fla_ms', nan):.2f}"
                           f" | {pol.get(p, {}).get('held_MB', nan):.0f}" for p in POLICIES)
        lines.append(f"| {r['op']} | {r['B']} | {r['T']} | {r['ours_ms']:.2f} | {r.get('fla_ms', nan):.2f} | "
                     f"{r.get('ratio', nan):.2f} | {r['floor_ms']:.2f} | {r['ours_peak_MB']:.0f} | "
                     f"{r.get('fla_peak_MB', nan):.0f} | {cells} | "
                     f"{r.get('fla_hopper_guard_bypassed', r.get('fla_error'))} |")
    lines += ["", "## Gradients vs the fp32 per-token reference (rel_l2)", ""]
    for op, c in res["grads"].items():
        for who in (w for w in c if w != "shape"):
            vals = ", ".join(f"{n} {x:.1e}" if isinstance(x, float) else f"{n} {x}" for n, x in c[who].items())
            lines.append(f"- {op} {who} ({c['shape']}): {vals}")
    lines += ["", "## Our per-kernel times (one step, ms)", ""]
    for r in res["rows"]:
        ks = ", ".join(f"{n} {t:.2f}" for n, t in list(r["ours_kernels_ms"].items())[:14])
        lines.append(f"- {r['op']} B={r['B']} T={r['T']} (step {r['ours_ms']:.2f}, floor {r['floor_ms']:.2f}): {ks}")
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES), help="BxT,...")
    ap.add_argument("--out", default="benchmarks/results/")
    ap.add_argument("--stem", default=None)
    ap.add_argument("--sha", default=None, help="git sha to record when the tree has no .git (device copies)")
    ap.add_argument("--no-grads", action="store_true")
    ap.add_argument("--no-fla", action="store_true", help="ours only (FLA's first-call autotune takes minutes)")
    ap.add_argument("--explore", default="", help="BxT: time backward config variants at this shape")
    ap.add_argument("--autotune", default=None, help="an autotune JSON applied to ours (`kernels.use_autotune`)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.stderr.write("kernels_train: needs a CUDA device\n")
        return 1
    if args.autotune:
        import kernels

        kernels.use_autotune(args.autotune)
    ops = [o for o in args.ops.split(",") if o]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    res: dict[str, Any] = {"env": {**env(args), "autotune": args.autotune}, "rows": [], "grads": {}}
    name = args.stem or ("kernels_train_h200" if "H200" in res["env"]["device"] else "kernels_train_gpu")
    out = Path(args.out)
    for op in ops:
        if not args.no_grads:
            res["grads"][op] = gradient_check(op, "cuda", fla=not args.no_fla)
            _say(op, json.dumps(res["grads"][op]))
            write(res, out, name)
        for B, T in shapes:
            rec = run_shape(op, B, T, "cuda", fla=not args.no_fla)
            res["rows"].append(rec)
            _say(json.dumps(rec))
            write(res, out, name)
            torch.cuda.empty_cache()
        if args.explore:
            Be, Te = (int(x) for x in args.explore.split("x"))
            res.setdefault("explore", {})[op] = explore(op, Be, Te, "cuda")
            for r in res["explore"][op]:
                _say("explore", op, r["kernel"], r["change"], r["ms"])
    write(res, out, name)
    _say(to_markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
