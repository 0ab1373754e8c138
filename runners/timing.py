"""Timing of one step on every rank of a gang: warmup, then samples until the stop rule says enough.

Measures only; returns raw samples (ms) and why it stopped. Summaries are `runners.stats`, storage `db.crud`.

Method (nvbench's cold measurement, anchors/bench-services.md (d) level 0):

- Warmup (both clocks) until the first-call costs (Triton compile, autotune, allocator growth) are over: at
  least `warmup_min_iters` calls and `warmup_s` seconds, the first call never counts as settled, and the last
  call is no slower than 1.5x the fastest call after the first. After the first warmup call the TileLang kernels
  building in the background are waited for (`kernels.wait_for_builds`: a first call runs on Triton meanwhile,
  `kernels.first_call`), so the calls after it, warmup and samples, all run the same kernels: never a mix.
- CUDA: each sample: zero an L2-flush buffer of twice the device's L2 size (outside the timed interval), queue
  a spin kernel that holds the stream while the host enqueues the step (nvbench's blocking kernel: host launch
  gaps stay out of the sample, as in a queue-ahead loop like `triton.testing.do_bench`), record a CUDA event,
  run the step, record another, wait for it; the sample is the event interval.
- CPU: wall clock (`time.perf_counter`) around the step; no flush.
- Several ranks: each rank times its own step; after the timed region only, one tiny all-reduce (MAX) of
  `[ms, -ms, elapsed, host enqueue ms]` gives every rank the same sample (the max over ranks), the min over
  ranks (kept for the skew), the same elapsed time (so every rank takes the same stop decision and no
  collective hangs) and the same spin length for the next sample.
  The all-reduce and its host read also line the ranks up before the next sample.

Stop rule (`StopRule`, defaults as nvbench's `--min-samples 10 --min-time 0.5 --timeout 15`, noise as
relative IQR): stop with "noise" once there are `min_samples` samples, `min_time_s` seconds have passed
since sampling began (or `max_samples` are taken) and IQR/median <= `max_rel_iqr`; with "max_samples" at
`max_samples` while IQR/median is still above the target; with "timeout"
after `timeout_s` seconds of sampling (at least one sample is always taken).

A measurement whose rule did not converge (it stopped on "max_samples" or "timeout" instead of the noise target, or
with fewer than `min_samples` samples) is **unreliable**: `unreliable_reason` says why, `TimingResult.unreliable`
carries it, the store keeps it beside the stop reason (`measurements.unreliable`) and no page draws a speedup
headline from it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from kernels.builds import wait_for_builds
from runners.stats import rel_iqr

if TYPE_CHECKING:
    import torch

__all__ = ["L2Flush", "StopRule", "TimingResult", "should_stop", "time_step", "unreliable_reason"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopRule:
    """When sampling stops. Defaults are the documented ones (module docstring); a spec's `timing` overrides.

    min_samples: samples before the noise rule may stop (10).
    max_samples: hard cap on samples (200).
    min_time_s: seconds of sampling before the noise rule may stop (0.5).
    max_rel_iqr: noise target, IQR / median (0.02).
    timeout_s: seconds of sampling after which it stops whatever the noise (15).
    warmup_s / warmup_min_iters: least warmup time and calls (0.025 s, 2); warmup also ends at `timeout_s`.
    flush_l2: zero an L2-sized buffer before every CUDA sample (True).
    """

    min_samples: int = 10
    max_samples: int = 200
    min_time_s: float = 0.5
    max_rel_iqr: float = 0.02
    timeout_s: float = 15.0
    warmup_s: float = 0.025
    warmup_min_iters: int = 2
    flush_l2: bool = True

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None) -> StopRule:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})


@dataclass
class TimingResult:
    """Raw samples of one point (ms, max over ranks) and how they were taken."""

    samples_ms: list[float]
    stop_reason: str  # "noise" | "max_samples" | "timeout"
    clock: str  # "cuda_events" | "wall"
    rank_min_ms: list[float] = field(default_factory=list)  # min over ranks per sample (skew = max - min)
    host_ms: list[float] = field(default_factory=list)  # CUDA: host time to enqueue the step (max over ranks)
    warmup_iters: int = 0
    warmup_s: float = 0.0
    l2_flush_bytes: int = 0
    unreliable: str | None = None  # why the stop rule did not converge (`unreliable_reason`); None: it did

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def should_stop(samples_ms: list[float], elapsed_s: float, rule: StopRule) -> str | None:
    """The stop reason after these samples and this much sampling time, or None to take another."""
    n = len(samples_ms)
    if n == 0:
        return None
    quiet = n >= rule.min_samples and rel_iqr(samples_ms) <= rule.max_rel_iqr
    if quiet and (elapsed_s >= rule.min_time_s or n >= rule.max_samples):
        return "noise"  # a fast step can reach max_samples before min_time_s: its spread, not the clock, decides
    if n >= rule.max_samples:
        return "max_samples"
    if elapsed_s >= rule.timeout_s:
        return "timeout"
    return None


def unreliable_reason(samples_ms: list[float], stop_reason: str | None, rule: StopRule | None = None) -> str | None:
    """Why a measurement that stopped on `stop_reason` after `samples_ms` is unreliable, or None when its stop rule
    converged (stopped on "noise" with at least `rule.min_samples` samples). Without `rule` (a result stored before
    the rule was kept) only the stop reason is judged."""
    n = len(samples_ms)
    spread = f"IQR/median {rel_iqr(samples_ms):.3g}" if n else "no samples"
    target = f" > {rule.max_rel_iqr:g}" if rule is not None and n else ""
    if rule is not None and n < rule.min_samples:
        return f"stopped on {stop_reason} with n={n} < min_samples={rule.min_samples} ({spread})"
    if stop_reason not in (None, "noise"):
        return f"stopped on {stop_reason} before the noise target (n={n}, {spread}{target})"
    return None


class L2Flush:
    """A buffer of twice the device's L2 size; calling it zeroes the buffer (evicting the step's data from L2)."""

    def __init__(self, device: torch.device) -> None:
        import torch

        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (50 << 20)
        self.nbytes = 2 * l2
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class _RankMax:
    """Max over the ranks of a few floats, through one all-reduce of a tiny tensor (identity alone)."""

    def __init__(self, group: Any, device: torch.device) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.active = group is not None and dist.get_world_size(group) > 1
        self.device = device

    def __call__(self, ms: float, elapsed: float, host_ms: float) -> tuple[float, float, float, float]:
        """(max ms, min ms, max elapsed, max host enqueue ms) over the ranks."""
        if not self.active:
            return ms, ms, elapsed, host_ms
        import torch

        buf = torch.tensor([ms, -ms, elapsed, host_ms], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(buf, op=self.dist.ReduceOp.MAX, group=self.group)
        hi, neg_lo, el, host = buf.tolist()
        return hi, -neg_lo, el, host


class _StreamHold:
    """nvbench's blocking kernel: a spin kernel (`torch.cuda._sleep`) queued before the timed region, long enough
    (2x the longest host enqueue time of the last 16 steps, at most 50 ms) that the host has queued the whole step
    before the GPU starts it; the CUDA-event interval then holds GPU time only, as a queue-ahead loop (do_bench)
    sees it. Ranks feed it the max over ranks, so every rank spins equally long and no rank's sample includes
    another rank's spin (their collectives would wait for it)."""

    def __init__(self, device: torch.device) -> None:
        # host enqueue times of the last 16 steps (max over ranks): one slow enqueue (a GC pause) is forgotten soon
        self.recent: deque[float] = deque(maxlen=16)
        # cycles per ms of the spin kernel, calibrated once
        import torch

        with torch.cuda.device(device):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1000)
            a.record()
            torch.cuda._sleep(2_000_000)
            b.record()
            b.synchronize()
            self.cycles_per_ms = 2_000_000 / max(a.elapsed_time(b), 1e-3)

    def __call__(self) -> None:
        import torch

        ms = min(2.0 * max(self.recent), 50.0) if self.recent else 1.0
        torch.cuda._sleep(int(self.cycles_per_ms * ms))

    def saw(self, host_ms: float) -> None:
        self.recent.append(host_ms)

    def restart(self) -> None:
        """Forget the warmup's enqueue times (the first call compiles); keep the last, settled one."""
        last = list(self.recent)[-1:]
        self.recent.clear()
        self.recent.extend(last)


