"""GDN's training step with the backward from Ag (issue 26, `kernels.ops.gdn.ag_bwd`) against the WY recompute, in one
process on one GPU: per variant the step time, its per-launcher split, its peak memory and what the forward holds, and
FLA's step and peak beside them when FLA imports.

    python benchmarks/bwd_ag_lab.py --out $OUT [--shapes 1x8192,1x65536,1x131072,8x8192] [--lb -1] [--no-fla]
        [--deadline-s 540] [--variants inputs,ag,ag:fused,inputs:fused:warm] [--bwd-warm 4]
    TRITON_INTERPRET=1 python benchmarks/bwd_ag_lab.py --out /tmp/lab --dry-run   # CPU plumbing check, no timing

Variants (GDN, bf16, H=16, K=V=128; `runners.bench.kernels_train`'s inputs and steps: the direct `chunk_gdn_fwd` +
`chunk_gdn_bwd` calls under a recompute policy, `LaunchPlan.keep`):
- `inputs` (the default recompute policy: the backward recomputes `wy_gdn_fwd`, `wy_inverse` and the chunk states),
  with the gradient pair (`bwd_grads="pair"`; a variant without ":fused" pins the pair);
- `ag` (the forward keeps Ag and the gate cumsum; the backward runs `wy_from_ag`, then the chunk states from its w, u
  by `chunk_state_fwd`: no WY prep, no inverse; until session 18 the fused pass's STORE_STATES mode over exact
  transitions instead);
- `ag-recompute` (nothing kept: the backward runs the Ag pass again, then as `ag`; `chunk_gdn_bwd_ag(wy=None)`);
- `ag+states` (as `ag`, and the forward's output launch also stores h and v_new, after exact transitions over every
  segment instead of the warm split: the backward runs no state recompute);
- `wy`, `wy+states` (the forward keeps its WY factors / and its chunk states);
- `inputs:fused`, `ag:fused`, `ag+states:fused`: as `inputs` / `ag` / `ag+states` with the backward's gradient kernels
  fused per chunk (`LaunchPlan.bwd_grads="fused"`, `kernels/common/dqk_wy_bwd.py`);
- `ag:reverse`, `ag+states:reverse` (session 22): the backward's state gradient and gradients in one TileLang reverse
  walk per (range, value head) (`LaunchPlan.bwd_grads="reverse"`, `kernels/ops/gdn/reverse_bwd.py`);
- any variant + ":warm" (e.g. `inputs:fused:warm`): the backward's split reverse pass with the gate-certified warm
  window of `--bwd-warm` chunks (`LaunchPlan.bwd_warm`, `kernels/common/warm_bwd.py`); its row also gives the
  fraction of (segment, head) pairs certified (`cert`, read after one extra step).
Per variant: do_bench median (ms), `torch.cuda.max_memory_allocated` during one step above the inputs (MB), the MB the
forward holds for the backward, and the profiler's CUDA time per kernel over one step. Gradients: every variant's
dq, dk, dv, dg, dbeta against autograd through the fp32 per-token reference at B=1 T=1024 (rel_l2), and FLA's.
Writes $OUT/bwd_ag_lab.{json,md} after every shape (a stopped run keeps its rows).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# ":fused": bwd_grads="fused"; ":reverse": bwd_grads="reverse" (GDN's TileLang reverse walk, `kernels.ops.gdn.reverse_bwd`)
VARIANTS = (
    "inputs",
    "ag",
    "ag-recompute",
    "ag+states",
    "wy",
    "wy+states",
    "inputs:fused",
    "ag:fused",
    "ag+states:fused",
    "ag:reverse",
    "ag+states:reverse",
)
WARM = ":warm"  # a variant's suffix: the reverse pass's warm window (`LaunchPlan.bwd_warm`, `--bwd-warm` chunks)
NAMES = ("dq", "dk", "dv", "dg", "dbeta")


def _step(variant: str, K: int, bwd_warm: int = 4, report: dict[str, torch.Tensor] | None = None):
    """The training step of a variant: (q, k, v, g, beta, do) -> (o, gradients); `report` receives the warm window's
    certified mask (":warm" variants)."""
    from kernels.ops.gdn.ag_bwd import chunk_gdn_bwd_ag
    from kernels.ops.gdn.chunk import chunk_gdn_fwd
    from kernels.plan import plan_with
    from runners.bench.kernels_train import ours_step

    warm = bwd_warm if variant.endswith(WARM) else 0
    policy, _, grads = variant.removesuffix(WARM).partition(":")
    if policy != "ag-recompute":
        return ours_step("gdn", policy=policy, bwd_grads=grads or "pair", bwd_warm=warm, warm_report=report)
    plan = plan_with(None, {}).replace(bwd_grads=grads or "pair", bwd_warm=warm)

    def step(q, k, v, g, beta, do):
        o, _ = chunk_gdn_fwd(q, k, v, g, beta, scale=K**-0.5, plan=plan)
        return o, chunk_gdn_bwd_ag(q, k, v, g, beta, do, scale=K**-0.5, plan=plan, wy=None, warm_report=report)

    return step


def _on(device: str, *xs: Any) -> tuple[torch.Tensor, ...]:
    """The workload's tensors; in fp32 on the CPU (the dry run: the interpreter computes bf16 wrongly)."""
    assert all(x is not None for x in xs)
    return tuple(x.float() if device == "cpu" else x for x in xs)


