"""What the benchmarks share: the file stem of their results and the environment block every result carries."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch

from runners.versions import driver_version, git_sha, software_versions

__all__ = ["environment", "result_stem"]


def result_stem(prefix: str, name: str | None, device_name: Any) -> str:
    """File stem of a benchmark's results: `name` if given, else <prefix>_h200 on an H200, else <prefix>_<device slug>
    (so a CPU or dry run never overwrites the H200 table)."""
    if name:
        return str(name)
    device = str(device_name or "cpu")
    if "H200" in device:
        return f"{prefix}_h200"
    return f"{prefix}_" + ("".join(ch if ch.isalnum() else "_" for ch in device.lower()).strip("_")[:40] or "cpu")


def environment(device: torch.device, *, command: str, cpu_label: str, env_vars: tuple[str, ...],
                sha: str | None = None) -> dict[str, Any]:
    """Versions (python, torch, triton, fla), host, UTC date, git sha (`sha` overrides), the command, the named
    environment variables under "env"; on CUDA the device name, SM count, GPU count, memory, CUDA, NCCL and driver."""
    versions = software_versions()
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": versions["torch"], "triton": versions["triton"],
        "host": platform.node(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": sha or git_sha() or "unknown", "git_note": os.environ.get("CPBENCH_GIT_NOTE"), "command": command,
        "env": {k: os.environ.get(k) for k in env_vars},
    }
    try:
        import fla

        info["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        info["fla"] = None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device=p.name, sms=p.multi_processor_count, gpus=torch.cuda.device_count(),
                    memory_GiB=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())), driver=driver_version())
    else:
        info["device"] = cpu_label
    return info
