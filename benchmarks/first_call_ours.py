"""Our first call on a cold Triton and TileLang cache (issue 26's target: <= 20 s): chunk_gdn and chunk_kda fwd+bwd
at B=1 T=8192 (or --T) H=16 K=V=128 bf16; prints the seconds and the peak memory of the step.

    python3 benchmarks/first_call_ours.py [--modes parallel serial] [--builds background wait] [--T 65536] [--ops gdn]

Each (mode, builds) runs in a fresh process with a fresh TRITON_CACHE_DIR and TILELANG_CACHE_DIR (GDN first, then KDA,
in that process: GDN's figure includes CUDA's start): parallel is the default (`kernels.parallel_compile`), serial
sets CPBENCH_PARALLEL_COMPILE=0 (every kernel compiles at its launch, as before session 11). GDN's bf16 forward is the
TileLang walk, and from 32K tokens x 16 heads its backward the TileLang reverse walk
(`kernels.vocabulary.AUTO_REVERSE_MIN_TOKEN_HEADS`): with builds "background" (CPBENCH_TILELANG_BUILD, the default,
`kernels.first_call`) the first call runs on Triton while they build, and the line also gives how long
`kernels.wait_for_builds()` waited after it and the next call (the first on the walks); with "wait" the first call
waits for the builds (as before session 28). Parallel mode only: serial compiles build at their launch.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any


def _step(fn: Any, *xs: Any) -> float:
    """Seconds of one training step (forward, backward, synchronised)."""
    import torch

    t0 = time.time()
    o, _ = fn(*xs)
    o.float().square().sum().backward()
    torch.cuda.synchronize()
    return time.time() - t0


def first_calls() -> None:
    import torch
    import torch.nn.functional as F

    import kernels

    T, H, D = int(os.environ.get("FIRST_CALL_T", "8192")), 16, 128
    dev = "cuda"
    mode = "serial" if os.environ.get("CPBENCH_PARALLEL_COMPILE") == "0" else "parallel"
    builds = os.environ.get("CPBENCH_TILELANG_BUILD") or "background"
    for op in os.environ.get("FIRST_CALL_OPS", "gdn,kda").split(","):
        q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
        k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
        v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_()
        gshape = (1, T, H) if op == "gdn" else (1, T, H, D)
        g = (-torch.sigmoid(torch.randn(*gshape, device=dev))).requires_grad_()
        beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).bfloat16().requires_grad_()
        fn = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda
        torch.cuda.reset_peak_memory_stats()
        first = _step(fn, q, k, v, g, beta)
        peak = torch.cuda.max_memory_allocated() / 2**20
        t0 = time.time()
        kernels.wait_for_builds()
        waited = time.time() - t0
        print(
            f"ours first call {op} fwd+bwd 1x{T} ({mode} compile, TileLang builds {builds}, "
            f"{len(os.sched_getaffinity(0))} cores): {first:.1f} s, peak {peak:.0f} MiB; then wait_for_builds "
            f"{waited:.1f} s, next call {_step(fn, q, k, v, g, beta):.2f} s",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["parallel", "serial"], choices=["parallel", "serial"])
    ap.add_argument("--builds", nargs="+", default=["background"], choices=["background", "wait"],
                    help="CPBENCH_TILELANG_BUILD of each parallel run (kernels.builds)")  # fmt: skip
    ap.add_argument("--T", type=int, default=8192, help="tokens of the one sequence (default 8192)")
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        first_calls()
        return 0
    runs = [(mode, b) for mode in args.modes for b in (args.builds if mode == "parallel" else ["wait"])]
    for mode, builds in runs:
        env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix=f"first_call_{mode}_"),
               "TILELANG_CACHE_DIR": tempfile.mkdtemp(prefix=f"first_call_tl_{mode}_"),
               "FIRST_CALL_T": str(args.T), "FIRST_CALL_OPS": ",".join(args.ops)}  # fmt: skip
        env["CPBENCH_PARALLEL_COMPILE"] = "0" if mode == "serial" else "1"
        env["CPBENCH_TILELANG_BUILD"] = builds
        rc = subprocess.run([sys.executable, __file__, "--child"], env=env, check=False).returncode
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
