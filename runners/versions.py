"""Versions of the software a result was measured with (torch, triton, cpbench), read from this process."""

from __future__ import annotations

import importlib.metadata

__all__ = ["cpbench_version", "software_versions"]


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
