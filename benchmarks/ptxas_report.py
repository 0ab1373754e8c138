"""Registers and spills of the backward's Triton kernels per launch config, from the compiler alone (no GPU).

    python benchmarks/ptxas_report.py [--ops gdn kda] [--kernels chunk_bwd_dqk wy_bwd ...] [--all-configs]
        [--arch 90] [--out benchmarks/results/ptxas_bwd_sm90.md]

Each (kernel, config) is compiled by Triton for the CUDA target `sm_<arch>` (default 90: the H200) at the benchmark
shape's constants (H=16, K=V=128, 64-token chunks, bf16 inputs, dense), and the PTX is assembled by the ptxas that
ships with Triton with `-v`: registers per thread and the bytes each thread spills to local memory (stores,
loads). No device is needed, so this runs on a CPU machine (without TRITON_INTERPRET). It explains, it does not time: a spilling config may
still be fast (spills hit L1) and only the device decides (`benchmarks/autotune_h200.py`). By default the
kernel's default config and its variants in `num_warps` and one block size are compiled; `--all-configs` compiles
the whole declared space.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = {"H": 16, "K": 128, "V": 128, "BT": 64}
BF16, F32 = "*bf16", "*fp32"
# per kernel: its pointer arguments' element types (fp32 where the launcher passes fp32) and scalar arguments
SIGNATURES: dict[str, dict[str, str]] = {
    "chunk_bwd_dqk": {"q": BF16, "k": BF16, "g": BF16, "h": BF16, "dh": BF16, "v_new": BF16, "dv_new": BF16, "do": BF16, "dq": BF16, "dk": F32, "dw": BF16, "dg": F32, "scale": "fp32", "T": "i32"},
    "wy_bwd": {"k": BF16, "v": BF16, "g": BF16, "beta": BF16, "tt": BF16, "w": BF16, "u": BF16, "dv_new": BF16, "dw": BF16, "dk_part": F32, "dg_part": F32, "dk": BF16, "dv": BF16, "dbeta": BF16, "dg": BF16, "T": "i32"},
    "wy_inverse": {"k": BF16, "g": BF16, "beta": BF16, "tt": BF16, "kg": BF16, "gc": F32, "T": "i32"},
    "chunk_bwd_dqk_wy": dict.fromkeys(("q", "k", "v", "beta", "tt", "h", "dh", "v_new", "dv_new", "do", "dq", "dk", "dv", "dbeta"), BF16) | {"g": F32, "dg": F32, "scale": "fp32", "T": "i32"},
    "chunk_state_bwd": {"q": BF16, "k": BF16, "w": BF16, "g": F32, "aqk": BF16, "do": BF16, "dht": F32, "dh": BF16, "dv_new": BF16, "ds_out": F32, "scale": "fp32", "T": "i32"},
}
_KERNEL_FNS = {
    "chunk_bwd_dqk": ("kernels.common.chunk_bwd", "chunk_bwd_dqk_kernel"),
    "wy_bwd": ("kernels.common.chunk_bwd", "wy_bwd_kernel"),
    "wy_inverse": ("kernels.common.chunk_bwd", "wy_inverse_kernel"),
    "chunk_bwd_dqk_wy": ("kernels.common.dqk_wy_bwd", "chunk_bwd_dqk_wy_kernel"),
    "chunk_state_bwd": ("kernels.common.state_bwd", "chunk_state_bwd_kernel"),
}

def _jit(kernel: str) -> Any:
    """The kernel's JITFunction (under its `triton.heuristics` wrappers)."""
    import importlib

    mod, name = _KERNEL_FNS[kernel]
    fn = getattr(importlib.import_module(mod), name)
    while type(fn).__name__ != "JITFunction":
        fn = fn.fn
    return fn


def _constexprs(kernel: str, op: str, cfg: dict[str, int]) -> dict[str, Any]:
    """The constants a launch at the benchmark shape passes (dense: no varlen bounds, maps or optional outputs)."""
    from kernels.common.chunk_bwd import VECTOR_GATE_DOT

    gate_vector = op == "kda"
    base: dict[str, Any] = {**SHAPE, "GATE_VECTOR": gate_vector, "IS_VARLEN": False, "cu_seqlens": None, "G": 1,
                            "chunk_indices": None}
    if kernel == "chunk_bwd_dqk_wy":  # (session 19's SUM_GROUP: off at G = 1)
        return {**base, "BK": cfg["BK"], "BV": cfg["BV"], "DOT_PREC": VECTOR_GATE_DOT, "SUM_GROUP": False}
    if kernel in ("chunk_bwd_dqk", "wy_bwd"):
        return {**base, "BK": cfg["BK"], "BV": cfg["BV"], "DOT_PREC": VECTOR_GATE_DOT}
    if kernel == "wy_inverse":
        return {**base, "BK": cfg["BK"]}
    # chunk_state_bwd, main launch of a plain (unsplit) pass: dht given, dh and dv_new stored, ds_out stored
    return {**base, "BK": SHAPE["K"], "BV": cfg["BV"], "chunk_offsets": None, "seq_map": None, "final_idx": None, "need": None,
            "USE_DHT": True, "STORE_DS": True, "STORE_DH": True, "USE_SEQ_MAP": False, "USE_FINAL_IDX": False,
            "USE_NEED": False}


