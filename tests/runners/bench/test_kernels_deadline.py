"""`cpbench bench kernels` cut by its deadline (the real script, `--dry-run`: the Triton interpreter at a tiny shape):
the first row runs, the next is cut, and the report is written with the measured row, the cut one and FlashQLA's
reason. `--no-check` runs no accuracy check at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners.bench import kernels


def test_deadline_cut_writes_a_partial_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLA_DISABLE_BACKEND_DISPATCH", "1")
    rc = kernels.main(
        [
            "--dry-run",
            "--no-check",
            "--ops",
            "gdn",
            "--lb=-1,-5",
            "--deadline",
            "0.001",
            "--name",
            "cut",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    res = json.loads((tmp_path / "cut.json").read_text())
    assert [(r["op"], r["lb"]) for r in res["rows"]] == [("gdn", -1.0)]
    assert res["rows"][0]["ms"] > 0 and res["rows"][0]["flash_qla_reason"]
    assert [c["case"] for c in res["cut"]] == ["1x128 HV=2 lb=-5"]
    assert "correctness" not in res and "accuracy" not in res  # --no-check: no check at all
    assert res["rows"][0].get("rel_l2_vs_fla") is None
    md = (tmp_path / "cut.md").read_text()
    assert "| gdn | 1 | 128 | 2 | -1 |" in md and "- gdn 1x128 HV=2 lb=-5: cut by the deadline" in md
