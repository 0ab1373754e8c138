"""KDA's TileLang Ag pass's operand precision, on the CPU: its torch mirror (`kernels.ops.kda.ag_torch.kda_ag_blocks`)
with bf16 operands (the warpgroup products'), with and without Aqk's lo parts, against the same decomposition with
fp32 operands (what the Triton pass's tf32 products approach), through KDA's gated chunk recurrence to o (Ag, Aqk and
the gated keys stored in bf16, as the forward stores them), each against the fp64 per-token reference.

Why (session 28): the per-key decay makes KDA's grams products of rounded factors x e^(G - r); rounding those to bf16
for tensor-core products is harmless for A (the solve's Ag moves ~1e-4) but Aqk's diagonal blocks carry o's
intra-chunk term, so the kernel adds two products of the lo parts there.

    python benchmarks/kda_ag_precision.py [--T 1024] [--heads 4] [--out results/kda_ag_precision_s28_cpu.md]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernels  # noqa: E402
from kernels.common.index import prepare_chunk_index  # noqa: E402
from kernels.ops.kda import ag_torch  # noqa: E402


def gated_recurrence(qg: Tensor, ke: Tensor, kd: Tensor, gc: Tensor, ag: Tensor, aqk: Tensor, v: Tensor) -> Tensor:
    """o `[T, HV, V]` fp64 of one dense sequence from the Ag pass's gated outputs: per chunk W = V - ke S,
    Vd = Ag W, o = qg S + Aqk Vd, S = diag(e^G_C) S + kd^T Vd."""
    T, HV, K = qg.shape[1:]
    S = torch.zeros(HV, K, v.shape[-1], dtype=torch.float64)
    o = torch.zeros(T, HV, v.shape[-1], dtype=torch.float64)
    for c in range(T // 64):
        s = slice(64 * c, 64 * c + 64)

        def x(t: Tensor, s: slice = s) -> Tensor:
            return t[0, s].double().transpose(0, 1)  # [HV, C, D]

        vd = x(ag) @ (x(v) - x(ke) @ S)
        o[s] = (x(qg) @ S + x(aqk) @ vd).transpose(0, 1)
        S = gc[c].double().exp()[..., None] * S + x(kd).transpose(-1, -2) @ vd
    return o


def _inputs(T: int, H: int, lb: float, seed: int = 3) -> tuple[Tensor, ...]:
    """KDA inputs of one dense sequence (fp32): q, k (k L2-normalised), v `[1, T, H, 128]`, the gate lb * sigmoid(randn)
    per key `[1, T, H, 128]`, beta = sigmoid(randn) `[1, T, H]`."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, 128, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, 128, generator=gen), dim=-1)
    v = torch.randn(1, T, H, 128, generator=gen)
    g = lb * torch.sigmoid(torch.randn(1, T, H, 128, generator=gen))
    return q, k, v, g, torch.sigmoid(torch.randn(1, T, H, generator=gen))


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lbs", default="-1,-5,-12")
    ap.add_argument("--out", default=None, help="markdown file to write (default: print)")
    args = ap.parse_args()
    forms = {"fp32 operands": None, "bf16 operands": torch.bfloat16}
    rows = []
    for lb in (float(x) for x in args.lbs.split(",")):
        q, k, v, g, beta = _inputs(args.T, args.heads, lb)
        q, k, v, beta = (x.bfloat16() for x in (q, k, v, beta))
        index = prepare_chunk_index(None, batch=1, seq_len=args.T, chunk_size=64)
        scale = 128**-0.5
        o_ref, _ = kernels.reference("kda", q.double(), k.double(), v.double(), g.double(), beta.double(), scale=scale)
        ag_ref, aqk_ref, _ = ag_torch.kda_ag_reference(q, k, g, beta, index=index, scale=scale)
        for name, operand in forms.items():
            for lo in (True, False) if operand is not None else (True,):
                ag, aqk, (qg, ke, kd, gc) = ag_torch.kda_ag_blocks(q, k, g, beta, index=index, scale=scale,
                                                                   operand=operand, aqk_lo=lo)  # fmt: skip
                bf = [x.bfloat16() for x in (qg, ke, kd)]
                o = gated_recurrence(*bf, gc, ag.bfloat16(), aqk.bfloat16(), v)
                label = name if operand is None else f"{name}, Aqk {'with' if lo else 'without'} its lo products"
                rows.append((lb, label, _rel(ag, ag_ref), _rel(aqk, aqk_ref), _rel(o, o_ref[0])))
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# KDA's TileLang Ag pass: operand precision (CPU, torch mirror)",
        "",
        f"- command: `python benchmarks/kda_ag_precision.py --T {args.T} --heads {args.heads} --lbs={args.lbs}`",
        f"- git {sha}, torch {torch.__version__}, python {platform.python_version()}, CPU (no GPU: the mirror's math)",
        "- B=1, H=HV, K=V=128, bf16 q, k, v, beta, g = lb * sigmoid(randn) per key; relative L2 against fp64: Ag, Aqk"
        " against the triangular solve, o through the gated recurrence (Ag, Aqk, qg, ke, kd stored in bf16)"
        " against the per-token reference",
        "",
        "| lb | operands | Ag err | Aqk err | o err |",
        "|---:|---|---:|---:|---:|",
        *(f"| {lb:g} | {label} | {a:.2e} | {b:.2e} | {c:.2e} |" for lb, label, a, b, c in rows),
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