def compile_report(kernel: str, op: str, cfg: dict[str, int], arch: int = 90, aligned: bool = True) -> dict[str, Any]:
    """{"regs", "spill_stores", "spill_loads", "shared"} of one (kernel, op, config) compiled for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _jit(kernel)
    consts = _constexprs(kernel, op, cfg)
    sig: dict[str, str] = {}
    cx: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(fn.arg_names):
        if name in SIGNATURES[kernel]:
            sig[name] = SIGNATURES[kernel][name]
            if aligned and sig[name].startswith("*"):  # as a launch specialises a 16-byte aligned tensor's pointer
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "constexpr"
            cx[(i,)] = consts[name]
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    try:
        usage = ptxas_usage(compiled.asm["ptx"], arch)
    except RuntimeError as err:
        raise RuntimeError(f"ptxas failed for {kernel} {cfg}: {err}") from err
    shared = int(compiled.metadata.shared)
    return {**usage, "shared": shared, "per_sm": programs_per_sm(usage["regs"], shared, cfg["num_warps"])}


def programs_per_sm(regs: int | None, shared: int, num_warps: int) -> int | None:
    """Programs resident per SM of sm_90 (the occupancy calculator's rules): 64K registers, each warp's allocated in
    whole 256s (regs per thread rounded up to 8), 64 warps, 228 KB shared memory with 1 KB reserved per program."""
    if regs is None:
        return None
    by_regs = 65536 // (32 * -(-regs // 8) * 8) // num_warps
    return min(by_regs, 64 // num_warps, 233472 // (shared + 1024), 32)


def triton_tool(name: str) -> Path:
    """A CUDA tool Triton ships (ptxas, nvdisasm, cuobjdump): its path in Triton's NVIDIA backend."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def ptxas_usage(ptx: str, arch: int = 90) -> dict[str, int | None]:
    """{"regs", "spill_stores", "spill_loads"} per thread of one PTX text, from Triton's ptxas with `-v`."""
    ptxas = triton_tool("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        done = subprocess.run([str(ptxas), "-v", f"--gpu-name={gpu}", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(text.strip().splitlines()[-1] if text.strip() else "")
    return ptxas_numbers(text)


def ptxas_numbers(text: str) -> dict[str, int | None]:
    """{"regs", "spill_stores", "spill_loads"} from ptxas' `-v` report (None where it names none)."""
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"regs": int(regs.group(1)) if regs else None, "spill_stores": int(spill.group(1)) if spill else None,
            "spill_loads": int(spill.group(2)) if spill else None}


def configs_of(kernel: str, every: bool) -> list[dict[str, int]]:
    """The kernel's default and its one-knob variants (num_warps, then each block size), or its whole space."""
    import kernels.common.chunk_bwd  # noqa: F401  (registers the backward's specs)
    import kernels.common.state_bwd  # noqa: F401
    from kernels.configs import get_spec

    spec = get_spec(kernel)
    default = spec.default.as_dict()
    if every:
        names = sorted(spec.space)
        return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(spec.space[n] for n in names))]
    out = [default]
    for knob in ("num_warps", "BK", "BV"):
        for v in spec.space.get(knob, ()):
            cand = {**default, knob: v}
            if cand not in out:
                out.append(cand)
    # the two knobs that drive register pressure together: the smallest column block at the most warps
    small = {**default, **{k: min(spec.space[k]) for k in ("BK", "BV") if k in spec.space and k in default},
             "num_warps": max(spec.space["num_warps"])}
    if small not in out:
        out.append(small)
    return out


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernels must be real JIT functions to compile for the GPU
        sys.stderr.write("ptxas_report: unset TRITON_INTERPRET (it compiles for the GPU target; no GPU needed)\n")
        return 1
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--kernels", nargs="+", default=list(SIGNATURES), choices=list(SIGNATURES))
    ap.add_argument("--all-configs", action="store_true")
    ap.add_argument("--config", action="append", default=[], type=json.loads, metavar="JSON",
                    help='only these configs, e.g. \'{"BK": 32, "num_warps": 1, "num_stages": 2}\' (repeatable)')
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--unaligned", action="store_true",
                    help="pointers without the 16-byte divisibility a launch specialises (the reports before session 12)")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown table here (default: print it)")
    args = ap.parse_args(argv)
    import triton

    import kernels.common.chunk_bwd  # noqa: F401  (registers the backward's specs)
    import kernels.common.state_bwd  # noqa: F401
    from kernels.configs import get_spec

    lines = [f"# Registers and spills of the backward kernels (compile only: Triton {triton.__version__}, its ptxas, "
             f"sm_{args.arch}; H=16 K=V=128 BT=64 bf16 dense)", "",
             f"command: `python benchmarks/ptxas_report.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             "Bytes spilled per thread (stores / loads); 255 registers is the per-thread maximum. `*` = the default.",
             "", "| kernel | op | config | regs | spill stores | spill loads | shared B | programs/SM |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for kernel in args.kernels:
        default = get_spec(kernel).default.as_dict()
        for op in args.ops:
            for cfg in args.config or configs_of(kernel, args.all_configs):
                try:
                    r = compile_report(kernel, op, cfg, args.arch, aligned=not args.unaligned)
                    row = f"{r['regs']} | {r['spill_stores']} | {r['spill_loads']} | {r['shared']} | {r['per_sm']}"
                except Exception as err:  # a config the compiler refuses is a row, not a crash
                    row = f"error: {str(err).splitlines()[0][:80]} | | | |"
                mark = " *" if cfg == default else ""
                lines.append(f"| {kernel} | {op} | `{cfg}`{mark} | {row} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
