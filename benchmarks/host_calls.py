"""What our training step asks of the host: Triton launches (per kernel) and ATen ops (per op and per line of
`kernels/` that issued them) in one forward + backward, counted on the CPU with every Triton launch stubbed out.

Why (issue 26, session 16): on the H200 the GDN step at 1x8K takes 2.82 ms (lb -1) and 3.05 ms (lb -5) while its
kernels sum to 1.34 ms (`results/kernels_train_issue26_h200.md`, torch profiler): the GPU waits for the host. From
32K on the step equals its kernel sum. Each launch and op costs host time whatever its size, so these counts are
what a host-side fix has to cut; the GPU timing is the device's.

    python benchmarks/host_calls.py --op gdn --T 8192 [--B 1] [--H 16] [--policy inputs] [--sms 132] [--json]
        [--hv 32] [--api]   # (session 20) grouped value heads / the public op's step

`--sms N` makes the intra-device split decide as on a GPU of N SMs (on the CPU it never splits); 0: the CPU's
plan. The stubbed launches compute nothing, so what the host decides from device values (nothing, by the rule
"no host sync in a step") is not exercised; the inputs are random (`runners.bench.kernels_ops.fla_inputs`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = str(Path(__file__).resolve().parents[1])


def count_step(
    op: str,
    B: int,
    T: int,
    H: int,
    *,
    policy: str = "auto",
    sms: int = 132,
    K: int = 128,
    V: int = 128,
    split_chunks: int | None = None,
    seg_states: bool = True,
    HV: int | None = None,
    api: bool = False,
) -> dict[str, Any]:
    """{"launches": {kernel: n}, "aten_ops": {op: n}, "aten_by_line": {"file:line fn": n}} of one step (split_chunks:
    the step's sequence split, `ours_step`'s; None automatic; seg_states: `ours_step`'s; HV value heads; api: the
    public op's step, `ours_api_step`, which grouped heads (HV > H) take whatever api says)."""
    import torch
    import triton.runtime.interpreter as interpreter
    import triton.runtime.jit as jit
    from torch.utils._python_dispatch import TorchDispatchMode

    import kernels.common.seqsplit as seqsplit
    from runners.bench.kernels_ops import fla_inputs
    from runners.bench.kernels_train import ours_api_step, ours_step

    launches: collections.Counter[str] = collections.Counter()

    def stub_run(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kw: Any) -> None:
        launches[self.fn.__name__] += 1

    def split_as_on_gpu(index: Any, *, H: int, NV: int, device: Any) -> int | None:
        return seqsplit.seg_chunks_for(index, H=H, NV=NV, sms=sms)

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()
            self.lines: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops[str(func)] += 1
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(f"{ROOT}/kernels/")]
            if ours:
                f = ours[-1]
                self.lines[f"{f.filename[len(ROOT) + 1 :]}:{f.lineno} {f.name}"] += 1
            return func(*args, **(kwargs or {}))

    # the launcher is JITFunction.run, or InterpretedFunction.run under TRITON_INTERPRET=1 (the tests)
    saved_run, saved_irun, saved_split = jit.JITFunction.run, interpreter.InterpretedFunction.run, seqsplit.auto_seg_chunks
    jit.JITFunction.run = interpreter.InterpretedFunction.run = stub_run
    if sms:
        seqsplit.auto_seg_chunks = split_as_on_gpu
    try:
        wl = fla_inputs(op, B, T, H, device="cpu", grad_out=True, lb=-1.0, K=K, V=V, HV=HV)
        api = api or (HV or H) != H
        if api:
            step = ours_api_step(op)
        else:
            step = ours_step(op, policy=policy, split_chunks=split_chunks, seg_states=seg_states)
        args = (wl.q, wl.k, wl.v, wl.g, wl.beta, wl.do)
        step(*args)  # the first call builds the cached plans
        launches.clear()
        with Ops() as mode, contextlib.nullcontext() if api else torch.no_grad():  # the public op's autograd node
            step(*args)
    finally:
        jit.JITFunction.run, interpreter.InterpretedFunction.run = saved_run, saved_irun
        seqsplit.auto_seg_chunks = saved_split
    return {
        "op": op,
        "B": B,
        "T": T,
        "H": H,
        "policy": policy,
        "sms": sms,
        "launches": dict(launches),
        "n_launches": sum(launches.values()),
        "aten_ops": dict(mode.ops.most_common()),
        "n_aten_ops": sum(mode.ops.values()),
        "aten_by_line": dict(mode.lines.most_common()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=["gdn", "kda"], default="gdn")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--policy", default="auto", help="LaunchPlan.keep of the step (kernels.vocabulary.KEEP_POLICIES)")
    ap.add_argument("--sms", type=int, default=132, help="split as on a GPU of this many SMs (0: the CPU's plan)")
    ap.add_argument("--hv", type=int, default=None, help="value heads (a multiple of H; grouped: the public op)")
    ap.add_argument("--api", action="store_true", help="the public op's step (validation, dispatch, autograd node)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from kernels.vocabulary import KEEP_POLICIES

    if a.policy not in KEEP_POLICIES:
        ap.error(f"--policy must be one of {', '.join(KEEP_POLICIES)}, got {a.policy!r}")
    if min(a.B, a.T, a.H) < 1 or a.sms < 0:
        ap.error("--B, --T, --H must be >= 1 and --sms >= 0")
    if a.hv is not None and (a.hv < a.H or a.hv % a.H):
        ap.error(f"--hv must be a multiple of --H={a.H}, got {a.hv}")
    r = count_step(a.op, a.B, a.T, a.H, policy=a.policy, sms=a.sms, HV=a.hv, api=a.api)
    if a.json:
        print(json.dumps(r))
        return
    print(
        f"{a.op} B={a.B} T={a.T} H={a.H} policy {a.policy}, split as on {a.sms} SMs: {r['n_launches']} Triton "
        f"launches, {r['n_aten_ops']} ATen ops per step"
    )
    print("launches: " + ", ".join(f"{k} {v}" for k, v in sorted(r["launches"].items(), key=lambda kv: -kv[1])))
    print("ATen ops: " + ", ".join(f"{k} {v}" for k, v in r["aten_ops"].items()))
    print("ATen ops by line of kernels/:")
    for line, n in r["aten_by_line"].items():
        print(f"  {n:3d}  {line}")


if __name__ == "__main__":
    main()
