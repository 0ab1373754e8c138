"""runners/suites/multihost-x2.yaml (issue 29's GPU check of the multi-host worker): it expands into every mode at
W=1 and W=2 (none at W=1 only: it runs on one device), fwd and fwd+bwd, T 64K and 256K, all queued. No point runs here.
"""

from __future__ import annotations

from pathlib import Path

from runners.grid import expand
from runners.spec import load_spec

SUITE = Path(__file__).resolve().parents[2] / "runners" / "suites" / "multihost-x2.yaml"


def test_the_check_expands_into_every_mode_at_W_1_and_2() -> None:
    rows = expand(load_spec(SUITE))
    queued = {(r["mode"], r["W"], r["direction"], r["T"]) for r in rows if r["status"] == "queued"}
    modes = ("all_gather", "ring", "true_cp", "tail_exchange")
    assert queued == {
        (mode, W, d, T)
        for mode, W in [("none", 1), *((m, W) for m in modes for W in (1, 2))]
        for d in ("fwd", "fwd+bwd")
        for T in (65536, 262144)
    }
