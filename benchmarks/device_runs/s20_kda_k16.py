"""Session 20 (issue 26): which KDA backward launch faults on the H200 at K = V = 16, and when? Device calls 2 and 3
found `tests/kernels/test_dispatch_grouped.py`'s `[dense-HV=2H-kda]` case (K = V = 16, H=2, HV=4) hitting an illegal
memory access in `wy_bwd_kernel` (the pair's second launch), at this tree and at git 612e650 alike. One case per
process (a fault ends the CUDA context), each with CUDA_LAUNCH_BLOCKING=1:

    python3 benchmarks/device_runs/s20_kda_k16.py            # every case, one subprocess each
    python3 benchmarks/device_runs/s20_kda_k16.py CASE       # one case

A case: grouped (HV = 2H) or not, K = V, and the pair's launch configs (num_warps of chunk_bwd_dqk / wy_bwd). Prints
one line per case: ok (and the largest relative error against autograd through the fp32 reference) or the error.
Call 4 ran it at git 7e189bd with the inputs of `tests.utils.make_inputs`; since then it makes its own (a benchmark
does not import the tests: `tests/test_architecture.py`), the same kind (unit-norm q, k; per-key gates in (-1, 0)).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES = {  # name: (H, HV, K, chunk_bwd_dqk warps, wy_bwd warps); None: the default config
    "grouped-k16": (2, 4, 16, None, None),
    "plain-k16": (4, 4, 16, None, None),
    "grouped-k16-wy4": (2, 4, 16, None, 4),
    "plain-k16-wy4": (4, 4, 16, None, 4),
    "grouped-k32": (2, 4, 32, None, None),
    "plain-k32": (4, 4, 32, None, None),
    "grouped-k64": (2, 4, 64, None, None),
}


def run_case(name: str) -> str:
    import torch

    import kernels
    from kernels.configs import LaunchConfig
    from kernels.plan import LaunchPlan
    from runners.correctness import rel_l2

    H, HV, K, w_dqk, w_wy = CASES[name]
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: TRITON_INTERPRET=1, fp32: the script's plumbing)
    low = torch.bfloat16 if dev == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(3)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    # random inputs, never zeros (as tests/utils' maker): unit-norm q, k; per-key log decays in (-1, 0) (lb -1)
    q = torch.nn.functional.normalize(rand(2, 80, H, K), dim=-1).to(dev)
    k = torch.nn.functional.normalize(rand(2, 80, H, K), dim=-1).to(dev)
    v = rand(2, 80, HV, K).to(dev)
    g = (-torch.sigmoid(rand(2, 80, HV, K))).to(dev)
    beta = torch.sigmoid(rand(2, 80, HV)).to(dev)
    h0 = (0.1 * rand(2, HV, K, K)).to(dev)
    do = torch.randn_like(v)
    configs = {}
    for kernel, warps in (("chunk_bwd_dqk", w_dqk), ("wy_bwd", w_wy)):
        if warps is not None:
            configs[kernel] = LaunchConfig(BK=min(64, K), BV=min(64, K), num_warps=warps, num_stages=2)
    xs = [x.detach().to(low).requires_grad_() for x in (q, k, v)]
    xs += [g.detach().requires_grad_(), beta.detach().to(low).requires_grad_()]
    o, _ = kernels.chunk_kda(*xs, initial_state=h0, backend="triton", plan=LaunchPlan(configs=configs))
    (o.float() * do).sum().backward()
    if dev == "cuda":
        torch.cuda.synchronize()
    refs = [x.detach().float().requires_grad_() for x in xs]
    G = HV // H
    ro, _ = kernels.reference(
        "kda", refs[0].repeat_interleave(G, 2), refs[1].repeat_interleave(G, 2), *refs[2:], initial_state=h0
    )
    (ro * do).sum().backward()
    err = max(rel_l2(a.grad.float(), b.grad) for a, b in zip(xs, refs, strict=True))
    return f"ok (max rel_l2 of the five gradients {err:.2e})"


def main() -> None:
    if len(sys.argv) > 1:
        try:
            print(f"{sys.argv[1]}: {run_case(sys.argv[1])}", flush=True)
        except Exception as err:  # noqa: BLE001  (the case's outcome is the report)
            print(f"{sys.argv[1]}: {type(err).__name__}: {str(err).splitlines()[0][:160]}", flush=True)
        return
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for name in CASES:
        done = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True, text=True, timeout=120)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(name)]
        where = [ln.strip() for ln in done.stderr.splitlines() if "kernels/" in ln][-2:]
        print(lines[-1] if lines else f"{name}: no result (rc {done.returncode}) {where}", flush=True)


if __name__ == "__main__":
    main()
