"""`benchmarks/ptxas_report.py`: a backward kernel compiled for sm_90 on a machine without a GPU, and ptxas's
register and spill counts read back. Two configs of `wy_inverse` (GDN) that the compiler treats differently: the
default fits in registers, a 64-wide column block at one warp spills (measured with Triton 3.6's ptxas: 0 and
72 bytes per thread with the pointers aligned as a launch has them, ~350 without). The script runs in its own process: it needs the kernels as real JIT functions, and this
test session imports them under the interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ptxas_report.py"
_TRITON = importlib.util.find_spec("triton")
PTXAS = _TRITON is not None and (Path(_TRITON.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()
FITS = {"BK": 32, "num_warps": 1, "num_stages": 2}
SPILLS = {"BK": 64, "num_warps": 1, "num_stages": 2}


@pytest.mark.skipif(not PTXAS, reason="Triton's bundled ptxas is not installed here")
def test_registers_and_spills_of_two_configs(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--ops", "gdn", "--kernels", "wy_inverse", "--config",
                           json.dumps(FITS), "--config", json.dumps(SPILLS), "--out", str(out)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| wy_inverse | gdn")]
    assert len(rows) == 2
    (fits_regs, fits_st, fits_ld, fits_sh), (_, sp_st, sp_ld, sp_sh) = ([int(c) for c in r[3:7]] for r in rows)
    assert 32 <= fits_regs <= 255 and fits_st == fits_ld == 0
    assert sp_st > 0 and sp_ld > 0
    assert sp_sh > fits_sh > 0  # the wider column block stages more of k in shared memory
    assert "*" in rows[0][2] and "*" not in rows[1][2]  # the default is marked


def test_refuses_the_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--ops", "gdn"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "unset TRITON_INTERPRET" in proc.stderr


def test_programs_per_sm() -> None:
    """sm_90's occupancy rules: registers per warp in whole 256s, 64 warps, 228 KB shared with 1 KB per program."""
    per_sm = load_script("ptxas_report").programs_per_sm
    assert per_sm(255, 98304, 8) == 1  # 255 registers x 256 threads fill the 64K
    assert per_sm(128, 81920, 8) == 2
    assert per_sm(168, 45056, 4) == 3
    assert per_sm(255, 45056, 4) == 2
    assert per_sm(64, 120 * 1024, 4) == 1  # shared memory decides
    assert per_sm(179, 4096, 1) == 11  # 179 -> 184 registers a thread
    assert per_sm(None, 0, 4) is None
