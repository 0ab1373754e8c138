"""Collectives and host syncs of one steady-state step, read from torch.profiler on gloo (W = 2 and 4).

Per step and rank: none 0; headwise exactly 2 all_to_all; all_gather 1 all_gather; true_cp 1 all_gather
(0 when no sequence crosses a part boundary: nothing to fold); ring one send/recv per crossed boundary
between ranks (W-1 pairs for one sequence over contiguous shards, 2W-2 for zigzag); warmup_correct 0.
No other c10d op. No host sync in the step (`aten::_local_scalar_dense`, runtime syncs, D2H copies). Counted by
the engine's own counter (`runners.profile.profile_step`), the one the worker stores.
"""

from __future__ import annotations

import pytest
import torch

import kernels.cp as cp
from runners.profile import profile_step
from tests.kernels.cp import cases
from tests.utils import make_inputs

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

SINGLE = (512,)
CROSSING = (100, 300, 112)
ALIGNED = (128, 128, 128, 128)  # every part boundary is a sequence boundary (W = 2 and 4)


def _check(results: list[dict], expected_each: dict | None = None) -> None:
    for r, res in enumerate(results):
        assert res["collectives"] == res["expected"], f"rank {r}: {res}"
        if expected_each is not None:
            assert res["collectives"] == expected_each, f"rank {r}: {res}"
        assert res["unclassified"] == [], f"rank {r}: {res}"
        assert res["host_syncs"] == 0, f"rank {r}: host syncs in the step: {res}"


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_headwise_all_gather(gangs: dict, W: int, layout: str, op: str) -> None:
    for lengths in (SINGLE, CROSSING):
        _check(gangs[W].run(cases.profile, {"op": op, "lengths": lengths, "layout": layout, "mode": "headwise"}), {"all_to_all": 2})
        _check(gangs[W].run(cases.profile, {"op": op, "lengths": lengths, "layout": layout, "mode": "all_gather"}), {"all_gather": 1})


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [2, 4])
def test_true_cp(gangs: dict, W: int, layout: str) -> None:
    _check(gangs[W].run(cases.profile, {"op": "kda", "lengths": SINGLE, "layout": layout, "mode": "true_cp"}), {"all_gather": 1})
    _check(gangs[W].run(cases.profile, {"op": "gdn", "lengths": CROSSING, "layout": layout, "mode": "true_cp",
                        "options": {"segment_len": 64}}), {"all_gather": 1})
    if layout == "contiguous":
        _check(gangs[W].run(cases.profile, {"op": "gdn", "lengths": ALIGNED, "layout": layout, "mode": "true_cp"}), {})


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [2, 4])
def test_ring(gangs: dict, W: int, layout: str) -> None:
    res = gangs[W].run(cases.profile, {"op": "gdn", "lengths": SINGLE, "layout": layout, "mode": "ring"})
    _check(res)
    pairs = W - 1 if layout == "contiguous" else 2 * W - 2
    assert sum(r["collectives"].get("send", 0) for r in res) == pairs
    assert sum(r["collectives"].get("recv", 0) for r in res) == pairs
    _check(gangs[W].run(cases.profile, {"op": "kda", "lengths": CROSSING, "layout": layout, "mode": "ring"}))
    if layout == "contiguous":
        _check(gangs[W].run(cases.profile, {"op": "gdn", "lengths": ALIGNED, "layout": layout, "mode": "ring"}), {})


@pytest.mark.parametrize(("mode", "options"), [("none", None), ("none", {"segment_len": 128}),
                                               ("warmup_correct", {"fallback": "none", "segments": 4}),
                                               ("warmup_correct", {"fallback": "exact", "segments": 4})])
def test_single_device_modes(mode: str, options: dict | None) -> None:
    q, k, v, g, beta, cu = make_inputs("kda", (300, 212), H=2, K=16, V=16, lb=-1.0)
    ctx = cp.build_context(cu, 1, 0)

    def step() -> object:
        return cp.forward(mode, "kda", q, k, v, g, beta, group=None, ctx=ctx, backend="torch", options=options)

    step()
    res = profile_step(step, device=torch.device("cpu")).as_dict()
    assert res["collectives"] == {} and res["unclassified"] == [], res
    assert res["host_syncs"] == 0, res
    assert cp.expected_collectives(mode, ctx) == {}
