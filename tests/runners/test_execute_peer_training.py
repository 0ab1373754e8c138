"""A peer backend's forward+backward point (`direction: fwd+bwd`): the engine times forward + `o.backward(do)` of
the peer's differentiable forward inside its `step_context`, and gates every input gradient against our `none`
and the fp32 reference, like ours. The example plugin `tests.plugins.torch_peer` (a per-token torch recurrence,
exact in fp32) runs in process on the CPU; a wrong gradient injected into it fails the gate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runners.execute import run_point_job
from runners.gang import RankContext
from runners.point import PointJob, PointSpec
from runners.results import PointResult

PLUGIN = "tests.plugins.torch_peer:PEER"
OPTIONS = {"timing": {"min_samples": 2, "max_samples": 2, "min_time_s": 0.0, "timeout_s": 1.0, "warmup_s": 0.0,
                      "flush_l2": False}, "check": {"reference_tokens": 48}, "profile": False}


def _params(op: str) -> PointSpec:
    return PointSpec.from_json({"op": op, "mode": "none", "backend": "torchpeer", "backend_ref": PLUGIN, "B": 2, "T": 24, "H": 2, "K": 8,
            "V": 8, "lb": -1.0, "W": 1, "layout": "contiguous", "direction": "fwd+bwd", "dtype": "float32", "seed": 0})


def _run(op: str) -> PointResult:
    rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
    return run_point_job(rc, PointJob(_params(op), OPTIONS, trace_path=None))


@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_peer_fwd_bwd_point_is_timed_and_gated(op: str, plugin_modules: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_modules("tests.plugins.")
    from tests.plugins import torch_peer

    entered: list[str] = []

    def context(options: Any) -> Any:  # the step context wraps every step, the backward included
        import contextlib

        @contextlib.contextmanager
        def cm() -> Any:
            entered.append("in")
            yield
        return cm()

    monkeypatch.setattr(torch_peer.TorchPeer, "step_context", lambda self, options: context(options), raising=False)
    ok = _run(op)
    assert ok.ok and ok.gate is not None and ok.timing is not None, ok
    # B=2 sequences, the dense layout reshaped: every gradient within fp32 rounding of ours and of the reference
    assert ok.gate["err_vs_none"] < 1e-5 and ok.gate["err_vs_reference"] < 1e-5, ok.gate
    assert len(ok.timing["samples_ms"]) == 2 and len(entered) >= 2  # every timed step, and the gate's


def test_peer_wrong_gradient_fails_the_gate(plugin_modules: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin_modules("tests.plugins.")
    from tests.plugins import torch_peer

    real = torch_peer.recurrent

    def wrong_dq(op, q, *rest):  # same output, dq doubled
        return real(op, q.detach() + 2 * (q - q.detach()), *rest)

    monkeypatch.setattr(torch_peer, "recurrent", wrong_dq)
    bad = _run("gdn")
    assert not bad.ok and bad.timing is None, bad
    assert "correctness gate failed for gdn/none/torchpeer" in (bad.error or ""), bad.error
