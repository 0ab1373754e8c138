"""runners/suites/issue26-modes-h200.yaml (issue 26's show: the engine's `none` vs `warmup_correct` on one GPU) expands
into the issue's grid: GDN and KDA, our Triton backend, B=1 T 8K..128K and 8 sequences of 8K, HV 16 and 32, lb -5
and -1, fwd and fwd+bwd, W=1, every point runnable. No point runs here."""

from __future__ import annotations

import itertools
from pathlib import Path

from runners.grid import expand
from runners.spec import load_spec

SUITE = Path(__file__).resolve().parents[2] / "runners" / "suites" / "issue26-modes-h200.yaml"


def test_the_modes_show_expands_into_the_issue_grid() -> None:
    rows = expand(load_spec(SUITE))
    got = {
        (
            r["op"],
            r["mode"],
            r["direction"],
            tuple(r["params"].get("lengths", [r["T"]])),
            r["params"].get("HV", r["H"]),
            r["lb"],
        )
        for r in rows
    }
    shapes = [(8192,), (32768,), (65536,), (131072,), (8192,) * 8]
    want = set(
        itertools.product(("gdn", "kda"), ("none", "warmup_correct"), ("fwd", "fwd+bwd"), shapes, (16, 32), (-1.0, -5.0))
    )
    assert got == want and len(rows) == len(want) == 160
    assert {(r["backend"], r["W"], r["H"], r["K"], r["V"], r["dtype"]) for r in rows} == {
        ("triton", 1, 16, 128, 128, "bfloat16")
    }
    assert all(r["status"] == "queued" for r in rows)
