"""The mode map and the "best of each library" figure on the H200 peers sweep's numbers (issue 27, sweep
peers2-mini-h200, GDN fwd+bwd at T=8K, B=1 H=16 K=V=128): rows in, figures out.

Scenarios: FLA as dispatched ran FlashQLA (its report's `fla_dispatch.op`), and both figures say so where they name
it (the mode map: "fla_dispatch · none → flash_qla"; the library's cell: "ran flash_qla"), in the cell, the hover and the CSV column `dispatched_to`; a row whose report
has no dispatch record names no implementation; a library within `TIE` of the fastest (0.4462 vs 0.4458 ms) says
"+0.09% (a tie)", not "1.00× slower", while a clear gap keeps "3.49× slower".
"""

from __future__ import annotations

from typing import Any

import pytest

from dashboards.figures import best_mode, libraries
from tests.dashboards.seed import point

# median ms of the stored H200 points (GDN fwd+bwd, T=8192): (backend, mode) -> ms
H200_8K_TRAIN = {("triton", "none"): 1.5558, ("triton", "warmup_correct"): 2.1874, ("fla_dispatch", "none"): 0.4462,
                 ("flash_qla", "none"): 1.9498, ("flash_qla", "warmup_correct"): 0.4458}  # fmt: skip
DISPATCH = {"fla_dispatch": {"op": "flash_qla", "calls": {"chunk_gated_delta_rule": "flash_qla"}}}


def h200_rows(*, dispatch_report: bool = True) -> list[dict[str, Any]]:
    rows = []
    for (backend, mode), ms in H200_8K_TRAIN.items():
        p = point(len(rows), mode=mode, W=1, T=8192, B=1, lb=-1.0, H=16, K=128, V=128, backend=backend)
        p["direction"] = p["params"]["direction"] = "fwd+bwd"
        if backend == "fla_dispatch":
            p["params"]["backend_options"] = {"bypass_hopper_guard": True}
        report = DISPATCH if backend == "fla_dispatch" and dispatch_report else {}
        rows.append({**p, "id": 100 + len(rows), "status": "done", "median_ms": ms, "p10_ms": ms * 0.99,
                     "p90_ms": ms * 1.01, "n": 60, "unreliable": None, "report": report})  # fmt: skip
    return rows


def drawn(fig: Any, kind: str) -> dict[str, tuple[str, str, Any]]:
    """{column: (cell text, hover, z)} of the single row of a figure's traces of `kind`."""
    out = {}
    for t in fig.data:
        if (t.meta or {}).get("kind") == kind:
            for j, x in enumerate(t.x):
                if t.text[0][j]:
                    out[x] = (t.text[0][j], t.customdata[0][j][0], t.z[0][j])
    return out


def test_libraries_name_what_fla_dispatched_and_call_a_tie_a_tie() -> None:
    rows = h200_rows()
    cells = drawn(libraries.figure(rows), "library")
    assert list(cells) == ["ours", "fla_dispatch", "flash_qla"]
    text, hover, z = cells["fla_dispatch"]
    # the label, longer than a cell's line, breaks before its mode
    assert text.startswith("<b>fla_dispatch+bypass_hopper_guard<br>· none</b><br>ran flash_qla<br>0.446 ms"), text
    assert "(fla_dispatch+bypass_hopper_guard → flash_qla)" in hover
    assert z == pytest.approx(0.4462 / 0.4458)
    assert text.endswith("+0.09% (a tie)") and "1.00× slower" not in text
    assert cells["flash_qla"][0].endswith("fastest") and "ran " not in cells["flash_qla"][0]
    assert cells["ours"][0].startswith("<b>triton · none</b>") and cells["ours"][0].endswith(f"{1.5558 / 0.4458:.2f}× slower")
    table = {c["library"]: c for c in libraries.frame(rows)}
    assert table["fla_dispatch"]["dispatched_to"] == "flash_qla"
    assert table["flash_qla"]["dispatched_to"] is None and table["ours"]["dispatched_to"] is None


def test_mode_map_winner_says_fla_dispatch_ran_flash_qla() -> None:
    (cell,) = best_mode.frame(h200_rows())
    assert cell["best"] == "fla_dispatch+bypass_hopper_guard · none → flash_qla"
    assert cell["faster_approx"] == "flash_qla · warmup_correct" and cell["runner_up"] == "triton · none"
    best = [t for t in best_mode.figure(h200_rows()).data if t.meta["kind"] == "best"]
    assert [t.text[0][0].split("<br>")[0] for t in best] == [
        "<b>fla_dispatch+bypass_hopper_guard · none → flash_qla</b> 1.00×"
    ]


def test_without_a_dispatch_record_no_implementation_is_named() -> None:
    rows = h200_rows(dispatch_report=False)
    assert drawn(libraries.figure(rows), "library")["fla_dispatch"][0].startswith(
        "<b>fla_dispatch+bypass_hopper_guard<br>· none</b><br>0.446 ms<br>"
    )
    assert best_mode.frame(rows)[0]["best"] == "fla_dispatch+bypass_hopper_guard · none"


def test_kernels_fla_dispatched_elsewhere_are_named() -> None:
    """FLA 0.6.0's KDA fwd+bwd as dispatched on the H200 (peers2 part 3): `op` triton, one backward kernel on TileLang
    (its report's `calls`); the cell and the mode map say both, not just "triton"."""
    rows = h200_rows()
    kda = {"fla_dispatch": {"op": "triton", "calls": {"chunk_kda_bwd_wy_dqkg_fused": "tilelang", "chunk_kda": "triton"}}}
    for r in rows:
        if r["backend"] == "fla_dispatch":
            r["report"] = kda
    cells = drawn(libraries.figure(rows), "library")
    assert "<br>ran triton (+1 tilelang kernel)<br>" in cells["fla_dispatch"][0]
    (cell,) = best_mode.frame(rows)
    assert cell["best"] == "fla_dispatch+bypass_hopper_guard · none → triton (+1 tilelang kernel)"


def test_a_library_not_measured_yet_is_pending_not_skipped() -> None:
    """The combined peers2 sweep: FLA's Triton path at GDN fwd+bwd has its `none` point queued and its
    `warmup_correct` point skipped (forward only); the cell says it is pending, not the skip reason of another mode."""
    rows = h200_rows()
    for mode, status in (("none", "queued"), ("warmup_correct", "skipped")):
        p = point(len(rows), mode=mode, W=1, T=8192, B=1, lb=-1.0, H=16, K=128, V=128, backend="fla")
        p["direction"] = p["params"]["direction"] = "fwd+bwd"
        rows.append(
            {
                **p,
                "id": 100 + len(rows),
                "status": status,
                "median_ms": None,
                "report": {},
                "reason": "FLA's intra-card CP runs only under torch.inference_mode" if status == "skipped" else None,
            }
        )
    cells = drawn(libraries.figure(rows), "pending")
    assert cells["fla"][0] == "<b>pending</b><br>1 queued: not measured yet", cells
    assert "fla" not in drawn(libraries.figure(rows), "skipped")
    rows[-2].update(status="skipped", reason=rows[-1]["reason"])  # nothing left to run: the reason shows
    assert "inference_mode" in drawn(libraries.figure(rows), "skipped")["fla"][0]
