"""What a result was measured with: the software versions (torch, triton, cpbench) of this process, the versions
of the peer packages a sweep can measure (FLA, FlashQLA, TileLang, FlashKDA), the GPU driver and the code's git sha.

One reader for the worker (`runners.worker`), the benchmarks (`runners.bench`) and `benchmarks/`, so every stored
or written result names its software, driver and code the same way.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path

__all__ = ["PEER_DISTRIBUTIONS", "cpbench_version", "driver_version", "git_sha", "peer_versions", "software_versions"]

# fact name -> the distributions that install it, first found wins (read from their metadata, never imported)
PEER_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "fla": ("fla-core", "flash-linear-attention"),
    "flash_qla": ("flash-qla",),
    "tilelang": ("tilelang",),
    "flash_kda": ("tokenspeed-flashkda", "flash-kda", "flash_kda"),
}


def cpbench_version() -> str:
    """The installed cpbench version, or "0+source" when running from a checkout that is not installed."""
    try:
        return importlib.metadata.version("cpbench")
    except importlib.metadata.PackageNotFoundError:
        return "0+source"


def software_versions() -> dict[str, str | None]:
    """{"torch", "triton" (None when it is not installed), "cpbench"} of this process."""
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version, "cpbench": cpbench_version()}


def peer_versions() -> dict[str, str | None]:
    """{"fla", "flash_qla", "tilelang", "flash_kda"}: the installed version of each (None when absent), so a result
    names the packages that FLA's dispatch and the peers ran; read from package metadata without importing them."""
    out: dict[str, str | None] = {}
    for fact, dists in PEER_DISTRIBUTIONS.items():
        out[fact] = None
        for dist in dists:
            try:
                out[fact] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


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
