"""FlashKDA on a GPU (issue 27, item 3): why its `fwd` raised "all tensors must be on CUDA", then its forward against
FLA's Triton `chunk_kda` and the fp32 per-token reference on the same raw inputs; GPU only.

    python benchmarks/flashkda_probe.py --out $OUT [--T 8192 65536] [--H 16] [--reps 50] [--build SRC]

The inputs are the call FlashKDA's kernel computes (its flash_kda/__init__.py docstring and csrc/flash_kda.cpp): bf16
q, k, v, the raw gate g `[1, T, H, 128]`, beta's logits, fp32 A_log `[H]` and dt_bias `[H, 128]`, `lower_bound`, int64
`cu_seqlens` on the GPU (two sequences), K = V = 128, no grouped value heads. FlashKDA applies the safe gate
(`lower_bound * sigmoid(exp(A_log) (g + dt_bias))`), beta's sigmoid and the q/k L2 norm in its kernel; FLA's `chunk_kda`
is called with the same in-kernel flags (FLA_FLASH_KDA=0: its Triton path) and the reference gets the activated
inputs (`kernels.common.gate`, `kernels.common.l2norm`).

Diagnosis first. csrc/flash_kda.cpp raises "all tensors must be on CUDA" from one TORCH_CHECK over q, k, v, g, beta, out
and its workspace (allocated by the wrapper on q.device); the other tensors have their own messages (A_log, dt_bias,
cu_seqlens, states). So with every input on the GPU the check can only fail if the extension's compiled `is_cuda()`
disagrees with Python's: a wheel built against another torch (ABI) than the one installed. It is that: the
0.0.1.post20260901 wheel was compiled against torch >= 2.13's TensorImpl layout (`runners.peers.flash_kda`'s docstring
has the evidence), so under torch 2.11/2.12 it fails for any input; `abi_refusal` in the output says so up front.
The probe records, before any call: torch's version and CUDA, the wheel's version and its declared requirements, the
extension file and what it links, the ABI verdict; each tensor's device, dtype and contiguity as Python sees them;
then the call's outcome (the error verbatim).

`--build SRC` (the fix): compile FlashKDA's extension from its source against the installed torch first (a
directory, or a .tar.xz of one folder, holding FlashKDA's csrc/, flash_kda/ and its CUTLASS submodule's include/ and
tools/util/include/ under cutlass/), with the flags of FlashKDA's setup.py for sm_90a (torch.utils.cpp_extension,
nvcc and ninja; verbose), and probe that build instead of an installed wheel.
It also routes the same call through FLA's dispatch under no_grad (`runners.peers.fla_registry.recording`) to show
whether FLA hands it to FlashKDA.

Writes $OUT/flashkda_probe.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels import reference  # noqa: E402
from kernels.common.gate import activate_beta, activate_gate  # noqa: E402
from kernels.common.l2norm import l2norm  # noqa: E402
from runners.correctness import rel_l2  # noqa: E402
from runners.peers.flash_kda import installed_abi_refusal  # noqa: E402
from runners.versions import git_sha, peer_versions  # noqa: E402

LOWER_BOUND = -5.0
D = 128


# FlashKDA's setup.py nvcc flags (less --threads and ptxas -v), for the Hopper target only
NVCC_FLAGS = [
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "--ptxas-options=--register-usage-level=10,--warn-on-spills",
    "-lineinfo",
    "-gencode",
    "arch=compute_90a,code=sm_90a",  # a flag naming an arch: torch adds none of its own
]


def build_from_source(src: Path, work: Path) -> str:
    """Compile FlashKDA's extension from `src` against the installed torch, register it as `flash_kda_C` and put its
    Python wrapper first on the path; returns what was built and how long it took."""
    from torch.utils.cpp_extension import load

    if src.is_file():
        with tarfile.open(src) as tar:
            tar.extractall(work, filter="data")
        (src,) = [p for p in work.iterdir() if p.is_dir()]
    cutlass, build = src / "cutlass", work / "build"
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    module = load(
        name="flash_kda_C",
        sources=[str(src / "csrc" / "flash_kda.cpp"), str(src / "csrc" / "smxx" / "fwd_launch.cu")],
        extra_include_paths=[str(cutlass / "include"), str(cutlass / "tools" / "util" / "include"), str(src / "csrc")],
        extra_cflags=["-O3", "-Wno-psabi"],
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=str(build),
        verbose=True,
    )
    sys.modules["flash_kda_C"] = module  # what flash_kda/__init__.py imports
    sys.path.insert(0, str(src))
    return f"built {module.__file__} from {src} against torch {torch.__version__} in {time.monotonic() - t0:.0f} s"


def environment(built: str | None = None) -> dict[str, Any]:
    """Versions and the extension's build facts (what it was built against, what it links)."""
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_sha": git_sha(),
        "device": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(),
        **peer_versions(),
        "abi_refusal": None if built else installed_abi_refusal(),
        "built_from_source": built,
    }
    for dist in ("tokenspeed-flashkda", "flash-kda"):
        try:
            env["flash_kda_requires"] = importlib.metadata.requires(dist)
            env["flash_kda_dist"] = dist
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import flash_kda_C  # type: ignore[import-not-found]

        env["extension"] = flash_kda_C.__file__
        ldd = subprocess.run(["ldd", flash_kda_C.__file__], capture_output=True, text=True, timeout=30)
        env["extension_links"] = [ln.strip() for ln in ldd.stdout.splitlines() if "torch" in ln or "cuda" in ln]
    except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
        env["extension_import_error"] = f"{type(err).__name__}: {err}"
    return env


