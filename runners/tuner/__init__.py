"""Autotuning of the suite's Triton kernels: search each kernel's declared space per shape key, keep every trial,
decide the winners, export them as the versioned autotune JSON that `kernels.use_autotune` loads.

Measuring and deciding never touch the store; the caller stores the result (`db.crud.store_tuning`):
- `spec.py`: `TuneSpec`, the tuner's options and the one place of their defaults (torch-free);
- `result.py`: `TuneResult` (per kernel and key: trials, winner, default's and runner-up's times) and
  `TuningStopped` (a search ended by a device crash, with what it measured so far);
- `search.py`: exhaustive, random(budget, seed), successive halving;
- `trials.py`: one config: validity, correctness against the default config's outputs, timing;
- `tune.py`: `tune_kernels(op=, shapes=, spec=, device=)` / `tune_case(run, device=, spec=)` -> TuneResult,
  and `tuned_table` (stored winners as a table for a launch plan);
- `fla.py`: `tune_fla(op=, shapes=, spec=)` -> TuneResult, the sibling strategy for FLA's autotuned kernels;
- `export.py`: `build_export(session, device_name=)` and `write_export(path, session, ...)`;
- `sweep.py`: the hook for sweeps with `tune: true`: `tuning_state(session)` (the reads), `tune_missing(state, ...)`
  (measures, no session: a rank process runs it; the worker stores its result), `ensure_tuned(session, ...)`
  (all three in one process) and `payload_table` (their configs for a launch plan);
- `clock.py`: the tuner's timers (CUDA events with L2 flush; wall clock on CPU, never exported).

The names below load their module on first use, so `import runners.tuner.spec` (the sweep spec's defaults)
imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "STRATEGIES": "spec", "TuneSpec": "spec",
    "KernelResult": "result", "TuneResult": "result", "TuningStopped": "result",
    "SearchResult": "search", "candidates": "search", "search": "search",
    "Trial": "result", "run_trial": "trials",
    "Shape": "tune", "tuned_table": "tune", "launched_configs": "tune", "make_case": "tune", "tune_case": "tune",
    "tune_kernels": "tune",
    "tune_fla": "fla",
    "ExportError": "export", "build_export": "export", "export_from_rows": "export", "write_export": "export",
    "TuningOutcome": "sweep", "ensure_tuned": "sweep", "payload_table": "sweep", "tune_missing": "sweep",
    "tuning_state": "sweep",
}  # fmt: skip

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
