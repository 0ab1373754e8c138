"""The GPU install (`./dev gpu-requirements`) resolves for a Linux x86_64 GPU host, checked without a GPU.

pip resolves from the package index's wheel metadata only (`pip install --dry-run --report`, `--platform
manylinux_2_28_x86_64 --only-binary :all:`, nothing downloaded but metadata): torch's wheel for that platform names
the Triton it needs; the GPU set must carry no Triton pin that disagrees with it; every package of the set, and that
Triton, exists as a wheel for the platform; and that Triton resolves together with the rest of the set's pins that
touch it (numpy). This is what caught the old `triton==3.6.0` beside `torch==2.13.0`, whose wheel declares 3.7.1.

Needs the package index (network): without it the test fails and says so; it is not skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
            "--only-binary", ":all:"]
NETWORK_HINTS = ("Could not fetch URL", "Max retries exceeded", "NewConnectionError", "Temporary failure in name resolution",
                 "Network is unreachable", "ConnectTimeoutError", "ProxyError")


def _pip_report(tmp_path: Path, name: str, args: list[str]) -> list[dict[str, Any]]:
    """`pip install --dry-run --report` (isolated from this machine's pip configuration) for the GPU platform."""
    report = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--target", str(tmp_path / f"{name}-target"), "--report", str(report), *PLATFORM, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        if any(h in proc.stderr for h in NETWORK_HINTS):
            pytest.fail("cannot reach the package index: this test resolves the GPU install from PyPI's wheel metadata "
                        f"and needs network access ({proc.stderr.strip().splitlines()[-1]})")
        pytest.fail(f"the GPU install does not resolve ({' '.join(args)}):\n{proc.stderr.strip()}")
    return json.loads(report.read_text())["install"]


def _name(line: str) -> str:
    return re.split(r"[\s=<>!~;\[]", line.strip(), maxsplit=1)[0].lower()


def test_gpu_install_resolves(tmp_path: Path) -> None:
    out = subprocess.run(["bash", str(REPO / "dev"), "gpu-requirements"], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    names = [_name(ln) for ln in lines]
    assert names.count("torch") == 1 and "pytest" not in names and "ruff" not in names, names

    # torch's wheel for a GPU host, metadata only: the Triton it declares
    torch_line = next(ln for ln in lines if _name(ln) == "torch")
    (torch,) = _pip_report(tmp_path, "torch", ["--no-deps", torch_line])
    declared = [d for d in torch["metadata"].get("requires_dist", []) if _name(d) == "triton"]
    assert len(declared) == 1, torch["metadata"].get("requires_dist")
    triton_pin = declared[0].split(";")[0].strip()  # e.g. triton==3.7.1
    ours = [ln for ln in lines if _name(ln) == "triton"]
    assert all(ln.split(";")[0].replace(" ", "") == triton_pin.replace(" ", "") for ln in ours), (ours, triton_pin)

    # every package of the set (torch's Triton instead of torch) has a wheel for the platform
    rest = tmp_path / "rest.txt"
    rest.write_text("\n".join([ln for ln in lines if _name(ln) not in ("torch", "triton")] + [triton_pin]) + "\n")
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in _pip_report(tmp_path, "rest", ["--no-deps", "-r", str(rest)])}
    assert set(got) == {n for n in names if n not in ("torch",)} | {"triton"}, got
    # that Triton with the set's other pins on what it touches, dependencies resolved
    numpy = [ln for ln in lines if _name(ln) == "numpy"]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in _pip_report(tmp_path, "triton", [triton_pin, *numpy])}
    assert resolved["triton"] == triton_pin.split("==")[1]
