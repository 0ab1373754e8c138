"""The reverse windows' bound sums from the forward's q, k side (issue 26, session 26): GDN's Ag pass with and
without `rev` (it also reads q and stores p and (L, A): `kernels.ops.gdn.wy_ag.wy_gdn_ag(rev=)`), and the backward's
sums by `reverse_chunk_bound` (reads q, k, do) against `reverse_chunk_bound_kept` (reads do and the kept sums), on the
same inputs in one process, with their agreement (max |a - b| / (1 + A + |a|) over finite entries; -inf in the same
places).

    python benchmarks/bound_sums_lab.py [--shape 1x65536] [--out $OUT]

bf16, H = 16, K = V = 128, chunk 64, g = -2 rand (per token), beta = rand, q = randn, k L2-normalised; the Ag pass at
the shipped launch config (`benchmarks/results/autotune_h200.json`) and at the kernel's default; do_bench medians (ms).
Writes $OUT/bound_sums_lab.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1x65536")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bound_sums_lab"))
    a = ap.parse_args(argv)
    from triton.testing import do_bench

    from kernels.autotune import load_autotune
    from kernels.common.index import prepare_chunk_index
    from kernels.common.warm_bwd import reverse_chunk_bound, reverse_chunk_bound_kept
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from kernels.plan import LaunchPlan

    B, T = (int(x) for x in a.shape.split("x"))
    H, K, dev, bf = 16, 128, "cuda", torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device=dev, dtype=bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(bf)
    v = torch.randn(B, T, H, K, device=dev, dtype=bf)
    do = torch.randn_like(v)
    g = -2 * torch.rand(B, T, H, device=dev)
    beta = torch.rand(B, T, H, device=dev).to(bf)
    ix = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=64, device=dev)
    NT, scale = ix.num_chunks, K**-0.5
    bnd = torch.empty(NT, H, 2, device=dev)
    sums = (torch.empty(B, T, H, device=dev), torch.empty(NT, H, 2, device=dev))
    ms: dict[str, float] = {}
    out: dict[str, object] = {"shape": a.shape, "device": torch.cuda.get_device_name(), "ms": ms}
    plans = {"shipped": LaunchPlan(table=load_autotune(ROOT / "benchmarks/results/autotune_h200.json", strict=False)),
             "default": LaunchPlan()}  # fmt: skip
    for name, plan in plans.items():
        ms[f"ag+bnd {name}"] = do_bench(lambda p=plan: wy_gdn_ag(k, g, beta, index=ix, launch=p, bnd=bnd, v=v))
        ms[f"ag+bnd+rev {name}"] = do_bench(
            lambda p=plan: wy_gdn_ag(k, g, beta, index=ix, launch=p, bnd=bnd, v=v, rev=sums, q=q)
        )
    wy_gdn_ag(k, g, beta, index=ix, launch=plans["shipped"], bnd=bnd, v=v, rev=sums, q=q)
    ms["reverse_chunk_bound"] = do_bench(lambda: reverse_chunk_bound(q, k, g, beta, do, scale=scale, index=ix,
                                                                     gate_vector=False))  # fmt: skip
    ms["reverse_chunk_bound_kept"] = do_bench(lambda: reverse_chunk_bound_kept(do, sums, scale=scale, index=ix))
    old = reverse_chunk_bound(q, k, g, beta, do, scale=scale, index=ix, gate_vector=False)[0]
    new = reverse_chunk_bound_kept(do, sums, scale=scale, index=ix)
    A = sums[1][..., 1].flip(0)[..., None]
    fin = torch.isfinite(old)
    out["max_rel_diff"] = float(((old - new).abs() / (1 + A + old.abs()))[fin].max())
    out["same_infinities"] = bool(torch.equal(old.isinf(), new.isinf()))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bound_sums_lab.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
