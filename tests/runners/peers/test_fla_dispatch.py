"""`backend: fla_dispatch` as a point on a CPU: FLA's real chunk op with its dispatch on, gated like any point, its
report naming what FLA's dispatch ran (a backend registered in FLA's registry takes it here: `cpu_stand_in`); `backend:
fla` says it measured FLA's Triton path and what pinned it; the run-or-skip table of `fla_dispatch`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runners.execute import run_point_job
from runners.gang import RankContext
from runners.grid import skip_reason
from runners.peers.fla import FLA
from runners.point import PointJob, PointSpec
from tests.runners.peers.conftest import OPTIONS, STAND_IN, peer_point


def _point(**kw: Any) -> PointSpec:
    return peer_point("fla_dispatch", **{**{"B": 2, "T": 24, "K": 16, "V": 16, "dtype": "float32"}, **kw})


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_point_reports_what_fla_dispatch_ran(fla_stand_in: Any, direction: str) -> None:
    rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
    res = run_point_job(rc, PointJob(_point(direction=direction), OPTIONS, trace_path=None))
    assert res.ok, res.error
    assert res.gate["err_vs_reference"] < 1e-5, res.gate
    assert res.report["fla_dispatch"] == {"op": STAND_IN, "calls": {"chunk_gated_delta_rule": STAND_IN}}
    assert res.report["fla_config_cache"] is None  # FLA_CACHE_MODE unset: FLA autotunes on its own
    assert "fwd" in res.report["first_call_s"]


def test_fla_says_it_measured_its_triton_path() -> None:
    import fla.ops.gated_delta_rule  # noqa: F401

    assert FLA.point_report(peer_point("fla"))["fla_path"].startswith("triton (")


@pytest.mark.parametrize(
    ("mode", "direction", "K", "want"),
    [
        ("none", "fwd", 128, None),
        ("none", "fwd+bwd", 128, None),
        ("none", "fwd", 512, "K <= 256"),
        ("warmup_correct", "fwd", 128, "use `backend: flash_qla` for FlashQLA's modes"),
        ("true_cp", "fwd", 128, "FLA's CP schemes are `backend: fla`'s"),
    ],
)
def test_fla_dispatch_table(mode: str, direction: str, K: int, want: str | None) -> None:
    W = 2 if mode == "true_cp" else 1
    got = skip_reason(_point(mode=mode, direction=direction, K=K, V=K, W=W, B=1, T=256))
    assert (got is None) if want is None else (got is not None and want in got), got
