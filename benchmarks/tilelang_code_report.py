"""Our TileLang kernels' default builds checked from the compiler alone (no GPU; a host with tilelang and nvcc): the
masked loads TileLang nests in a second branch, registers and spills (ptxas `-v`), and the branches in the SASS
(Triton's nvdisasm, where installed).

    python benchmarks/tilelang_code_report.py [--builds k2,k1,...] [--jobs 4] [--source-dir DIR] [--out FILE.md]

Why (issue 26, session 34): a masked load written `T.if_then_else(mask, f(x[i]), 0)`, where f is a cast or a product,
makes TileLang put its own bound check in a second `if` inside the mask's, with the load inside both. nvcc branches
there instead of predicating the load, so a thread's loads of a tile no longer issue together: K2 took 9.74 ms in
the 1x64K step on an H100 with its gate read that way, 8.55 without. The select around the load alone, f after it,
merges both conditions into one predicated load: `kernels.ops.gdn.tilelang_hopper.masked_load` writes it so. A build
with nested loads listed here wants that form.

Builds: the training step's (H = HV = 16, K = V = 128, bf16, dense), by name (`BUILDS`). --source-dir writes each
build's CUDA (a change can be shown to leave the rest of a kernel's code identical by diffing them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ptxas_report import ptxas_numbers, triton_tool  # noqa: E402
from benchmarks.tilelang_builds import Job, kernel_sources  # noqa: E402

SCALE = 128**-0.5
BUILDS: dict[str, Job] = {
    "k1": ("kernels.ops.kda.state_grads_hopper", (16, False, True)),
    "k2": ("kernels.ops.kda.bwd_products_hopper", (16, 16, SCALE, False, frozenset(), True, True, True)),
    "kda_ag": ("kernels.ops.kda.ag_hopper", (16, 16, SCALE, "bfloat16", "bfloat16", False, True)),
    "kda_ag_bound": ("kernels.ops.kda.ag_hopper", (16, 16, SCALE, "bfloat16", "bfloat16", True, True)),
    "kda_walk": ("kernels.ops.gdn.fwd_walk", (16, 16, 128, SCALE, "bfloat16", "vector")),
    "gdn_walk": ("kernels.ops.gdn.fwd_walk", (16, 16, 128, SCALE, "bfloat16", "scalar")),
    "gdn_reverse": ("kernels.ops.gdn.reverse_bwd", (16, 16, 128, 128, 64, SCALE, "bfloat16", "float32", "bfloat16")),
    "gdn_ag": ("kernels.ops.gdn.ag_hopper", (16, 16, "bfloat16", "float32", "bfloat16", 3)),
}

_DECL = re.compile(r"\s*[\w:]+ (condval_\d+);\s*$")
_IF = re.compile(r"\s*if \(")
# a value loaded from a global buffer (by name: TileLang reads shared memory through casts of its pool), plain or
# vectorised (`*(uint4*)(x + ..)`)
_LOAD = re.compile(r"(condval_\d+) = (?:\*\([\w:]+\*\)\()?([A-Za-z_]\w*)\s*[\[+]")


def nested_loads(source: str) -> list[tuple[int, str]]:
    """(line, buffer) of each nested masked load in generated CUDA: a select's value declared and its `if`, then
    directly inside it a second value declared and a second `if` whose body loads a buffer into it."""
    lines = source.splitlines()
    out = []
    for i in range(len(lines) - 4):
        if not (_DECL.match(lines[i]) and _IF.match(lines[i + 1])):
            continue
        inner = _DECL.match(lines[i + 2])
        if inner is None or not _IF.match(lines[i + 3]):
            continue
        load = _LOAD.search(lines[i + 4])
        if load is not None and load.group(1) == inner.group(1):
            out.append((i + 5, load.group(2)))
    return out


def _nvcc() -> str | None:
    """nvcc from CUDA_HOME (or /usr/local/cuda), or on PATH; None where none is found."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(home) if home.exists() else shutil.which("nvcc")


