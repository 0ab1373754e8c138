"""Session 24: which part of the reverse walk breaks dk when a range's first step is a partial chunk and the next
chunks are prefetched (the GPU test test_training_step_through_the_reverse_walk[varlen-grouped] failed at 2142613).

The kernel against its torch mirror on three varlen sequences (37, 300, 5), each walked as one range (the 300-token
range starts on a 44-row partial chunk, then prefetches four full ones) and in two-chunk ranges (as the passing mirror
test), grouped (Hk 1, H 2) and not (Hk 2); per lab variant, the relative L2 of every output and the token rows where
dk is off.

    python benchmarks/device_runs/s24_walk_check.py [--compile-only] [--variants "" sync_mma ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DIM, BT = 128, 64
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
DEFAULT = ["", "sync_mma", "sync_stores", "sync_qkv", "sync_loads", "sync_mma+sync_stores", "sync_loads+sync_mma"]


def _lab(variant: str) -> frozenset[str]:
    return frozenset(x for x in variant.split("+") if x)


def compile_only(variants: list[str]) -> None:
    from kernels.ops.gdn import reverse_bwd

    for hk in (1, 2):
        for v in variants if hk == 1 else [""]:
            reverse_bwd._build(2, hk, DIM, DIM, BT, DIM**-0.5, "bfloat16", "float32", "bfloat16", _lab(v))
            print("compiled", hk, repr(v), flush=True)


def check(variants: list[str]) -> None:
    from kernels.common.reverse_bwd_torch import reverse_walk
    from kernels.ops.gdn.reverse_bwd import reverse_bwd_tilelang
    from tests.utils import make_inputs, make_state
    from tests.utils.assert_close import rel_err
    from tests.utils.reverse_walk import kept_for_walk

    lengths, cu = (37, 300, 5), [0, 37, 337, 342]
    scale = DIM**-0.5
    for hk in (1, 2):
        q, k, _, _, _, _ = make_inputs("gdn", lengths, H=hk, K=DIM, V=DIM, dtype=torch.bfloat16, device="cuda")
        _, _, v, g, beta, _ = make_inputs("gdn", lengths, H=2, K=DIM, V=DIM, lb=-1.0, seed=3, dtype=torch.bfloat16,
                                          device="cuda")  # fmt: skip
        h0 = make_state(3, 2, DIM, DIM, device="cuda")
        ag, gs, h, first = kept_for_walk(*(x.float() for x in (q, k, v, g, beta, h0)), cu, BT, scale)
        gen = torch.Generator().manual_seed(11)
        do = torch.randn(v.shape, generator=gen).to("cuda", torch.bfloat16)
        args = (q, k, v, g, gs, beta, ag.bfloat16(), h.bfloat16(), do)
        for span in (10**9, 2 * BT):
            bounds, offs, fin = [], [], []
            for n in range(3):
                for j, s0 in enumerate(range(cu[n], cu[n + 1], span)):
                    bounds.append(s0)
                    offs.append(first[n] + (s0 - cu[n]) // BT)
                    fin.append(n if j == 0 else -1)
            bounds.append(cu[-1])
            ends = 0.1 * torch.randn(len(fin), 2, DIM, DIM, generator=gen).to("cuda")
            ranges = {"cu": torch.tensor(bounds, device="cuda"), "chunk_offsets": torch.tensor(offs, device="cuda"),
                      "ends": ends, "final_idx": torch.tensor(fin, device="cuda"), "num_seqs": 3}  # fmt: skip
            want = reverse_walk(*args, scale=scale, **ranges)
            for var in variants if hk == 1 else [""]:
                for rep in range(2):
                    got = reverse_bwd_tilelang(*args, scale=scale, lab=_lab(var), **ranges)
                    torch.cuda.synchronize()
                    errs = " ".join(
                        f"{n} {rel_err(b.float(), a.float()):.1e}" for n, a, b in zip(NAMES, got, want, strict=True)
                    )
                    row = (got[1].float() - want[1].float()).norm(dim=-1).amax(-1)[0]  # [T]
                    ref = want[1].float().norm(dim=-1).amax(-1)[0]
                    bad = (row > 0.05 * ref.clamp_min(1e-3)).nonzero().flatten().tolist()
                    print(f"Hk={hk} ranges={'whole' if span > 1000 else '2-chunk'} {var or 'shipped'!r} rep {rep}: "
                          f"{errs}; dk rows off: {len(bad)} {bad[:12]}{' ..' if len(bad) > 12 else ''}",
                          flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--variants", nargs="*", default=DEFAULT)
    a = ap.parse_args()
    if a.compile_only:
        compile_only(a.variants)
    else:
        check(a.variants)


if __name__ == "__main__":
    main()
