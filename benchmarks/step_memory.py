"""What a training step holds at its peak, tensor by tensor, on any device (issue 26's "peak memory <= FLA's").

Every tensor an aten op creates during one fwd+bwd step is counted while its storage lives (a TorchDispatchMode sees
each op's outputs; a storage is freed when the last tensor on it dies). The step's peak above what was live before
it, and the tensors live at that peak grouped by where they were made (the innermost frame in `kernels/` or FLA),
name what to free or not keep. It runs under the Triton interpreter on the CPU too (the kernels' own allocations are
torch's), so a change to what the step holds can be checked without a GPU; on CUDA the tracked peak is printed
beside `torch.cuda.max_memory_allocated` (the allocator's, which the engine's profile stores).

    TRITON_INTERPRET=1 python benchmarks/step_memory.py --op gdn --T 1024 --H 2 [--HV 4] [--seg-chunks 4] [--top 12]
    python benchmarks/step_memory.py --op gdn --T 65536 --H 16 [--HV 32] --fla --device cuda

Per token and value head (B/th) the bytes do not depend on T or HV (chunk states scale with T / 64), so a small shape
gives the H200's ratios; `--seg-chunks` takes the segment split a long sequence gets on a GPU. FLA's Triton kernels
do not run under the interpreter (`--fla` is for CUDA).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import weakref
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OURS = str(ROOT / "kernels")


def _site() -> str | None:
    """The innermost caller frame in our kernels or FLA, as file:line function; None for the Triton interpreter's own
    copies of a launch's arguments (they live only during the launch, and a GPU has none)."""
    stack = traceback.extract_stack(limit=40)
    if any(fr.filename.endswith("triton/runtime/interpreter.py") for fr in stack):
        return None
    for fr in reversed(stack):
        f = fr.filename
        if (f.startswith(OURS) or "/fla/" in f) and "step_memory" not in f:
            short = f.split("/kernels/", 1)[-1] if f.startswith(OURS) else "fla/" + f.split("/fla/", 1)[-1]
            return f"{short}:{fr.lineno} {fr.name}"
    return "(outside)"


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created inside the mode that are still alive; the peak and what was live at it."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = defaultdict(int)  # storage data_ptr -> live tensors on it
        self.live: dict[int, tuple[int, str, str]] = {}  # data_ptr -> (bytes, site, shape/dtype)
        self.now = self.peak = 0
        self.at_peak: list[tuple[int, str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key, nbytes = st.data_ptr(), st.nbytes()
        if nbytes == 0:
            return
        if key not in self.live:
            site = _site()
            if site is None:
                return
            self.live[key] = (nbytes, site, f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
            self.now += nbytes
            if self.now > self.peak:
                self.peak, self.at_peak = self.now, list(self.live.values())
        self.refs[key] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.now -= self.live.pop(key)[0]


def _forward(op: str, who: str, xs: list[torch.Tensor], scale: float) -> Callable[[], torch.Tensor]:
    """The op's forward (its output o) by ours (the triton backend) or FLA's Triton path."""
    q, k, v, g, beta = xs
    if who == "ours":
        import kernels

        fn = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda
        return lambda: fn(q, k, v, g, beta, scale=scale, backend="triton")[0]
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_fn
    else:
        from fla.ops.kda import chunk_kda as fla_fn
    return lambda: fla_fn(q, k, v, g, beta, scale=scale)[0]


def measure(op: str, who: str, *, B: int, T: int, H: int, HV: int, K: int, device: str) -> tuple[LiveBytes, int | None]:
    """One warm-up step, then the tracked step (`runners.training.train_step` on `leaves` of the engine's inputs);
    the allocator's peak above the step's start on CUDA. FLA's Hopper guard (FLA #640) is lifted as the fla backend
    lifts it."""
    from runners.peers.fla import hopper_guard
    from runners.training import leaves, train_step
    from runners.workload import make_inputs

    w = make_inputs(op, B=B, T=T, H=H, HV=HV, K=K, V=K, device=device, lb=-1.0, grad_out=True)
    assert w.do is not None
    xs = leaves(w.tensors)
    step = train_step(_forward(op, who, xs, K**-0.5), xs, w.do)
    with hopper_guard({"bypass_hopper_guard": who == "fla"}):
        step()
        cuda_peak = None
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        with LiveBytes() as live:
            step()
    if device == "cuda":
        torch.cuda.synchronize()
        cuda_peak = torch.cuda.max_memory_allocated() - base
    return live, cuda_peak


def report(name: str, live: LiveBytes, cuda_peak: int | None, unit: int, top: int) -> None:
    """The peak in bytes and per token-head, and the largest groups live at it."""
    extra = f"  (allocator: {cuda_peak / 2**20:.1f} MiB)" if cuda_peak is not None else ""
    print(
        f"\n{name}: peak {live.peak / 2**20:.2f} MiB above the inputs = {live.peak / unit:.0f} B per token and value head{extra}"
    )
    groups: dict[str, list[Any]] = defaultdict(lambda: [0, 0, ""])
    for nbytes, site, shape in live.at_peak:
        g = groups[site]
        g[0], g[1], g[2] = g[0] + nbytes, g[1] + 1, shape
    for site, (nbytes, n, shape) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {nbytes / unit:7.0f} B/th  {n:2d} x  {shape:28s} {site}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("gdn", "kda"), default="gdn")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--HV", type=int, default=0, help="value heads (grouped: a multiple of H; default H)")
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--fla", action="store_true", help="FLA's Triton path beside ours")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--seg-chunks",
        type=int,
        default=0,
        help="ours: split every longer sequence into segments of this many chunks, as a GPU with few "
        "programs per SM does (`kernels.common.seqsplit.auto_seg_chunks`; the CPU never splits)",
    )
    args = ap.parse_args(argv)
    if args.fla and args.device != "cuda":
        ap.error("--fla needs --device cuda: FLA's Triton kernels do not run under the interpreter")
    if args.seg_chunks:
        from kernels.common import seqsplit

        seqsplit.auto_seg_chunks = lambda index, **_: args.seg_chunks  # type: ignore[assignment]
    HV = args.HV or args.H
    unit = args.B * args.T * HV
    who = ("ours", "fla") if args.fla else ("ours",)
    peaks = {}
    for w in who:
        live, cuda_peak = measure(args.op, w, B=args.B, T=args.T, H=args.H, HV=HV, K=args.K, device=args.device)
        report(
            f"{args.op} {w} B={args.B} T={args.T} H={args.H} HV={HV} K=V={args.K} {args.device}",
            live,
            cuda_peak,
            unit,
            args.top,
        )
        peaks[w] = live.peak
    if len(peaks) == 2:
        print(f"\nours / FLA: {peaks['ours'] / peaks['fla']:.3f}")


if __name__ == "__main__":
    main()
