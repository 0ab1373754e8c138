"""KDA's training step with and without the reverse state pass's warm window on one GPU (issue 26, session 12): the
step time (do_bench median), the certified fraction and every gradient's rel_l2 between the two (the window must not
move them beyond bf16 noise), to decide `kernels.vocabulary.AUTO_BWD_WARM["kda"]`.

    python3 benchmarks/kda_bwd_warm.py [--T 32768] [--warm 4]     # GPU; ~40 s with a cold compile cache
    TRITON_INTERPRET=1 python3 benchmarks/kda_bwd_warm.py --dry-run  # CPU plumbing (T=128, H=2; no split, no timing)

Run in session 13: `benchmarks/results/kda_bwd_warm_h200.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runners.bench.kernels_train import ours_step, timed, workload  # noqa: E402
from runners.correctness import rel_l2  # noqa: E402
from runners.versions import git_sha  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1, T=128, H=2, no timing")
    args = ap.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("kda_bwd_warm: needs a CUDA GPU (or --dry-run)")
    dev, T, H = ("cpu", 128, 2) if args.dry_run else ("cuda", args.T, 16)
    wl = workload("kda", 1, T, H, device=dev, lb=-1.0)
    xs = (*wl.tensors, wl.do)
    name = "cpu" if args.dry_run else torch.cuda.get_device_name()
    out: dict = {"T": T, "warm": args.warm, "sha": git_sha(), "device": name}
    grads = {}
    for w in (0, args.warm):
        report: dict[str, torch.Tensor] = {}
        o, gr = ours_step("kda", bwd_warm=w, warm_report=report)(*xs)
        grads[w] = gr
        cert = report.get("certified")
        out[f"warm{w}"] = {"cert": None if cert is None else float(cert.float().mean())}
        step = ours_step("kda", bwd_warm=w)
        if not args.dry_run:
            out[f"warm{w}"]["ms"] = timed(lambda step=step: step(*xs))
        print(json.dumps(out), flush=True)
    names = ("dq", "dk", "dv", "dg", "dbeta")
    out["rel_l2_warm_vs_exact"] = {n: rel_l2(a, b) for n, a, b in zip(names, grads[args.warm], grads[0], strict=False)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
