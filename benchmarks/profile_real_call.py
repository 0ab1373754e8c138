#!/usr/bin/env python3
"""Where our real-model GDN forward spends its time (GPU): do_bench medians of the call with the in-kernel gate and
the l2norm, with a precomputed gate, without the l2norm, and with strong synthetic gates (lb=-1), then torch.profiler
tables of the first and last, at Qwen3-Next's shape (H=16, HV=32, K=V=128, bf16).

    T=8192 python3 benchmarks/profile_real_call.py

Results: `results/profiles/real_gdn_call_{before,after}_l2norm_h200.log` (session 9, issue 25).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.real_model_calls import gate_fp32, inputs, ours, timed  # noqa: E402

MODEL = {"model": "Qwen3-Next-80B-A3B", "op": "gdn", "H": 16, "HV": 32, "K": 128, "V": 128}


def cases(T: int) -> dict[str, Any]:
    import kernels
    from runners.workload import make_inputs

    x = inputs(MODEL, T, "cuda", "bfloat16")
    call = ours("gdn")
    g = gate_fp32("gdn", x["g_raw"], x["A_log"], x["dt_bias"])
    w = make_inputs("gdn", B=1, T=T, H=16, HV=32, K=128, V=128, lb=-1.0, dtype="bfloat16", seed=0, device="cuda")
    plain = kernels.chunk_gdn
    return {
        "in_kernel+l2norm": lambda: call(x, True),
        "precomputed(model gates)+l2norm": lambda: call(x, False),
        "precomputed(model gates), no l2norm": lambda: plain(x["q"], x["k"], x["v"], g, x["beta"], backend="triton"),
        "precomputed bf16 gate (model gates), no l2norm": lambda: plain(
            x["q"], x["k"], x["v"], g.bfloat16(), x["beta"], backend="triton"
        ),
        "synthetic lb=-1 gates": lambda: plain(w.q, w.k, w.v, w.g, w.beta, backend="triton"),
    }


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    runs = cases(int(os.environ.get("T", 8192)))
    with torch.no_grad():
        for name, fn in runs.items():
            print(f"{name}: {timed(fn, 'cuda'):.3f} ms", flush=True)
        for name in ("in_kernel+l2norm", "synthetic lb=-1 gates"):
            for _ in range(3):
                runs[name]()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    runs[name]()
                torch.cuda.synchronize()
            print("==", name)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()
