"""Timing loop and stop rule (runners.timing) on a fake step driven by a fake clock (nothing here is timed).

Scenarios: `should_stop` for noise / max_samples / timeout and not before min_samples or min_time; `time_step`
on the CPU clock with a step whose duration is scripted: steady -> "noise" after min_samples; alternating 1/3 ms
-> "max_samples"; slow -> "timeout"; a first-call outlier (compile) is warmup, never a sample; a rule that did not
converge (max_samples, timeout, n < min_samples) marks the result unreliable and says why, a converged one does not.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from runners import timing
from runners.timing import StopRule, should_stop, time_step, unreliable_reason


def test_should_stop_rules() -> None:
    rule = StopRule(min_samples=3, max_samples=5, min_time_s=0.1, max_rel_iqr=0.05, timeout_s=1.0)
    steady = [1.0, 1.0, 1.0]
    assert should_stop([], 0.0, rule) is None
    assert should_stop(steady[:2], 0.5, rule) is None  # below min_samples
    assert should_stop(steady, 0.05, rule) is None  # below min_time
    assert should_stop(steady, 0.2, rule) == "noise"
    noisy = [1.0, 3.0, 1.0, 3.0]
    assert should_stop(noisy, 0.2, rule) is None
    assert should_stop([*noisy, 1.0], 0.2, rule) == "max_samples"
    assert should_stop(noisy, 1.0, rule) == "timeout"
    # a fast step: max_samples reached before min_time with a quiet spread converged (found on the H200: 100
    # samples of 0.275 ms at IQR/median 0.003 were stored unreliable "before the noise target")
    assert should_stop([1.0] * 5, 0.01, rule) == "noise"
    assert should_stop([1.0, 1.01, 1.0, 1.01, 1.0], 0.01, rule) == "noise"
    assert unreliable_reason([1.0] * 5, should_stop([1.0] * 5, 0.01, rule), rule) is None


def test_stop_rule_from_mapping_ignores_unknown() -> None:
    rule = StopRule.from_mapping({"min_samples": 4, "flush_l2": False, "bogus": 1})
    assert rule.min_samples == 4 and rule.flush_l2 is False and rule.max_samples == StopRule().max_samples


class FakeClock:
    """perf_counter that only moves when the fake step runs: each call advances by the next scripted duration."""

    def __init__(self, durations_ms: list[float] | itertools.cycle) -> None:
        self.t = 0.0
        self.durations = iter(durations_ms)
        self.calls = 0

    def perf_counter(self) -> float:
        return self.t

    def step(self) -> None:
        self.calls += 1
        self.t += next(self.durations) / 1e3


def _run(monkeypatch: pytest.MonkeyPatch, durations, rule: StopRule) -> tuple[timing.TimingResult, FakeClock]:
    clock = FakeClock(durations)
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    return time_step(clock.step, rule=rule, device=torch.device("cpu")), clock


def test_time_step_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = StopRule(min_samples=5, max_samples=50, min_time_s=0.0, max_rel_iqr=0.02, timeout_s=10.0, warmup_s=0.0)
    res, clock = _run(monkeypatch, itertools.chain([100.0], itertools.repeat(2.0)), rule)
    assert res.stop_reason == "noise"
    assert res.samples_ms == pytest.approx([2.0] * 5)
    assert res.warmup_iters == 2  # the 100 ms first call, then one settled call
    assert res.clock == "wall" and res.l2_flush_bytes == 0
    assert clock.calls == res.warmup_iters + len(res.samples_ms)
    assert res.unreliable is None and res.as_dict()["unreliable"] is None


def test_unreliable_reason() -> None:
    rule = StopRule(min_samples=3, max_rel_iqr=0.05)
    assert unreliable_reason([1.0, 1.0, 1.0], "noise", rule) is None
    assert unreliable_reason([1.0, 1.0], "noise", rule) == "stopped on noise with n=2 < min_samples=3 (IQR/median 0)"
    assert unreliable_reason([1.0, 1.0, 1.0], "timeout") == "stopped on timeout before the noise target (n=3, IQR/median 0)"
    assert unreliable_reason([], "timeout", rule) == "stopped on timeout with n=0 < min_samples=3 (no samples)"


def test_time_step_max_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = StopRule(min_samples=3, max_samples=12, min_time_s=0.0, max_rel_iqr=0.01, timeout_s=10.0, warmup_s=0.0)
    res, _ = _run(monkeypatch, itertools.cycle([1.0, 3.0]), rule)
    assert res.stop_reason == "max_samples" and len(res.samples_ms) == 12
    assert res.unreliable == "stopped on max_samples before the noise target (n=12, IQR/median 1 > 0.01)"


def test_time_step_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = StopRule(min_samples=10, max_samples=100, min_time_s=0.0, max_rel_iqr=0.01, timeout_s=0.5, warmup_s=0.0)
    res, _ = _run(monkeypatch, itertools.cycle([100.0, 250.0]), rule)
    assert res.stop_reason == "timeout"
    # warmup takes 100 + 250 ms (the second call is settled); samples then run until 0.5 s have passed:
    # 100, 250, 100 (0.45 s), 250 (0.70 s >= timeout), well short of min_samples
    assert res.warmup_iters == 2
    assert res.samples_ms == pytest.approx([100.0, 250.0, 100.0, 250.0])
    assert res.unreliable is not None and res.unreliable.startswith("stopped on timeout with n=4 < min_samples=10 (")


def test_time_step_min_time(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = StopRule(min_samples=2, max_samples=1000, min_time_s=0.05, max_rel_iqr=0.02, timeout_s=10.0, warmup_s=0.0)
    res, _ = _run(monkeypatch, itertools.repeat(1.0), rule)
    assert res.stop_reason == "noise" and len(res.samples_ms) >= 50  # 50 ms of 1 ms samples


def test_stream_hold_spin_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA spin before each sample lasts 2x the longest recent host enqueue time (max over ranks), capped."""
    from collections import deque

    spins: list[int] = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles))
    hold = timing._StreamHold.__new__(timing._StreamHold)  # skip the GPU calibration
    hold.recent, hold.cycles_per_ms = deque(maxlen=16), 1000.0
    hold()
    hold.saw(3000.0)  # the compile call
    hold.saw(0.2)
    hold()
    hold.restart()  # sampling starts: only the settled call is remembered
    hold()
    for _ in range(16):
        hold.saw(0.1)
    hold()
    assert spins == [1000, 50_000, 400, 200]
