"""Sweep integration: a sweep with `tune: true` tunes the kernels its points use before timing them.

The worker's hook, per point (before its correctness check and timing), split so that only the worker's own
process touches the store (a rank process of a gang measures; the parent reads and writes):

    state = tuning_state(session)                      # parent: tuned configs and device crashers, plain data
    outcome = tune_missing(state, op=point.op, shape={"B": .., "T": .., "H": .., "K": .., "V": .., "dtype": ..,
                           "lengths": ..}, device=device, spec=TuneSpec.of(sweep_spec["tuning"]))   # rank
    crud.store_tuning(session, result=outcome.result, sweep_id=.., environment_id=..)   # parent: trials, winners
    # the rank launches with outcome.payload's configs: LaunchPlan(table=payload_table(outcome.payload), recorder=rec)
    ... time the point ...
    measurement.configs = launched_configs(rec)   # what each kernel actually launched with (observed)

`ensure_tuned(session, ...)` does the three in one process. A `direction: fwd+bwd` spec tunes with the training
step (forward + backward), so the backward's kernels are found and tuned the same way. `tune_missing` runs the op
once at the point's shape with every kernel at its default to see which kernels launch with which keys; keys
already tuned on this device with this build's source hash are reused from the state (so a sweep tunes each
distinct key once, and a second sweep not at all); the others are tuned (`tune_case`, no session; configs whose
earlier trial crashed the device are skipped, so a retried point does not crash again). It returns the configs
for the point's kernels in the autotune-file format (a plain, picklable dict) with the `TuneResult`; this
process's launches are left as they were (plans are passed, not installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from kernels.autotune import AutotuneTable, key_str, normalize_key, parse_autotune, source_hash
from kernels.configs import KERNELS, LaunchConfig, get_spec
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.tuner.export import export_from_rows
from runners.tuner.result import TUNED_FIELDS, TuneResult, TuningStopped
from runners.tuner.spec import TuneSpec
from runners.tuner.tune import Shape, device_facts, make_case, op_runner, tune_case

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["TuningOutcome", "ensure_tuned", "payload_table", "tune_missing", "tuning_state"]


def payload_table(payload: Mapping[str, Any] | None) -> AutotuneTable | None:
    """The table of configs returned by `ensure_tuned` / `tune_missing` for a launch plan (e.g. in each rank process
    of a gang: `LaunchPlan(table=payload_table(payload))`); None or no kernels: None (defaults)."""
    if not payload or not payload.get("kernels"):
        return None
    return parse_autotune(dict(payload), device_name=payload["device"]["name"])


def tuning_state(session: Session) -> dict[str, Any]:
    """What `tune_missing` reads from the store, as plain picklable data (the parent reads it for a rank process):
    every TunedConfig row, and the trials whose config crashed a device (`failed` with a CUDA error)."""
    from db import crud

    crashed = crud.list_trials(session, status="failed", error_contains="CUDA error")
    return {"tuned": [{f: getattr(r, f) for f in TUNED_FIELDS} for r in crud.list_tuned_configs(session)],
            "crashed": [{"kernel": t.kernel, "key_str": t.key_str, "device_name": t.device_name, "config": t.config,
                         "error": t.error} for t in crashed]}


@dataclass
class TuningOutcome:
    """What `tune_missing` measured (plain, picklable): the autotune payload for the point's kernels, the
    `TuneResult` (trials and winners of the keys it tuned) and the error that ended the search (if any)."""

    payload: dict[str, Any] | None
    result: TuneResult
    error: str | None = None


def tune_missing(
    state: Mapping[str, Any],
    *,
    op: str,
    shape: Shape | Mapping[str, Any],
    device: torch.device | str,
    spec: TuneSpec = TuneSpec(),
    backend: str = "triton",
    retune: bool = False,
) -> TuningOutcome:
    """Tune the point's kernels that `state` (`tuning_state`) lacks, without a store session; return them.

    A device crash during the search ends it: the outcome keeps the trials so far (the crashing one included)
    and the error, so the caller stores them before failing the attempt."""
    from db.models import TunedConfig

    shape = Shape.of(shape)
    dev_name, cc = device_facts(device)
    case = make_case(op, shape, device)
    run = op_runner(op, case, backend=backend, direction=spec.direction)
    run(LaunchPlan())
    seen = LaunchRecorder()
    run(LaunchPlan(configs={n: s.default for n, s in KERNELS.items()}, recorder=seen))
    launched = {n: normalize_key(k) for n, (k, _c) in seen.items() if get_spec(n).space}
    stored = {(r["kernel"], r["key_str"]): TunedConfig(**r) for r in state.get("tuned", ()) if r["device_name"] == dev_name}

    def current(name: str) -> Any:
        r = stored.get((name, key_str(launched[name])))
        return r if r is not None and r.source_hash == source_hash(name) else None

    out = TuningOutcome(payload=None, result=TuneResult(device_name=dev_name, compute_capability=cc))
    missing = [n for n in launched if retune or current(n) is None]
    if missing:
        try:
            out.result = tune_case(run, device=device, spec=replace(spec, kernels=tuple(missing)), dtype=shape.dtype,
                                   known_bad=_crashed(state, missing, {n: key_str(launched[n]) for n in missing}, dev_name))
        except TuningStopped as stop:  # a fatal trial: the trials so far go back with the error
            out.result, out.error = stop.result, str(stop)[:2000]
            return out
        stored.update({(r.kernel, r.key_str): r for r in out.result.tuned_rows()})
    rows = [r for n in launched if (r := current(n)) is not None]
    if not rows:
        return out
    out.payload = export_from_rows(rows, device_name=dev_name, allow_cpu=True)
    return out


def _crashed(state: Mapping[str, Any], kernels: list[str], keys: Mapping[str, str],
             dev_name: str) -> dict[str, dict[LaunchConfig, str]]:
    """The configs of `kernels` at their keys that crashed this device in an earlier attempt (the point was
    retried in a fresh gang): they stay out."""
    known_bad: dict[str, dict[LaunchConfig, str]] = {}
    for t in state.get("crashed", ()):
        n = t["kernel"]
        if n in kernels and t["device_name"] == dev_name and t["key_str"] == keys[n]:
            known_bad.setdefault(n, {})[LaunchConfig.from_dict(t["config"])] = f"crashed the device in an earlier trial: {t['error']}"
    return known_bad


def ensure_tuned(session: Session, *, sweep_id: int | None = None, environment_id: int | None = None,
                 **kwargs: Any) -> dict[str, Any] | None:
    """Tune the point's kernels that the store lacks in this process (`tuning_state` -> `tune_missing` ->
    `db.crud.store_tuning`); return their configs (a payload: `payload_table` makes it a launch plan's table). kwargs: `tune_missing`'s. A device crash stores the
    trials so far, then raises."""
    from db import crud

    outcome = tune_missing(tuning_state(session), **kwargs)
    session.commit()  # end the read transaction before the writes (SQLite: a stale snapshot cannot become a write)
    crud.store_tuning(session, result=outcome.result, sweep_id=sweep_id, environment_id=environment_id)
    session.commit()
    if outcome.error is not None:
        raise RuntimeError(outcome.error)
    return outcome.payload