def raw_inputs(T: int, H: int, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = torch.device("cuda")

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev)

    q, k, v, g_raw = (randn(1, T, H, D).to(torch.bfloat16) for _ in range(4))
    beta = randn(1, T, H).to(torch.bfloat16)
    A_log = (torch.rand(H, generator=g, device=dev) * 2 - 1).float()
    dt_bias = (randn(H, D) * 0.1).float()
    cu = torch.tensor([0, T // 3, T], dtype=torch.int64, device=dev)
    return {"q": q, "k": k, "v": v, "g": g_raw, "beta": beta, "A_log": A_log, "dt_bias": dt_bias, "cu_seqlens": cu}


def tensor_facts(x: dict[str, Any]) -> dict[str, Any]:
    return {
        n: {
            "device": str(t.device),
            "is_cuda": t.is_cuda,
            "dtype": str(t.dtype),
            "contiguous": t.is_contiguous(),
            "shape": list(t.shape),
        }
        for n, t in x.items()
    }


def flash_kda_fwd(x: dict[str, Any]) -> torch.Tensor:
    import flash_kda  # type: ignore[import-not-found]

    out = torch.empty_like(x["v"])
    flash_kda.fwd(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        D**-0.5,
        out,
        x["A_log"],
        x["dt_bias"],
        LOWER_BOUND,
        cu_seqlens=x["cu_seqlens"],
    )
    return out


def fla_kda(x: dict[str, Any]) -> torch.Tensor:
    from fla.ops.kda import chunk_kda

    o, _ = chunk_kda(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        scale=D**-0.5,
        cu_seqlens=x["cu_seqlens"],
        use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True,
        safe_gate=True,
        lower_bound=LOWER_BOUND,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"].reshape(-1),
        state_v_first=True,
    )
    return o


def ref_kda(x: dict[str, Any]) -> torch.Tensor:
    g = activate_gate("kda", x["g"], A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND)
    q, k = l2norm(x["q"]).float(), l2norm(x["k"]).float()
    return reference(
        "kda", q, k, x["v"].float(), g, activate_beta(x["beta"]).float(), scale=D**-0.5, cu_seqlens=x["cu_seqlens"]
    )[0]


def median_ms(fn: Any, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def probe(T: int, H: int, reps: int) -> dict[str, Any]:
    from runners.peers.fla_registry import DispatchRecord, recording

    x = raw_inputs(T, H)
    row: dict[str, Any] = {"T": T, "H": H, "inputs": tensor_facts(x)}
    try:
        with torch.no_grad():
            o = flash_kda_fwd(x)
        torch.cuda.synchronize()
        row["flash_kda"] = "ran"
    except Exception as err:  # noqa: BLE001 - the error is the finding
        row["flash_kda"] = f"{type(err).__name__}: {err}"
        o = None
    print(json.dumps({"T": T, "flash_kda": row["flash_kda"]}), flush=True)  # the finding first: a cut run keeps it
    record = DispatchRecord()
    try:
        with torch.no_grad(), recording(record):
            fla_kda(x)
        row["fla_dispatch"] = record.as_dict("kda")
    except Exception as err:  # noqa: BLE001
        row["fla_dispatch"] = f"{type(err).__name__}: {err}"
    print(json.dumps({"T": T, "fla_dispatch": row["fla_dispatch"]}, default=str), flush=True)
    os.environ["FLA_FLASH_KDA"] = "0"  # FLA's Triton path from here on
    with torch.no_grad():
        o_fla = fla_kda(x)
        o_ref = ref_kda(x)
        row["err_fla_vs_ref"] = rel_l2(o_fla, o_ref)
        row["fla_ms"] = median_ms(lambda: fla_kda(x), reps)
        if o is not None:
            row["err_flash_kda_vs_ref"] = rel_l2(o, o_ref)
            row["err_flash_kda_vs_fla"] = rel_l2(o, o_fla)
            row["flash_kda_ms"] = median_ms(lambda: flash_kda_fwd(x), reps)
    os.environ.pop("FLA_FLASH_KDA", None)
    return row


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        "# FlashKDA probe (issue 27, item 3)",
        "",
        f"`{' '.join(result['command'])}` on {env['device']} (sm {env['capability']}), torch {env['torch']} "
        f"(CUDA {env['cuda']}), flash_kda {env.get('flash_kda')}, fla {env.get('fla')}, git {env['git_sha']}",
        "",
        f"- wheel requirements: {env.get('flash_kda_requires')}",
        f"- extension: {env.get('extension') or env.get('extension_import_error')}",
        f"- links: {env.get('extension_links')}",
        f"- ABI: {env.get('built_from_source') or env.get('abi_refusal') or 'the wheel matches the installed torch'}",
        "",
        "| T | FlashKDA fwd | FLA dispatch ran | err FlashKDA vs ref | err FLA vs ref | FlashKDA ms | FLA Triton ms |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        disp = r["fla_dispatch"]["op"] if isinstance(r["fla_dispatch"], dict) else r["fla_dispatch"]
        lines.append(
            f"| {r['T']} | {r['flash_kda']} | {disp} | {r.get('err_flash_kda_vs_ref', '-')} | "
            f"{r.get('err_fla_vs_ref', '-')} | {r.get('flash_kda_ms', '-')} | {r.get('fla_ms', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--build", type=Path, help="FlashKDA's source (a directory or a .tar.xz): compile it here first")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("flashkda_probe needs a CUDA GPU")
    if args.build is not None and not args.build.exists():
        raise SystemExit(f"flashkda_probe: --build {args.build} does not exist")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    built = build_from_source(args.build, Path(tempfile.mkdtemp(prefix="flashkda-"))) if args.build else None
    if built:
        print(built, flush=True)
    result: dict[str, Any] = {
        "command": ["python", "benchmarks/flashkda_probe.py", *(argv or sys.argv[1:])],
        "environment": environment(built),
        "rows": [],
    }
    print(json.dumps(result["environment"], default=str), flush=True)  # the wheel's build facts, before any call
    for T in args.T:
        result["rows"].append(probe(T, args.H, args.reps))
        (out / "flashkda_probe.json").write_text(json.dumps(result, indent=1, default=str))
        (out / "flashkda_probe.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
