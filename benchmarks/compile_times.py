"""Where a first call's time goes: the Triton compile of every kernel a GDN / KDA fwd+bwd launches, per kernel, no GPU.

    python benchmarks/compile_times.py [--ops gdn kda] [--T 8192] [--H 16] [--D 128] [--arch 90] [--regs]
        [--out benchmarks/results/compile_times_sm90.md]

Runs `kernels.chunk_gdn` / `kernels.chunk_kda` forward and backward on CPU tensors at the first-call benchmark's
shape (`benchmarks/first_call_ours.py`: B=1 T=8192 H=16 K=V=128 bf16, fp32 gate) with every Triton launch
intercepted: each launch is specialised by Triton's own binder (the constexprs, the int and pointer attributes and
the launch options a CUDA launch would see), compiled by `triton.compile` for `sm_<arch>` (default 90: the H200)
into a fresh cache, timed, and not run (the outputs stay uninitialised: the launch sequence never reads device
data). A launch that hits an already compiled specialisation costs nothing, as on the device. `--regs` adds the
registers and spill bytes per thread from the ptxas that ships with Triton (`benchmarks/ptxas_report.py`).
The cost of a compile is its CPU seconds (this process and its ptxas child: a loaded host inflates the wall
seconds, shown too, not these); the order and the shares are what carry over to the device's first call.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (ptxas): a compile's cost, whatever else loads the host."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def record_compiles(arch: int, regs: bool) -> tuple[list[dict[str, Any]], Any]:
    """Patch `JITFunction.run` so each launch compiles (once per specialisation) for sm_<arch> instead of running;
    returns the list the rows go to and a function that undoes the patch."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    orig = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, opts = binder(*args, **kwargs)
        key = f"{self.fn.__module__}.{self.fn.__name__}:{spec}:{sorted(opts.items())}"
        if key in seen:
            return
        seen.add(key)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, opts)
        t0, c0 = time.perf_counter(), _cpu_seconds()
        compiled = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        row: dict[str, Any] = {
            "kernel": self.fn.__name__,
            "seconds": _cpu_seconds() - c0,
            "wall": time.perf_counter() - t0,
            "num_warps": options.num_warps,
            "num_stages": options.num_stages,
            "flags": {n: v for n, v in zip(self.arg_names, bound.values(), strict=True) if isinstance(v, bool)},
            "blocks": {n: v for n, v in zip(self.arg_names, bound.values(), strict=True) if n in ("BK", "BV")},
        }
        if regs:
            from benchmarks.ptxas_report import ptxas_usage

            t1 = _cpu_seconds()
            row.update(ptxas_usage(compiled.asm["ptx"], arch))
            row["ptxas_seconds"] = _cpu_seconds() - t1
        rows.append(row)

    JITFunction.run = run  # type: ignore[method-assign]

    def undo() -> None:
        JITFunction.run = orig  # type: ignore[method-assign]

    return rows, undo


def call(op: str, T: int, H: int, D: int) -> None:
    """One fwd+bwd of `op` on CPU tensors at [1, T, H, D] bf16 (the first-call benchmark's inputs)."""
    import torch
    import torch.nn.functional as F

    import kernels

    torch.manual_seed(0)
    q = F.normalize(torch.randn(1, T, H, D), dim=-1).bfloat16().requires_grad_()
    k = F.normalize(torch.randn(1, T, H, D), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(1, T, H, D).bfloat16().requires_grad_()
    g = (-torch.sigmoid(torch.randn(*((1, T, H) if op == "gdn" else (1, T, H, D))))).requires_grad_()
    beta = torch.sigmoid(torch.randn(1, T, H)).bfloat16().requires_grad_()
    fn = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda
    o, _ = fn(q, k, v, g, beta, backend="triton")
    o.float().square().sum().backward()


def table(op: str, rows: list[dict[str, Any]], regs: bool) -> list[str]:
    head = "| kernel | CPU s | wall s | BK, BV | warps | stages | flags (bool args) |" + (
        " ptxas CPU s | regs | spill st/ld B |" if regs else ""
    )
    out = [
        f"### {op}: {len(rows)} compiles, {sum(r['seconds'] for r in rows):.1f} CPU s",
        "",
        head,
        "|---|---:|---:|---|---:|---:|---|" + ("---:|---:|---:|" if regs else ""),
    ]
    for r in sorted(rows, key=lambda r: -r["seconds"]):
        flags = ", ".join(f"{n}={int(v)}" for n, v in r["flags"].items())
        blocks = ", ".join(f"{n}={v}" for n, v in r["blocks"].items())
        line = f"| {r['kernel']} | {r['seconds']:.1f} | {r['wall']:.1f} | {blocks} | {r['num_warps']} | {r['num_stages']} | {flags} |"
        if regs:
            line += f" {r['ptxas_seconds']:.1f} | {r.get('regs')} | {r.get('spill_stores')}/{r.get('spill_loads')} |"
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.stderr.write("compile_times: unset TRITON_INTERPRET (it compiles for the GPU target; no GPU needed)\n")
        return 1
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--regs", action="store_true", help="registers and spills per kernel (one more ptxas run each)")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown tables here (default: print them)")
    args = ap.parse_args(argv)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_times_")  # a fresh cache: every compile is cold
    os.environ["CPBENCH_PARALLEL_COMPILE"] = "0"  # each compile alone, at its launch (benchmarks/compile_parallel.py)
    import triton

    lines = [
        f"# Compile time per kernel of a fwd+bwd (Triton {triton.__version__}, sm_{args.arch}, compile only, no GPU; "
        f"B=1 T={args.T} H={args.H} K=V={args.D} bf16)",
        "",
        f"command: `python benchmarks/compile_times.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
    ]
    for op in args.ops:  # each op in its own fresh cache, as in its own first process
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"compile_times_{op}_")
        rows, undo = record_compiles(args.arch, args.regs)
        try:
            call(op, args.T, args.H, args.D)
        finally:
            undo()
        lines += table(op, rows, args.regs) + [""]
        print("\n".join(table(op, rows, args.regs)), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