def _held_mb(variant: str, xs: tuple[torch.Tensor, ...]) -> float:
    from runners.bench.kernels_train import held_mb

    policy = variant.partition(":")[0]
    return 0.0 if policy in ("inputs", "ag-recompute") else held_mb("gdn", policy, *xs)


def _grads(
    dims: dict[str, int], device: str, fla: bool, variants: tuple[str, ...] = VARIANTS, bwd_warm: int = 4
) -> dict[str, Any]:
    """rel_l2 of o and every gradient vs the fp32 per-token reference, each variant and FLA (B=1 T=dims['T_check'])."""
    from kernels.ops.gdn.naive import naive_recurrent_gdn
    from runners.bench.kernels_train import fla_step, workload
    from runners.correctness import rel_l2

    K = dims["K"]
    wl = workload("gdn", 1, dims["T_check"], dims["H"], device=device, seed=7, lb=-1.0)
    q, k, v, g, beta, do = _on(device, *wl.tensors, wl.do)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, g, beta)]
    o_ref, _ = naive_recurrent_gdn(*leaves, scale=K**-0.5)
    o_ref.backward(do.float())
    ref = [x.grad for x in leaves]
    out: dict[str, Any] = {}
    steps = [(v_, functools.partial(_step(v_, K, bwd_warm), q, k, v, g, beta, do)) for v_ in variants]
    if fla:
        steps.append(("fla", lambda: fla_step("gdn")[0](q, k, v, g, beta, do)))
    for who, fn in steps:
        try:
            o, gr = fn()
            out[who] = {
                "o": rel_l2(o, o_ref.detach()),
                **{n: rel_l2(a, r) for n, a, r in zip(NAMES, gr[:5], ref, strict=True)},
            }
        except Exception as err:  # a failing variant or peer is a result
            out[who] = {"error": repr(err)[:200]}
    return out


def run_shape(
    B: int,
    T: int,
    dims: dict[str, int],
    device: str,
    lb: float | None,
    fla: bool,
    variants: tuple[str, ...] = VARIANTS,
    bwd_warm: int = 4,
) -> dict[str, Any]:
    from runners.bench.kernels_train import fla_step, kernel_times, peak_mb, timed, workload

    cuda = device == "cuda"
    wl = workload("gdn", B, T, dims["H"], device=device, lb=lb)
    q, k, v, g, beta, do = _on(device, *wl.tensors, wl.do)
    row: dict[str, Any] = {"B": B, "T": T, "variants": {}}
    for variant in variants:
        report: dict[str, torch.Tensor] = {}
        fn = functools.partial(_step(variant, dims["K"], bwd_warm), q, k, v, g, beta, do)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        rec: dict[str, Any] = {"first_call_s": round(time.perf_counter() - t0, 2)}
        if variant.endswith(WARM):  # one step with the report, read after it (the timed steps read nothing)
            _step(variant, dims["K"], bwd_warm, report)(q, k, v, g, beta, do)
            ok = report.get("certified")
            rec["cert"] = None if ok is None else round(float(ok.float().mean()), 3)  # None: the split did not run
        if cuda:
            rec.update(ms=timed(fn), peak_MB=peak_mb(fn), held_MB=_held_mb(variant, (q, k, v, g, beta)),
                       kernels_ms=kernel_times(fn))  # fmt: skip
        row["variants"][variant] = rec
    if fla and cuda:
        try:
            fla_fn, bypassed = fla_step("gdn")
            theirs = functools.partial(fla_fn, q, k, v, g, beta, do)
            theirs()
            row["fla"] = {"ms": timed(theirs), "peak_MB": peak_mb(theirs), "guard_bypassed": bypassed}
        except Exception as err:
            row["fla"] = {"error": repr(err)[:300]}
    return row


