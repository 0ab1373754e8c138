"""`./dev`'s venv is one per checkout (issue 28, item 6): its key includes the checkout's path, since the venv holds
an editable install of the checkout that made it.

Scenario: two copies of the same checkout files (dev, requirements, pyproject) in two folders: `./dev venv-path`
gives each its own venv under TMPDIR, the same one on every call from the same folder; `VENV` still overrides it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ("dev", "requirements-ci.txt", "requirements-gpu.txt", "pyproject.toml")


def _venv_path(checkout: Path, tmp: Path, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "VENV"} | {"CPBENCH_INSTALL": "cpu", "TMPDIR": str(tmp), **env}
    out = subprocess.run(
        ["bash", str(checkout / "dev"), "venv-path"], env=full, capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def test_each_checkout_gets_its_own_venv(tmp_path: Path) -> None:
    clones = [tmp_path / "clone-a", tmp_path / "clone-b"]
    for clone in clones:
        clone.mkdir()
        for name in FILES:
            shutil.copy2(REPO / name, clone / name)
    a, b = (_venv_path(c, tmp_path) for c in clones)
    assert a != b, a
    assert a.startswith(f"{tmp_path}/cpbench-venv-") and b.startswith(f"{tmp_path}/cpbench-venv-")
    assert _venv_path(clones[0], tmp_path) == a  # reused while nothing changes
    assert _venv_path(clones[0], tmp_path, VENV="/opt/mine") == "/opt/mine"
