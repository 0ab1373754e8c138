"""A cold first call's compiles, serial vs parallel (`kernels.parallel_compile`), on a host without a GPU.

    python benchmarks/compile_parallel.py [--ops gdn kda] [--modes serial parallel] [--T 8192] [--H 16] [--D 128]
        [--again-T 4096] [--no-launchers] [--json PATH]

Each (op, mode) runs in a fresh process with a fresh TRITON_CACHE_DIR: `kernels.chunk_gdn` / `kernels.chunk_kda`
fwd+bwd (backend triton) on CPU tensors at the first-call benchmark's shape (`benchmarks/compile_times.call`), mode
serial with CPBENCH_PARALLEL_COMPILE=0, then one more call at T=--again-T (a warm call: nothing compiles). The child
makes `CompileOnlyDriver` Triton's active driver: the target is sm_90 (the H200), Triton's own launch path binds,
compiles (ptxas included) and caches every kernel as on the device, and "loads" the cubin and "launches" by recording
them; the outputs stay uninitialised (no launch sequence reads device data). Its launcher class compiles Triton's real
C launcher source with gcc (`-c`: no libcuda to link here), the work a first launch on the device does per signature.
Printed per (op, mode): the wall and CPU seconds of the first call, the compiles done ahead (in the dry run) and at a
launch, and the launches; `--json` writes them with each launch's kernel and compile key and each compile's PTX
sha256 (the tests compare those).
A loaded host inflates wall seconds; the ratio serial/parallel is the figure, bounded by the cores (state them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_SHARED_SM90 = 232448  # bytes of shared memory per block on sm_90


class CompileOnlyDriver:
    """A Triton driver for sm_90 that compiles through Triton's own launch path and launches nothing (module doc)."""

    def __init__(self, launchers: bool) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.driver import ty_to_cpp

        self.target = GPUTarget("cuda", 90, 32)
        self.ty_to_cpp = ty_to_cpp
        self.built: set[str] = set()  # the launcher sources compiled
        self.lock = threading.Lock()
        self.launches: list[tuple[str, str]] = []  # (kernel name, Triton's cache key of its compile) per launch
        self.utils = self
        driver = self

        class Launcher:
            def __init__(self, src: Any, metadata: Any) -> None:
                self.kernel = (src.fn.__name__, metadata.hash)
                if launchers:
                    driver.build_launcher(src, metadata)

            def __call__(self, *args: Any) -> None:
                driver.launches.append(self.kernel)

        self.launcher_cls = Launcher

    # the parts of Triton's DriverBase / CudaDriver that JITFunction.run and CompiledKernel use
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def map_python_to_cpp_type(self, ty: str) -> str:
        return str(self.ty_to_cpp(ty))

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": MAX_SHARED_SM90}

    def load_binary(self, name: str, cubin: bytes, shared: int, device: int) -> tuple[None, None, int, int, int]:
        return None, None, 0, 0, 1024

    def build_launcher(self, src: Any, metadata: Any) -> None:
        """gcc -c of Triton's C launcher for this signature (CudaLauncher's source and flags, without linking)."""
        from triton.backends.nvidia.driver import include_dirs, make_launcher

        arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x  # noqa: E731 (CudaLauncher's)
        constants = {arg_idx(i): v for i, v in getattr(src, "constants", {}).items()}
        code = make_launcher(constants, dict(src.signature), getattr(metadata, "tensordesc_meta", None))
        with self.lock:  # built once per source, as Triton caches its launchers by source (compile_module_from_src)
            if code in self.built:
                return
            self.built.add(code)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "launcher.c"
            path.write_text(code)
            incs = [f"-I{d}" for d in [*include_dirs, sysconfig.get_paths()["include"]]]
            subprocess.run(["gcc", "-O3", "-fPIC", "-c", str(path), "-o", str(Path(tmp) / "l.o"), *incs], check=True)


def child(op: str, T: int, H: int, D: int, again_T: int, launchers: bool) -> dict[str, Any]:
    """One cold first call of `op` in this process (serial or parallel by CPBENCH_PARALLEL_COMPILE), then a warm one."""
    from triton import knobs
    from triton.runtime.driver import driver

    from benchmarks.compile_times import _cpu_seconds, call

    fake = CompileOnlyDriver(launchers)
    driver.set_active(fake)  # type: ignore[arg-type]
    compiles: list[tuple[str, bool]] = []

    def compiled(*, fn: Any, is_manual_warmup: bool, **_: Any) -> None:
        compiles.append((fn.name.rsplit(".", 1)[-1], is_manual_warmup))

    knobs.runtime.jit_post_compile_hook = compiled
    t0, c0 = time.perf_counter(), _cpu_seconds()
    call(op, T, H, D)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    first = {"compiles": list(compiles), "launches": list(fake.launches)}
    compiles.clear()
    fake.launches.clear()
    call(op, again_T, H, D)
    return {
        "op": op,
        "wall_s": wall,
        "cpu_s": cpu,
        "first": first,
        "again": {"compiles": compiles, "launches": fake.launches},
        "ptx": ptx_by_key(),
        "cores": len(os.sched_getaffinity(0)),
    }


def ptx_by_key() -> dict[str, str]:
    """Triton's cache key of every kernel compiled into this process's TRITON_CACHE_DIR -> sha256 of its PTX (what
    ptxas gets; its cubin is not compared: ptxas 12.x may swap spill slots between two runs of the same PTX)."""
    out = {}
    for meta in Path(os.environ["TRITON_CACHE_DIR"]).glob("*/*.json"):
        data = json.loads(meta.read_text())
        ptx = meta.with_suffix(".ptx")
        if isinstance(data, dict) and "hash" in data and ptx.exists():
            out[data["hash"]] = hashlib.sha256(ptx.read_bytes()).hexdigest()
    return out


def run_child(op: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        TRITON_CACHE_DIR=tempfile.mkdtemp(prefix=f"compile_parallel_{op}_{mode}_"),
        CPBENCH_PARALLEL_COMPILE="1" if mode == "parallel" else "0",
        CUDA_VISIBLE_DEVICES="",
    )
    cmd = [
        sys.executable,
        __file__,
        "--child",
        op,
        "--T",
        str(args.T),
        "--H",
        str(args.H),
        "--D",
        str(args.D),
        "--again-T",
        str(args.again_T),
        *(["--no-launchers"] if args.no_launchers else []),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"compile_parallel: {op} {mode} failed:\n{out.stderr[-4000:]}")
    return {"mode": mode, **json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="+", default=["gdn", "kda"], choices=["gdn", "kda"])
    ap.add_argument("--modes", nargs="+", default=["serial", "parallel"], choices=["serial", "parallel"])
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--again-T", type=int, default=4096, help="T of the warm call after the first")
    ap.add_argument("--no-launchers", action="store_true", help="skip the gcc builds of Triton's C launchers")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.T, args.H, args.D, args.again_T, not args.no_launchers)))
        return 0
    rows = []
    for op in args.ops:
        for mode in args.modes:
            r = run_child(op, mode, args)
            rows.append(r)
            ahead = sum(1 for _, w in r["first"]["compiles"] if w)
            print(
                f"{op} {mode:8s}: first call {r['wall_s']:5.1f} s wall, {r['cpu_s']:5.1f} CPU s; compiles ahead "
                f"{ahead}, at a launch {len(r['first']['compiles']) - ahead}; {len(r['first']['launches'])} "
                f"launches; warm call at T={args.again_T}: {len(r['again']['compiles'])} compiles "
                f"({r['cores']} cores)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
