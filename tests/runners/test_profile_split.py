"""A training step's profile split per direction (`runners.profile` by_direction) and the per-direction check of the
collectives (`runners.collective_check`), in this process.

- A real training step (`runners.training.train_step`) on the CPU whose autograd Function reads a device value in
  its forward once and in its backward twice: the step's 3 host syncs split 1 (fwd) / 2 (bwd); a forward-only
  step has no split.
- Synthetic profiler events: a collective on another thread with no parent (CUDA's autograd thread) inside the
  backward's range goes to the backward; a GPU copy that starts after the backward's CPU range ended (the GPU
  trails the host) goes to the backward too; the gradient reset before the forward's range goes to the forward;
  each direction counts the totals' naming layer, so the directions sum to the totals; ranks merge per direction
  like the totals (send/recv summed, group collectives the max).
- The check: a backward with an extra all-gather is reported even where the forward has one fewer (the totals
  agree); an exact profile gives no mismatch; a forward point compares its totals only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from runners import collective_check
from runners.profile import BWD_RANGE, FWD_RANGE, STEP_RANGE, ProfileSummary, merge_ranks, profile_step, summarize_events
from runners.training import train_step

CPU = torch.device("cpu")


class _ReadsHost(torch.autograd.Function):
    """y = 2x, reading a device value once in the forward and twice in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        float(x.sum())
        return 2 * x

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
        float(dy.sum())
        float(dy.max())
        return 2 * dy


def test_training_step_splits_host_syncs_per_direction() -> None:
    x = torch.randn(8, requires_grad=True)
    step = train_step(lambda: _ReadsHost.apply(x), [x], torch.ones(8))
    step()
    p = profile_step(step, device=CPU)
    assert p.host_syncs == 3
    assert p.by_direction == {"fwd": {"collectives": {}, "collective_bytes": {}, "host_syncs": 1},
                              "bwd": {"collectives": {}, "collective_bytes": {}, "host_syncs": 2}}
    assert torch.equal(x.grad, torch.full((8,), 2.0))
    fwd_only = profile_step(lambda: _ReadsHost.apply(x.detach()), device=CPU)
    assert fwd_only.host_syncs == 1 and fwd_only.by_direction == {}


def _evt(name: str, start: float, end: float, *, device: str = "CPU", shapes: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end),
                           device_type=SimpleNamespace(name=device), cpu_parent=None, input_shapes=shapes or [],
                           input_dtypes=["float"] * len(shapes or []))


def _training_events() -> list[SimpleNamespace]:
    """One rank's step: a reduce-scatter before the forward's range, an all-gather in the forward, and in the
    backward's range an all-gather on another thread (no parent) and a D2H copy that runs after the range."""
    return [
        _evt(STEP_RANGE, 0, 100),
        _evt("c10d::_reduce_scatter_base_", 1, 2, shapes=[[4], [8]]),  # before any range: the forward's
        _evt("gloo:reduce_scatter", 1, 2),
        _evt(FWD_RANGE, 10, 40),
        _evt("c10d::_allgather_base_", 12, 14, shapes=[[8], [4]]),
        _evt("gloo:all_gather", 12, 14, shapes=[[4]]),               # the same call, backend layer: not counted twice
        _evt(BWD_RANGE, 50, 90),
        _evt("c10d::_allgather_base_", 60, 62, shapes=[[16], [8]]),  # the autograd thread's, no parent
        _evt("gloo:all_gather", 60, 62, shapes=[[8]]),
        _evt("Memcpy DtoH (Device -> Pinned)", 92, 93, device="CUDA"),   # the GPU trails the host
        _evt("aten::item", 200, 201),                                 # outside the step: not counted
    ]


def test_split_by_time_attributes_threads_and_trailing_device_events() -> None:
    s = summarize_events(_training_events())
    assert s.collectives == {"all_gather": 2, "reduce_scatter": 1} and s.host_syncs == 1
    assert s.by_direction == {
        "fwd": {"collectives": {"all_gather": 1, "reduce_scatter": 1}, "collective_bytes": {"all_gather": 16,
                                                                                          "reduce_scatter": 32},
                "host_syncs": 0},
        "bwd": {"collectives": {"all_gather": 1}, "collective_bytes": {"all_gather": 32}, "host_syncs": 1},
    }
    for kind, n in s.collectives.items():
        assert sum(s.by_direction[d]["collectives"].get(kind, 0) for d in ("fwd", "bwd")) == n
    assert summarize_events([e for e in _training_events() if e.name != BWD_RANGE]).by_direction == {}


def test_merge_ranks_per_direction() -> None:
    a = summarize_events(_training_events())
    b = summarize_events([*_training_events(), _evt("c10d::send", 70, 71), _evt("gloo:send", 70, 71, shapes=[[2]])])
    m = merge_ranks([a, b])
    assert m.by_direction["bwd"] == {"collectives": {"all_gather": 1, "send": 1}, "collective_bytes": {"all_gather": 32, "send": 8},
                                     "host_syncs": 2}
    assert m.by_direction["fwd"]["collectives"] == {"all_gather": 1, "reduce_scatter": 1}
    assert merge_ranks([a, ProfileSummary(**{**b.as_dict(), "by_direction": {}})]).by_direction == {}


def test_check_catches_a_backward_with_an_extra_all_gather() -> None:
    expected = collective_check.merge_gang([{"fwd": {"all_gather": 1}, "bwd": {"all_gather": 1}}] * 2)
    assert expected == {"fwd": {"all_gather": 1}, "bwd": {"all_gather": 1}}
    moved = {"collectives": {"all_gather": 2},
             "by_direction": {"fwd": {"collectives": {}}, "bwd": {"collectives": {"all_gather": 2}}}}
    assert collective_check.mismatches(moved, expected) == ["fwd all_gather: measured 0, expected 1",
                                                            "bwd all_gather: measured 2, expected 1"]
    exact = {"collectives": {"all_gather": 2},
             "by_direction": {"fwd": {"collectives": {"all_gather": 1}}, "bwd": {"collectives": {"all_gather": 1}}}}
    assert collective_check.mismatches(exact, expected) == []
    extra = {"collectives": {"all_gather": 3},
             "by_direction": {"fwd": {"collectives": {"all_gather": 1}}, "bwd": {"collectives": {"all_gather": 2}}}}
    assert collective_check.mismatches(extra, expected) == ["step all_gather: measured 3, expected 2",
                                                            "bwd all_gather: measured 2, expected 1"]
    ring = collective_check.merge_gang([{"fwd": {"send": 1}}, {"fwd": {"recv": 1}}])
    assert collective_check.mismatches({"collectives": {"send": 1, "recv": 1}}, ring) == []
    assert collective_check.merge_gang([{"fwd": {}}, None]) is None   # a rank states no count: nothing to check
