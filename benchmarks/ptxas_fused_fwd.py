"""Registers and spills of the fused state+output pass (`kernels.ops.gdn.fused.gdn_fused_state_output_kernel`) per
gate form and mode, from the compiler alone (no GPU; `benchmarks/ptxas_report.py`'s ptxas):

    python benchmarks/ptxas_fused_fwd.py [--forms gdn kda kda_gated] [--modes output transition] [--warps 4 8]
        [--variants default tma exp2+tma] [--ptx-dir DIR] [--unaligned]

Each (form, mode, num_warps) is compiled by Triton for sm_90 at the benchmark shape (H=HV=16, K=V=128, 64-token
chunks, bf16, varlen, BV 64, 2 stages); output mode with an initial and a final state, transition with its maps.
Forms: gdn (the scalar gate), kda (the per-key gate cumsum read and exponentiated per V block, GATE_VECTOR), kda_gated
(the Ag pass's gated keys read: PRE_GATED). Variants: `+`-joined names of the pass's code variants (`FUSED_VARIANTS`:
exp2, tma; pipe and ws too) or default. --ptx-dir writes each PTX (a change of the kernel can be checked to leave
another form's code identical by diffing them).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ptxas_report import ptxas_usage  # noqa: E402

SHAPE = {"H": 16, "HV": 16, "K": 128, "V": 128, "BT": 64, "BK": 128, "BV": 64}
BF16, F32, I32 = "*bf16", "*fp32", "*i32"
FORMS = ("gdn", "kda", "kda_gated")
MODES = ("output", "transition")


def _args(form: str, mode: str) -> tuple[dict[str, str], dict[str, Any]]:
    """(pointer and scalar arguments with their types, constexpr values) of one launch: varlen, no seq map in output
    mode (h0 and a final state), the transitions' seq map in transition mode (M and S_ext)."""
    out = mode == "output"
    ptrs = {"k": BF16, "v": BF16, "ag": BF16, "gcum": F32, "cu_seqlens": I32, "chunk_offsets": I32, "ht": F32}
    if out:
        ptrs.update(q=BF16, h0=F32, o=BF16)
    else:
        ptrs.update(m=F32, seq_map=I32)
    if form != "gdn" and out:
        ptrs["aqk"] = BF16
    if form == "kda_gated":
        ptrs["kd"] = BF16
    flags = {"USE_INITIAL_STATE": out, "STORE_FINAL_STATE": not out, "OUTPUT": out, "TRANSITION": not out,
             "IS_VARLEN": True, "USE_SEQ_MAP": not out, "USE_FINAL_IDX": False, "USE_NEED": False, "STORE_STATES": False,
             "HAS_AQK": form != "gdn" and out, "GATE_VECTOR": form != "gdn", "PRE_GATED": form == "kda_gated"}  # fmt: skip
    return {**ptrs, "scale": "fp32", "T": "i32"}, {**SHAPE, **flags}


def _variant_constexprs(variant: str, num_stages: int) -> dict[str, Any]:
    """The kernel's variant constexprs of a `+`-joined variant name ("default": none set)."""
    from kernels.ops.gdn.fused import FUSED_VARIANTS

    names = set() if variant == "default" else set(variant.split("+"))
    if names - set(FUSED_VARIANTS):
        raise SystemExit(f"unknown variant {variant!r}; known: {sorted(FUSED_VARIANTS)} or default")
    return {"EXP2": "exp2" in names, "TMA": "tma" in names, "LOOP_STAGES": num_stages if "pipe" in names else None,
            "WS": "ws" in names}  # fmt: skip


def compile_fused(
    form: str, mode: str, num_warps: int = 4, num_stages: int = 2, variant: str = "default", aligned: bool = True
) -> tuple[dict[str, Any], str]:
    """(ptxas usage and shared bytes, the PTX) of one (form, mode, warps, variant) compiled for sm_90; aligned: every
    pointer argument 16-byte aligned, as a launch with torch tensors specializes it (session 20: without it the loads
    were scalar and the GDN output pass spilled 640 B a thread where the launched code spills 96)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.ops.gdn.fused import gdn_fused_state_output_kernel

    fn = gdn_fused_state_output_kernel
    while type(fn).__name__ != "JITFunction":
        fn = fn.fn
    ptrs, consts = _args(form, mode)
    consts.update(_variant_constexprs(variant, num_stages))
    sig: dict[str, str] = {}
    cx: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for i, name in enumerate(fn.arg_names):
        if name in ptrs:
            sig[name] = ptrs[name]
            if aligned and sig[name].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in consts:
            sig[name] = "constexpr"
            cx[(i,)] = consts[name]
        elif fn.params[i].is_constexpr:  # the code variants: their defaults
            continue
        else:  # an optional tensor not given: None
            sig[name] = "constexpr"
            cx[(i,)] = None
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    ptx = compiled.asm["ptx"]
    return {**ptxas_usage(ptx, 90), "shared": int(compiled.metadata.shared)}, ptx


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":  # the kernel must be a real JIT function to compile for the GPU
        sys.stderr.write("ptxas_fused_fwd: unset TRITON_INTERPRET (it compiles for the GPU target; no GPU needed)\n")
        return 1
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--warps", nargs="+", type=int, default=[4])
    p.add_argument("--variants", nargs="+", default=["default"])
    p.add_argument("--ptx-dir", type=Path, default=None)
    p.add_argument("--unaligned", action="store_true", help="pointers not known 16-byte aligned (before session 20)")
    args = p.parse_args(argv)
    print("| form | mode | variant | warps | registers | spill B (st/ld) | shared KB |\n|---|---|---|---:|---:|---:|---:|")
    for form, mode, variant, warps in itertools.product(args.forms, args.modes, args.variants, args.warps):
        use, ptx = compile_fused(form, mode, warps, variant=variant, aligned=not args.unaligned)
        print(f"| {form} | {mode} | {variant} | {warps} | {use['regs']} | {use['spill_stores']} / {use['spill_loads']} | "
              f"{use['shared'] / 1024:.0f} |", flush=True)  # fmt: skip
        if args.ptx_dir is not None:
            args.ptx_dir.mkdir(parents=True, exist_ok=True)
            name = f"{form}_{mode}_{warps}" + ("" if variant == "default" else f"_{variant}")
            (args.ptx_dir / f"{name}.ptx").write_text(ptx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