def to_markdown(res: dict[str, Any]) -> str:
    nan = float("nan")
    e = res["env"]
    variants = tuple(res.get("variants", VARIANTS))
    lines = [
        "# GDN training step: backward from Ag vs the WY recompute (bf16, H=16, K=V=128)",
        "",
        f"device {e['device']}, torch {e['torch']}, triton {e['triton']}, fla {e.get('fla')}, git {e['git_sha']}, {e['date']}",
        f"command: `{e['command']}`",
        "",
        "ms: do_bench median; peak: max allocated during one step above the inputs; held: what the forward keeps for "
        "the backward. Variants: module docstring of benchmarks/bwd_ag_lab.py.",
        "",
        "| B | T | " + " | ".join(f"{v} ms | {v} peak MB | {v} held MB" for v in variants) + " | FLA ms | FLA peak MB |",
        "|---:|---:|" + "---:|---:|---:|" * len(variants) + "---:|---:|",
    ]
    for r in res["rows"]:
        cells = " | ".join(
            f"{r['variants'][v].get('ms', nan):.2f} | {r['variants'][v].get('peak_MB', nan):.0f} | "
            f"{r['variants'][v].get('held_MB', nan):.0f}"
            for v in variants
        )
        f = r.get("fla", {})
        lines.append(f"| {r['B']} | {r['T']} | {cells} | {f.get('ms', nan):.2f} | {f.get('peak_MB', nan):.0f} |")
    lines += ["", "## Per launcher (one step, CUDA ms, largest first)", ""]
    for r in res["rows"]:
        for v in variants:
            ks = r["variants"][v].get("kernels_ms", {})
            lines.append(f"- {r['B']}x{r['T']} {v}: " + ", ".join(f"{n} {t:.3f}" for n, t in list(ks.items())[:16]))
    certs = [f"{r['B']}x{r['T']} {v}: {r['variants'][v]['cert']}" for r in res["rows"] for v in variants
             if "cert" in r["variants"][v]]  # fmt: skip
    if certs:
        lines += ["", f"Warm window ({res.get('bwd_warm')} chunks) certified fraction: " + ", ".join(certs)]
    lines += ["", f"## Gradients vs the fp32 per-token reference (rel_l2, B=1 T={res['T_check']}, lb=-1)", ""]
    for who, vals in res["grads"].items():
        lines.append(f"- {who}: " + ", ".join(f"{n} {x:.2e}" if isinstance(x, float) else f"{n} {x}" for n, x in vals.items()))
    if res.get("cut"):
        lines += ["", "Not run (deadline): " + ", ".join(res["cut"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="1x8192,1x65536,1x131072,8x8192")
    ap.add_argument("--lb", type=float, default=None, help="gate lb * sigmoid(randn) (default: logsigmoid(randn))")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of VARIANTS (each may end in :warm)")
    ap.add_argument("--bwd-warm", type=int, default=4, help="the :warm variants' window (chunks, LaunchPlan.bwd_warm)")
    ap.add_argument("--dry-run", action="store_true", help="CPU plumbing check (TRITON_INTERPRET=1), tiny dims, no timing")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    from runners.bench.kernels_train import env

    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--dry-run needs TRITON_INTERPRET=1 (the Triton interpreter on CPU)")
    dims = {"H": 2, "K": 128, "T_check": 128} if args.dry_run else {"H": 16, "K": 128, "T_check": 1024}
    shapes = [tuple(int(x) for x in s.split("x")) for s in ("1x130" if args.dry_run else args.shapes).split(",")]
    fla = not args.no_fla and not args.dry_run
    variants = tuple(args.variants.split(","))
    if unknown := [v for v in variants if v.removesuffix(WARM) not in VARIANTS]:
        known = ", ".join(VARIANTS)
        raise SystemExit(f"--variants: unknown {unknown}; known: {known}, each optionally + {WARM}")
    res: dict[str, Any] = {
        "env": env(argparse.Namespace(sha=None)),
        "T_check": dims["T_check"],
        "rows": [],
        "cut": [],
        "variants": list(variants),
        "bwd_warm": args.bwd_warm,
    }
    res["env"]["command"] = " ".join(["python", "benchmarks/bwd_ag_lab.py", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        (args.out / "bwd_ag_lab.json").write_text(json.dumps(res, indent=1))
        (args.out / "bwd_ag_lab.md").write_text(to_markdown(res))

    res["grads"] = _grads(dims, device, fla, variants, args.bwd_warm)
    write()
    for B, T in shapes:
        if time.monotonic() - t_start > args.deadline_s:
            res["cut"].append(f"{B}x{T}")
            continue
        res["rows"].append(run_shape(B, T, dims, device, args.lb, fla, variants, args.bwd_warm))
        write()
        print(f"{B}x{T} done at {time.monotonic() - t_start:.0f} s", flush=True)
    print((args.out / "bwd_ag_lab.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
