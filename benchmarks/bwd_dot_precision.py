"""KDA backward: the precision of the decayed products' matmuls vs gradient error and step time (GPU only).

    python benchmarks/bwd_dot_precision.py --out $OUT [--T 65536]

For each `kernels.common.chunk_bwd.VECTOR_GATE_DOT` in (bf16, tf32, tf32x3): every gradient's rel_l2 vs autograd
through the fp32 per-token reference (bf16 inputs, B=1 T=1024 H=4, K=V=128) with the benchmark's gates
(logsigmoid(randn)) and with gates at the documented bound (-5 - 0.5 rand, the strong-decay test's), then the
forward+backward step time of ours at B=1 T=--T H=16 (do_bench median). Writes $OUT/bwd_dot_precision.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import kernels.common.chunk_bwd as chunk_bwd
from kernels.ops.kda.naive import naive_recurrent_kda
from runners.bench.kernels_train import H, K, make_inputs, ours_step, timed
from runners.correctness import rel_l2

NAMES = ("dq", "dk", "dv", "dg", "dbeta")


def grads_error(gates: str) -> dict[str, float]:
    q, k, v, g, beta, do = make_inputs("kda", 1, 1024, 4, device="cuda", seed=7)
    if gates == "bound":
        gen = torch.Generator(device="cuda").manual_seed(8)
        g = (-5.0 - 0.5 * torch.rand(g.shape, device="cuda", generator=gen)).bfloat16()
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, g, beta)]
    o, _ = naive_recurrent_kda(*leaves, scale=K**-0.5)
    o.backward(do.float())
    _, ours = ours_step("kda")(q, k, v, g, beta, do)
    return {n: rel_l2(a, x.grad) for n, a, x in zip(NAMES, ours[:5], leaves, strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, default=65536)
    args = ap.parse_args()
    x = make_inputs("kda", 1, args.T, H, device="cuda")
    res = []
    for prec in ("bf16", "tf32", "tf32x3"):
        chunk_bwd.VECTOR_GATE_DOT = prec
        rec = {"prec": prec, "bench_gates": grads_error("bench"), "bound_gates": grads_error("bound")}
        rec[f"ms_T{args.T}"] = timed(lambda: ours_step("kda")(*x))
        print(json.dumps(rec), flush=True)
        res.append(rec)
    Path(args.out, "bwd_dot_precision.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
