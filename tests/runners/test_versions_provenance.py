"""`runners.versions`: the git sha and driver every result records (benchmarks and the worker share it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runners.versions import driver_version, git_sha

ROOT = Path(__file__).resolve().parents[2]


def test_git_sha_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPBENCH_GIT_SHA", " abc123 ")
    assert git_sha() == "abc123"


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="not a git checkout")
def test_git_sha_reads_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CPBENCH_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert git_sha() in (head, f"{head}-dirty")


def test_driver_version_without_a_gpu_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No NVML and no nvidia-smi on PATH: None, not an exception."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert driver_version() is None


def test_driver_version_takes_the_first_gpu_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvidia-smi prints one line per GPU: the version is the first, not both joined."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 580.159.04\necho 580.159.04\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert driver_version() == "580.159.04"
