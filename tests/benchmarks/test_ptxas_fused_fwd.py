"""`benchmarks/ptxas_fused_fwd.py`: the fused state+output pass compiled for sm_90 without a GPU, per gate form, and
ptxas's register and spill counts read back. KDA's TRANSITION launch at 4 warps: the per-key gate formed in the pass
(inline, GATE_VECTOR) spills several times what the gated form (the Ag pass's `gated` variant, PRE_GATED) does, and the
gated form with the tma variant spills nothing (Triton 3.6's ptxas, pointers 16-byte aligned as a launch specializes
them since session 20: 532, 0 and 0 bytes per thread; unaligned 886, 244 and 0). Its own
process: the kernel must be a real JIT function, and this test session imports it under the interpreter."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ptxas_fused_fwd.py"
_TRITON = importlib.util.find_spec("triton")
PTXAS = _TRITON is not None and (Path(_TRITON.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def _run(tmp_path: Path, *args: str) -> list[list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines() if line.startswith("| kda")]


@pytest.mark.skipif(not PTXAS, reason="Triton's bundled ptxas is not installed here")
def test_the_gated_form_spills_less(tmp_path: Path) -> None:
    rows = _run(tmp_path, "--forms", "kda", "kda_gated", "--modes", "transition", "--variants", "default", "tma")
    spill = {(r[0], r[2]): int(re.match(r"(\d+) /", r[5]).group(1)) for r in rows}  # type: ignore[union-attr]
    assert set(spill) == {(f, v) for f in ("kda", "kda_gated") for v in ("default", "tma")}, rows
    assert spill["kda", "default"] > 2 * spill["kda_gated", "default"], spill
    assert spill["kda_gated", "tma"] < spill["kda", "tma"] and spill["kda_gated", "tma"] <= 64, spill


def test_refuses_the_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "unset TRITON_INTERPRET" in proc.stderr
