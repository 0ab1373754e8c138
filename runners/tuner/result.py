"""What a tuning run measured and decided, as plain picklable data, with no store session anywhere.

A strategy (`runners.tuner.tune.tune_case` for our kernels, `runners.tuner.fla.tune_fla` for FLA's) returns a
`TuneResult`: per kernel and key (`KernelResult`), its trials (`Trial`), the winner, its median and the default's and
runner-up's medians, and what storing and exporting them needs (device, key string, source hash, time measured).
The caller stores it afterwards, in one transaction (`db.crud.store_tuning(session, result=...)`, which reads
`trial_rows()` and `winner_rows()`), exports it (`tuned_rows()`, transient `TunedConfig`s) or installs it.

A search that cannot go on (a device crash poisons the process) raises `TuningStopped`, whose `result` holds
everything measured so far, the crashing trial included, so the caller still stores it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

if TYPE_CHECKING:
    from db.models import TunedConfig

__all__ = ["FLASH_QLA_PREFIX", "FLA_PREFIX", "PEER_PREFIXES", "TUNED_FIELDS", "KernelResult", "OnResult", "Trial", "TuneProgress", "TuneResult", "TuningStopped", "report_new"]

FLA_PREFIX = "fla."  # FLA's kernels are stored as `fla.<kernel_name>` (exported in FLA's format, never in ours)
FLASH_QLA_PREFIX = "flash_qla."  # FlashQLA's fitted cost coefficients, `flash_qla.<row>` (runners.tuner.flash_qla_coefs)
PEER_PREFIXES = (FLA_PREFIX, FLASH_QLA_PREFIX)  # stored tuning of a peer's kernels: exported in the peer's format
TRIAL_FIELDS = ("kernel", "key", "config", "strategy", "rung", "status", "median_ms", "n", "error")  # stored
# a TunedConfig row's fields as plain data (what `runners.tuner.sweep.tuning_state` hands a rank process)
TUNED_FIELDS = ("kernel", "key", "key_str", "device_name", "compute_capability", "config", "median_ms", "default_ms",
                "runner_up_ms", "source_hash", "sweep_id", "environment_id", "measured_at")


def _now() -> datetime:
    return datetime.now(timezone.utc)


C = TypeVar("C")


@dataclass
class Trial(Generic[C]):
    """What one config did for one kernel and key (mirrors a TuningTrial row). A search's trials hold the config
    itself (a `LaunchConfig`); a KernelResult's, its dict as stored."""

    kernel: str
    key: dict[str, Any]
    config: C
    strategy: str
    rung: int
    status: str
    median_ms: float | None = None
    n: int = 0
    error: str | None = None
    samples: list[float] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class KernelResult:
    """One kernel at one key: its trials in measuring order and the decision (`config` None: no config ran
    correctly, or the search stopped first: the default stays and no winner is stored)."""

    kernel: str
    key: dict[str, Any]
    key_str: str
    source_hash: str
    trials: tuple[Trial[dict[str, Any]], ...]
    config: dict[str, Any] | None = None
    median_ms: float | None = None
    default_ms: float | None = None
    runner_up_ms: float | None = None
    measured_at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class TuneResult:
    """A tuning run on one device: its kernels' results, in the order they were searched."""

    device_name: str
    compute_capability: str | None
    kernels: tuple[KernelResult, ...] = ()

    def extended(self, kernels: Iterable[KernelResult]) -> TuneResult:
        return replace(self, kernels=self.kernels + tuple(kernels))

    def winners(self) -> list[KernelResult]:
        return [k for k in self.kernels if k.config is not None]

    def trial_rows(self) -> list[dict[str, Any]]:
        """`db.crud.store_trial`'s fields of every trial (sweep and environment left to the caller)."""
        return [{"device_name": self.device_name, "key_str": k.key_str, **{f: getattr(t, f) for f in TRIAL_FIELDS}}
                for k in self.kernels for t in k.trials]

    def winner_rows(self) -> list[dict[str, Any]]:
        """`db.crud.upsert_tuned_config`'s fields of every winner, with when it was measured."""
        return [{"kernel": k.kernel, "key": k.key, "key_str": k.key_str, "device_name": self.device_name,
                 "compute_capability": self.compute_capability, "config": k.config, "median_ms": k.median_ms,
                 "default_ms": k.default_ms, "runner_up_ms": k.runner_up_ms, "source_hash": k.source_hash,
                 "measured_at": k.measured_at} for k in self.winners()]

    def tuned_rows(self) -> list[TunedConfig]:
        """The winners as transient TunedConfig rows (what `runners.tuner.export.export_from_rows` reads)."""
        from db.models import TunedConfig

        return [TunedConfig(**w) for w in self.winner_rows()]

    def stop(self, err: Exception) -> NoReturn:
        """End a run on `err`: as `TuningStopped` carrying this result when it holds anything measured (the caller
        stores it), else `err` itself. A TuningStopped of an inner run is merged into this result."""
        if isinstance(err, TuningStopped):
            raise TuningStopped(self.extended(err.result.kernels), err.error) from err.error
        if self.kernels:
            raise TuningStopped(self, err) from err
        raise err


class TuningStopped(RuntimeError):
    """A search ended by `error` (e.g. a CUDA error that poisons the process); `result`: what was measured so far."""

    def __init__(self, result: TuneResult, error: Exception) -> None:
        super().__init__(f"tuning stopped: {type(error).__name__}: {error}")
        self.result, self.error = result, error

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.result, self.error)


# called with each kernel's result as soon as it is decided (also the partial one a device crash ends), as a
# TuneResult of its own: how `cpbench tune` stores as it goes, so a killed run keeps what it measured
OnResult = Callable[[TuneResult], None]


def report_new(on_result: OnResult | None, before: TuneResult, after: TuneResult) -> None:
    """Hand `on_result` the kernels `after` holds beyond `before` (nothing when there are none or no callback)."""
    new = after.kernels[len(before.kernels):]
    if on_result is not None and new:
        on_result(replace(after, kernels=new))


class TuneProgress(Protocol):
    """What a search is doing, for a caller that shows it (`cpbench tune`): each kernel and key as its search
    starts, each trial as it ends."""

    def kernel_started(self, kernel: str, key: str, *, configs: int, dropped: int) -> None:
        """`configs`: how many the first rung (random: all) measures; `dropped`: configs left out as invalid for
        the shape (`runners.tuner.trials.static_invalid_reason`)."""

    def trial_done(self, trial: Trial[Any]) -> None: ...
