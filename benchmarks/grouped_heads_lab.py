"""Grouped value heads on the Triton backend: the grouped call (q, k with H heads read in place) against the expanded
call of the same size (q, k repeated to HV heads beforehand, HV = H), GPU only.

    python benchmarks/grouped_heads_lab.py --out $OUT [--T 8192 32768] [--ops gdn kda]

B=1, H=16, HV=32, K=V=128, bf16, gates logsigmoid(randn). Per op and T: the forward (no grad) and the training step
(forward + backward) of `kernels.chunk_<op>(backend="triton")`, do_bench medians in ms, for
- grouped:  q, k `[1, T, 16, K]`, v, g, beta `[.., 32, ..]` (the kernels read head h // 2; the backward sums dq, dk);
- expanded: the same call with q, k repeat_interleave'd to 32 heads inside the timed region (what dispatch did
  before), and the same call on already-expanded q, k (the kernels alone at HV = H = 32);
and rel_l2 of the grouped o, dq, dk against the expanded call's (the same math: ~0). Writes
$OUT/grouped_heads_lab.json and .md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton.testing

import kernels

B, H, HV, K, V = 1, 16, 32, 128, 128


def make(op: str, T: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, T, H, K, device=dev, generator=gen).to(bf)
    k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).to(bf)
    v = torch.randn(B, T, HV, V, device=dev, generator=gen).to(bf)
    gshape = (B, T, HV) if op == "gdn" else (B, T, HV, K)
    g = F.logsigmoid(torch.randn(gshape, device=dev, generator=gen))
    beta = torch.rand(B, T, HV, device=dev, generator=gen).sigmoid().to(bf)
    return [q, k, v, g, beta]


def call(op: str, xs: list[torch.Tensor], expand: bool) -> torch.Tensor:
    q, k, v, g, beta = xs
    if expand:
        q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    return (kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda)(q, k, v, g, beta, backend="triton")[0]


def step(op: str, xs: list[torch.Tensor], do: torch.Tensor, expand: bool) -> list[torch.Tensor]:
    leaves = [x.detach().requires_grad_() for x in xs]
    o = call(op, leaves, expand)
    o.backward(do)
    return [o.detach(), *(x.grad for x in leaves[:2])]


def ms(fn: Callable[[], Any]) -> float:
    fn()
    kernels.wait_for_builds()  # the TileLang kernels a first call left building: never time a mix
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def measure(op: str, T: int) -> dict[str, Any]:
    xs = make(op, T)
    wide = [xs[0].repeat_interleave(HV // H, 2), xs[1].repeat_interleave(HV // H, 2), *xs[2:]]
    do = torch.randn_like(xs[2])
    rec: dict[str, Any] = {"op": op, "T": T}
    with torch.no_grad():
        rec["fwd_grouped_ms"] = ms(lambda: call(op, xs, False))
        rec["fwd_expand_in_call_ms"] = ms(lambda: call(op, xs, True))
        rec["fwd_hv32_ms"] = ms(lambda: call(op, wide, False))
    rec["step_grouped_ms"] = ms(lambda: step(op, xs, do, False))
    rec["step_expand_in_call_ms"] = ms(lambda: step(op, xs, do, True))
    rec["step_hv32_ms"] = ms(lambda: step(op, wide, do, False))
    got, ref = step(op, xs, do, False), step(op, xs, do, True)
    rec.update({f"rel_l2_{n}": rel_l2(a, b) for n, a, b in zip(("o", "dq", "dk"), got, ref, strict=True)})
    print(json.dumps(rec), flush=True)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"])
    args = ap.parse_args()
    res = [measure(op, T) for op in args.ops for T in args.T]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grouped_heads_lab.json").write_text(json.dumps(res, indent=1))
    cols = (
        "fwd_grouped_ms",
        "fwd_expand_in_call_ms",
        "fwd_hv32_ms",
        "step_grouped_ms",
        "step_expand_in_call_ms",
        "step_hv32_ms",
        "rel_l2_o",
        "rel_l2_dq",
        "rel_l2_dk",
    )
    lines = [
        f"# grouped value heads, B=1 H={H} HV={HV} K=V={K} bf16 ({torch.cuda.get_device_name()})",
        "",
        "| op | T | " + " | ".join(cols) + " |",
        "|---|---:|" + "---:|" * len(cols),
    ]
    lines += [f"| {r['op']} | {r['T']} | " + " | ".join(f"{r[c]:.4g}" for c in cols) + " |" for r in res]
    (out / "grouped_heads_lab.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
