"""Sweep integration: a sweep with `tune: true` tunes the kernels its points use before timing them.

The worker's hook, per point (before its correctness check and timing):

    payload = ensure_tuned(session, op=point.op, shape={"B": .., "T": .., "H": .., "K": .., "V": .., "dtype": ..,
                           "lengths": ..}, device=device, sweep_id=point.sweep_id, environment_id=env_id)
    # this process now launches with the tuned configs; a rank process of a gang: install_payload(payload)
    ... time the point ...
    measurement.configs = launched_configs()      # what each kernel actually launched with (observed)

A `direction: fwd+bwd` point tunes with the training step (forward + backward), so the backward's kernels
are found and tuned the same way. `ensure_tuned` runs the op once at the point's shape with every kernel at its default to see which kernels
launch with which keys; keys already tuned on this device with this build's source hash are reused from the
store (so a sweep tunes each distinct key once, and a second sweep not at all); the others are tuned
(`tune_case`, trials stored with the sweep id; configs whose earlier trial crashed the device are skipped,
so a retried point does not crash again). It returns the configs for the point's kernels in the
autotune-file format (a plain, picklable dict) and installs them in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from kernels.autotune import install, key_str, normalize_key, parse_autotune, source_hash
from kernels.configs import KERNELS, LAUNCHES, LaunchConfig, get_spec
from runners.tuner.export import export_from_rows
from runners.tuner.tune import _DTYPES, _TOL, Shape, device_facts, make_case, op_runner, tune_case

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["ensure_tuned", "install_payload"]


def install_payload(payload: Mapping[str, Any] | None) -> None:
    """Install configs returned by `ensure_tuned` (e.g. in each rank process of a gang); None: defaults."""
    if not payload or not payload.get("kernels"):
        install(None)
        return
    install(parse_autotune(dict(payload), device_name=payload["device"]["name"]))


def ensure_tuned(
    session: Session,
    *,
    op: str,
    shape: Shape | Mapping[str, Any],
    device: torch.device | str,
    sweep_id: int | None = None,
    environment_id: int | None = None,
    strategy: str = "halving",
    budget: int | None = None,
    samples: int = 20,
    min_samples: int = 5,
    max_samples: int = 60,
    backend: str = "triton",
    retune: bool = False,
    direction: str = "fwd",
) -> dict[str, Any] | None:
    """Tune the point's kernels that the store lacks (see the module docstring); install and return their configs.

    strategy, budget, samples, min_samples, max_samples: the search (`tune_case`; a sweep's `tuning` spec).
    direction: `"fwd"` (the forward's kernels) or `"fwd+bwd"` (the training step: the backward's kernels too, each
    trial timing and checking the whole step; `op_runner`)."""
    from db import crud

    shape = Shape.of(shape)
    dev_name, _cc = device_facts(device)
    case = make_case(op, shape, device)
    run = op_runner(op, case, backend=backend, direction=direction)
    install(None)
    run({})
    LAUNCHES.clear()
    run({n: s.default for n, s in KERNELS.items()})
    launched = {n: normalize_key(k) for n, (k, _c) in LAUNCHES.items() if get_spec(n).space}
    stored = {(r.kernel, r.key_str): r for r in crud.list_tuned_configs(session, device_name=dev_name)}

    def current(name: str) -> Any:
        r = stored.get((name, key_str(launched[name])))
        return r if r is not None and r.source_hash == source_hash(name) else None

    missing = [n for n in launched if retune or current(n) is None]
    if missing:
        # configs that crashed the device in an earlier attempt (the point was retried in a fresh gang) stay out
        known_bad: dict[str, dict[LaunchConfig, str]] = {}
        for n in missing:
            for t in crud.list_trials(session, kernel=n, device_name=dev_name):
                if t.status == "failed" and t.key_str == key_str(launched[n]) and "CUDA error" in (t.error or ""):
                    known_bad.setdefault(n, {})[LaunchConfig.from_dict(t.config)] = f"crashed the device in an earlier trial: {t.error}"
        rows, _ = tune_case(session, run=run, device=device, kernels=missing, strategy=strategy, budget=budget,
                            samples=samples, min_samples=min_samples, max_samples=max_samples, tol=_TOL[_DTYPES[shape.dtype]], sweep_id=sweep_id, environment_id=environment_id,
                            known_bad=known_bad)
        stored.update({(r.kernel, r.key_str): r for r in rows})
    rows = [r for n in launched if (r := current(n)) is not None]
    if not rows:
        install(None)
        return None
    payload = export_from_rows(rows, device_name=dev_name, allow_cpu=True)
    install_payload(payload)
    return payload
