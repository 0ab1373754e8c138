"""What a measurement was made with, beyond the Python packages: the GPU driver and the code's git sha.

One reader for the benchmarks (`kernels.bench`, `kernels.cp.bench`, `benchmarks/`) and the engine's worker
(`runners.worker`), so every stored or written result names its driver and code the same way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["driver_version", "git_sha"]

_REPO = Path(__file__).resolve().parent.parent


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True, cwd=_REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_sha() -> str | None:
    """CPBENCH_GIT_SHA when set (a copied tree has no .git), else HEAD of the checkout, `-dirty` if modified."""
    if os.environ.get("CPBENCH_GIT_SHA", "").strip():
        return os.environ["CPBENCH_GIT_SHA"].strip()
    sha = _run(["git", "rev-parse", "HEAD"])
    if sha is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return f"{sha}-dirty" if dirty else sha


def driver_version() -> str | None:
    """The NVIDIA driver version (NVML, else the first line of nvidia-smi: it prints one per GPU), None without one."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # noqa: BLE001 - any failure means "ask nvidia-smi"
        out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        return out.splitlines()[0].strip() if out else None
