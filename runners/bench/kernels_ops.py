"""What the kernel benchmark times and how (`runners.bench.kernels` runs it): FLA's input recipe (the floors are
`runners.bench.floors`), the do_bench timer, our forward and its variants, FLA's forward.

The inputs and the timer are FLA's anchor method (../shared/anchors/fla-h200.md: `triton.testing.do_bench`
medians, q and k L2-normalised, g = logsigmoid(randn)), on purpose: these figures stand next to FLA's published
ones. `fla_inputs` draws them from the one maker (`runners.workload.make_inputs`, its `fla_recipe`); the engine's
sweep points use that maker's own recipe and `runners.timing` instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from kernels.builds import wait_for_builds
from runners.workload import Workload, make_inputs

H_DEFAULT, K_DIM, V_DIM, C = 16, 128, 128, 64
FLA_MS_ANCHOR = {  # ../shared/anchors/fla-h200.md, forward, ms (do_bench median), H=16
    ("gdn", 1, 8192): 0.831, ("gdn", 1, 32768): 1.263, ("gdn", 1, 65536): 2.504, ("gdn", 1, 131072): 4.969,
    ("gdn", 8, 8192): 1.847, ("kda", 1, 8192): 0.890, ("kda", 1, 32768): 2.282, ("kda", 1, 65536): 4.521,
    ("kda", 1, 131072): 8.950, ("kda", 8, 8192): 3.765,
}


# ---------------------------------------------------------------------------------------------------------------------
# inputs, floors, timing


def fla_inputs(op: str, B: int, T: int, H: int, *, device: str, dtype: str = "bfloat16", seed: int = 0,
               lb: float | None = None, K: int = K_DIM, V: int = V_DIM, grad_out: bool = False,
               HV: int | None = None) -> Workload:
    """FLA's recipe at the bench's head dims (`runners.workload.make_inputs(..., fla_recipe=True)`). lb: gate
    g = lb * sigmoid(randn) (slow decay) instead of logsigmoid(randn); `grad_out` also draws `do`; HV: value heads
    (None: H)."""
    return make_inputs(op, B=B, T=T, H=H, K=K, V=V, dtype=dtype, lb=lb, seed=seed, device=device, grad_out=grad_out,
                       fla_recipe=True, HV=HV)


class Timer:
    """do_bench median on CUDA; a wall-clock median on CPU (dry run). Both after one untimed call and the TileLang
    builds it may have left running (`kernels.wait_for_builds`): never a mix of Triton and TileLang calls."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __call__(self, fn: Callable[[], Any], warmup: int = 25, rep: int = 200) -> tuple[float, float, float]:
        fn()
        wait_for_builds()
        if self.cuda:
            from triton.testing import do_bench

            r = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
            return float(r[0]), float(r[1]), float(r[2])
        ts = []
        for _ in range(max(1, min(3, rep))):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        return ts[len(ts) // 2], ts[0], ts[-1]


def _timed(timer: Timer, fn: Callable[..., Any], *args: Any, warmup: int = 25, rep: int = 200,
           **kw: Any) -> tuple[float, float, float]:
    """timer(fn(*args, **kw)), binding the arguments now."""
    return timer(lambda: fn(*args, **kw), warmup=warmup, rep=rep)


def measure_ceilings(timer: Timer, device: str) -> dict[str, float]:
    if device != "cuda":
        return {"copy_GBps": float("nan"), "matmul_TFLOPs": float("nan")}
    n = 1 << 29  # 1 GiB of bf16 each side
    src = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    ms = _timed(timer, torch.Tensor.copy_, torch.empty_like(src), src, warmup=50, rep=300)[0]
    copy = 2 * n * 2 / (ms * 1e-3) / 1e9
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    ms = _timed(timer, torch.matmul, a, b, out=torch.empty_like(a), warmup=100, rep=500)[0]
    mm = 2 * 8192**3 / (ms * 1e-3) / 1e12
    torch.cuda.empty_cache()
    return {"copy_GBps": copy, "matmul_TFLOPs": mm}


# ---------------------------------------------------------------------------------------------------------------------
# the callables


def ours(op: str, q, k, v, g, beta, *, split: int | None = None, fuse: bool | None = None,
         configs: dict[str, Any] | None = None, api: bool = True, warm: int | None = None,
         **kw: Any) -> tuple[torch.Tensor, Any]:
    """Our Triton forward: through the public entry, or the op's orchestration directly (variants; `warm`: the
    split's gate-certified warmup window in chunks, `kernels.common.warm_split`)."""
    import kernels

    if warm is not None:
        kw["warm_chunks"] = warm
    if api and split is None and fuse is None and not configs and warm is None:
        return kernels.forward(op, q, k, v, g, beta, backend="triton", **kw)
    if op == "gdn":
        from kernels.ops.gdn.chunk import chunk_gdn_fwd as fwd
    else:
        from kernels.ops.kda.chunk import chunk_kda_fwd as fwd
    from kernels.plan import plan_with

    scale = kw.pop("scale", None) or q.shape[-1] ** -0.5
    return fwd(q, k, v, g, beta, scale=scale, split_chunks=split, fuse_output=fuse, plan=plan_with(None, configs or {}),
               **kw)


def fla_fn(op: str) -> Callable[..., Any]:
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda

    return chunk_kda


def warm_variants(B: int, T: int, warm: int, splits: tuple[int, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """The gate-certified warmup (window `warm` chunks; 0 = exact maps, explicitly) at the automatic split and at
    the segment lengths `splits` (chunks; those shorter than the sequence): one process, old and new side by side."""
    nt = math.ceil(T / C)
    out: list[tuple[str, dict[str, Any]]] = [(f"warm{warm}", {"warm": warm})]
    out += [(f"warm{warm}_split{s}", {"warm": warm, "split": s}) for s in splits if s < nt]
    return out


def variants(op: str, B: int, T: int, explore: bool | str | None, warm: tuple[int, ...] = (),
             warm_splits: tuple[int, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """(label, kwargs of `ours`) per timed variant of one shape; the first is the headline (public API); `warm`:
    windows of the gate-certified warmup to time (`warm_variants`), each at the automatic split and `warm_splits`."""
    from kernels.configs import LaunchConfig

    out: list[tuple[str, dict[str, Any]]] = [("ours", {})]
    for w in warm:
        out += warm_variants(B, T, w, warm_splits)
    if not explore:
        return out
    nt = math.ceil(T / C)
    if B == 1:
        out.append(("plain", {"split": 0}))
        for s in ((16, 32, 64) if explore == "light" else (8, 16, 32, 64, 128)):
            if s < nt:
                out.append((f"split{s}", {"split": s}))
    out.append(("unfused", {"fuse": False}))
    if explore == "light":
        return out
    if (B, T) in ((8, 8192), (1, 65536)):
        # the fused state pass (default BV 64, 4 warps, 1 stage)
        for bv, nw, ns in ((64, 4, 2), (32, 4, 1), (32, 4, 2), (64, 8, 1), (64, 8, 2)):
            cfg = LaunchConfig(BV=bv, num_warps=nw, num_stages=ns)
            out.append((f"state_bv{bv}_w{nw}_s{ns}", {"configs": {"chunk_state_output_fwd": cfg}}))
        # the intra-chunk kernel (defaults: GDN BK 32 BV 64 4 warps; KDA BK 32 BV 64 8 warps)
        wy = "wy_gdn_fwd" if op == "gdn" else "wy_kda_fwd"
        alts = ((64, 64, 4), (32, 64, 8)) if op == "gdn" else ((32, 64, 4), (64, 64, 8))
        for bk, bv, nw in alts:
            out.append((f"wy_bk{bk}_bv{bv}_w{nw}", {"configs": {wy: LaunchConfig(BK=bk, BV=bv, num_warps=nw, num_stages=2)}}))
    if B == 1 and T == 65536:
        # the transition pass of the split (default BV 64, 4 warps, 1 stage)
        for bv, nw, ns in ((64, 4, 2), (32, 4, 1), (128, 8, 1)):
            cfg = LaunchConfig(BV=bv, num_warps=nw, num_stages=ns)
            out.append((f"trans_bv{bv}_w{nw}_s{ns}", {"configs": {"chunk_state_transition_fwd": cfg}}))
    return out
