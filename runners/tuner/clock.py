"""The tuner's timers: `n` samples (ms) of one callable, through the engine's `runners.timing.time_step`.

A search strategy decides how many samples each config gets (successive halving grows them per rung), so the
stop rule is pinned to exactly `n` samples: `StopRule(min_samples=n, max_samples=n, min_time_s=0)`. Everything
else is the engine's method (warmup until compile is over; on CUDA an L2 flush of twice the device's L2
before each sample, outside the CUDA-event interval; wall clock on CPU), so tuned and swept numbers are
measured alike. `WallTimer` is a bare wall clock for tests.

CPU timings exist for tests only: the exporter refuses device "cpu" (runners.tuner.export).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from kernels.builds import wait_for_builds
from runners.timing import L2Flush, StopRule, time_step

__all__ = ["StepTimer", "Timer", "WallTimer", "make_timer"]


class Timer(Protocol):
    clock: str

    def __call__(self, fn: Callable[[], object], n: int) -> list[float]: ...


class StepTimer:
    """Exactly `n` samples of `fn` with the engine's warmup, L2 flush (CUDA) and clock."""

    def __init__(self, device: torch.device | str, *, timeout_s: float = 15.0) -> None:
        self.device = torch.device(device)
        self.clock = "cuda_events" if self.device.type == "cuda" else "wall"
        self.flush = L2Flush(self.device) if self.device.type == "cuda" else None
        self.timeout_s = timeout_s

    def __call__(self, fn: Callable[[], object], n: int) -> list[float]:
        rule = StopRule(min_samples=n, max_samples=n, min_time_s=0.0, timeout_s=self.timeout_s)
        return time_step(fn, rule=rule, device=self.device, flush=self.flush).samples_ms


class WallTimer:
    """Bare wall-clock samples after `warmup` untimed calls (tests)."""

    clock = "wall"

    def __init__(self, warmup: int = 1) -> None:
        self.warmup = warmup

    def __call__(self, fn: Callable[[], object], n: int) -> list[float]:
        for _ in range(self.warmup):
            fn()
        wait_for_builds()  # the TileLang kernels the warmup left building (`runners.timing.time_step` does the same)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out


def make_timer(device: torch.device | str) -> Timer:
    return StepTimer(device)