def _nvdisasm() -> str | None:
    """Triton's nvdisasm, or one on PATH; None where none is found."""
    try:
        path = triton_tool("nvdisasm")
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def compile_numbers(source: str) -> dict[str, Any]:
    """{"regs", "spill_stores", "spill_loads", "branches"} of one generated source, compiled for sm_90a as TileLang
    compiles it (fast math, its headers); branches: BRA instructions in the SASS (None without nvdisasm)."""
    import tilelang

    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("tilelang_code_report: no nvcc (set CUDA_HOME)")
    root = Path(tilelang.__file__).parent
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        src.write_text(source)
        cmd = [nvcc, "-arch=sm_90a", "-std=c++20", "--use_fast_math", f"-I{root / 'src'}",
               f"-I{root / '3rdparty' / 'cutlass' / 'include'}", "-cubin", "-Xptxas", "-v", str(src), "-o", str(cubin)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        text = done.stdout + done.stderr
        if done.returncode != 0:
            raise RuntimeError(text.strip().splitlines()[-1] if text.strip() else "nvcc failed")
        out: dict[str, Any] = dict(ptxas_numbers(text))
        dis = _nvdisasm()
        sass = subprocess.run([dis, "-c", str(cubin)], capture_output=True, text=True, timeout=300) if dis else None
        out["branches"] = sass.stdout.count("BRA") if sass is not None and sass.returncode == 0 else None
    return out


def header(argv: list[str]) -> str:
    """The report's title, command and versions (tilelang, nvcc, git)."""
    import tilelang

    nvcc = _nvcc()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines() if nvcc else []
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.strip()  # fmt: skip
    return (f"# TileLang default builds from the compiler (`benchmarks/tilelang_code_report.py`)\n\n"
            f"command: `python benchmarks/tilelang_code_report.py {' '.join(argv)}`; tilelang {tilelang.__version__}, "
            f"nvcc {version[-1] if version else '?'}, sm_90a, git {sha or '?'}; no GPU\n\n")  # fmt: skip


def to_markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| build | module | nested masked loads | registers | spills (st / ld B) | SASS branches |\n"
            "|---|---|---:|---:|---:|---:|")  # fmt: skip
    body = []
    for r in rows:
        names = ", ".join(sorted({b for _, b in r["nested"]}))
        body.append(f"| {r['build']} | `{r['module']}` | {len(r['nested'])}{f' ({names})' if names else ''} | "
                    f"{r['regs']} | {r['spill_stores']} / {r['spill_loads']} | {r['branches']} |")  # fmt: skip
    return "\n".join([head, *body]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", default=",".join(BUILDS), help=f"comma-separated, of: {', '.join(BUILDS)}")
    ap.add_argument("--jobs", type=int, default=4, help="builds side by side (each 15-90 s of one thread)")
    ap.add_argument("--source-dir", type=Path, default=None, help="write each build's CUDA here (<build>.cu)")
    ap.add_argument("--out", type=Path, default=None, help="the markdown table (else printed)")
    a = ap.parse_args(argv)
    names = [n for n in a.builds.split(",") if n]
    unknown = sorted(set(names) - set(BUILDS))
    if unknown:
        ap.error(f"--builds: unknown {unknown} (known: {', '.join(BUILDS)})")
    try:
        import tilelang  # noqa: F401
    except ImportError:
        ap.error("tilelang is not importable here: this report needs it (and nvcc), not a GPU")
    sources = kernel_sources([BUILDS[n] for n in names], a.jobs)
    rows = []
    for name, source in zip(names, sources, strict=True):
        if a.source_dir is not None:
            a.source_dir.mkdir(parents=True, exist_ok=True)
            (a.source_dir / f"{name}.cu").write_text(source)
        rows.append({"build": name, "module": BUILDS[name][0], "nested": nested_loads(source), **compile_numbers(source)})
        print(f"{name}: {len(rows[-1]['nested'])} nested masked loads, {rows[-1]['regs']} registers", flush=True)
    table = header(argv if argv is not None else sys.argv[1:]) + to_markdown(rows)
    if a.out is not None:
        a.out.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