def time_step(
    step: Callable[[], Any],
    *,
    rule: StopRule,
    device: torch.device,
    group: Any = None,
    flush: L2Flush | None = None,
) -> TimingResult:
    """Warm `step` up, then sample it until `rule` stops. Every rank of `group` must call this together.

    `flush`: the L2 flush to run before each CUDA sample (None: no flush). On the CPU it is ignored.
    """
    import torch

    on_cuda = device.type == "cuda"
    rank_max = _RankMax(group, device)
    hold: _StreamHold | None = None
    if on_cuda:
        hold = spin = _StreamHold(device)
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def one() -> tuple[float, float]:
            if flush is not None and rule.flush_l2:
                flush()
            # the stream waits in a spin kernel while the host enqueues the step: launch gaps stay out of the sample
            spin()
            t_host = time.perf_counter()
            start_ev.record()
            step()
            end_ev.record()
            host_ms = (time.perf_counter() - t_host) * 1e3
            end_ev.synchronize()
            return float(start_ev.elapsed_time(end_ev)), host_ms
    else:

        def one() -> tuple[float, float]:
            t0 = time.perf_counter()
            step()
            ms = (time.perf_counter() - t0) * 1e3
            return ms, ms

    def sample(since: float) -> tuple[float, float, float, float]:
        ms, host_ms = one()
        hi, lo, el, host = rank_max(ms, time.perf_counter() - since, host_ms)
        if hold is not None:
            hold.saw(host)
        return hi, lo, el, host

    # warmup: the first call (compile, autotune, allocator growth) never counts as settled; afterwards stop
    # once enough calls and time have passed and the last call is within 1.5x of the fastest later call
    t_warm = time.perf_counter()
    calls: list[float] = []
    while True:
        hi, _lo, el, _host = sample(t_warm)
        if not calls:  # the kernels a first call left building: built before any call that may count (the wait
            t_wait = time.perf_counter()  # is outside the warmup's clock)
            wait_for_builds()
            t_warm += time.perf_counter() - t_wait
        calls.append(hi)
        settled = len(calls) >= 2 and hi <= 1.5 * min(calls[1:])
        if (len(calls) >= rule.warmup_min_iters and el >= rule.warmup_s and settled) or el >= rule.timeout_s:
            break
    iters = len(calls)
    if hold is not None:
        hold.restart()
    warm_s = time.perf_counter() - t_warm

    samples: list[float] = []
    lows: list[float] = []
    hosts: list[float] = []
    t0 = time.perf_counter()
    while True:
        hi, lo, el, host = sample(t0)
        samples.append(hi)
        lows.append(lo)
        hosts.append(host)
        reason = should_stop(samples, el, rule)
        if reason is not None:
            break
    logger.debug("timed %d samples (%s) after %d warmup calls", len(samples), reason, iters)
    return TimingResult(
        samples_ms=samples,
        stop_reason=reason,
        clock="cuda_events" if on_cuda else "wall",
        rank_min_ms=lows,
        warmup_iters=iters,
        warmup_s=warm_s,
        l2_flush_bytes=flush.nbytes if (flush is not None and on_cuda and rule.flush_l2) else 0,
        host_ms=hosts if on_cuda else [],
        unreliable=unreliable_reason(samples, reason, rule),
    )
