"""`benchmarks/autotune_h200.py run`'s precompile never launches a config a miscompile rule rules out on the device,
even in a fresh process where no kernel module is imported yet (the rules expand over the registered kernel spaces:
on the H200, session 16, the precompile ran before the backward's kernels were registered, launched `chunk_state_fwd`
and `wy_bwd` configs their rules name, and crashed the device).

The precompile's task list is built in a fresh interpreter (the test process has every kernel registered already),
for an sm_90 device with Triton 3.6.0 (where the rules apply), on a tiny fwd+bwd case run by the Triton interpreter,
with a budget that draws every config of every space."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import argparse, json, sys
sys.path.insert(0, {root!r})
from tests.utils.scripts import load_script
mod = load_script("autotune_h200")
mod.SHAPES = [{{"B": 1, "T": 128, "H": 1, "K": 16, "V": 32, "dtype": "float32"}}]
args = argparse.Namespace(directions=["fwd+bwd"], ops=["gdn"], budget=1000, seed=0, workers=1, device="cpu")
tasks = mod._precompile_tasks(args, "9.0", "3.6.0")
from runners.tuner.miscompiles import known_bad
ruled = known_bad("9.0", "3.6.0")
print(json.dumps({{"items": [[k, c] for t in tasks for k, c in t[2]],
                  "ruled": {{k: [c.as_dict() for c in v] for k, v in ruled.items()}}}}))
"""


def test_precompile_skips_the_ruled_out_configs_in_a_fresh_process() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT))], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    items, ruled = out["items"], out["ruled"]
    # the backward's own kernels are drawn (fwd+bwd tunes those) and rules exist for some of them on sm_90
    drawn = {k for k, _ in items}
    assert {"chunk_state_fwd", "chunk_state_bwd"} <= drawn, drawn
    assert ruled.get("chunk_state_fwd") and ruled.get("chunk_state_bwd"), ruled
    # every other config of those kernels is drawn: the budget covers the whole space
    assert sum(1 for k, _ in items if k == "chunk_state_fwd") > 3
    launched_bad = [(k, c) for k, c in items if c in ruled.get(k, [])]
    assert launched_bad == [], launched_bad
