"""Autotuning of the suite's Triton kernels: search each kernel's declared space per shape key, keep every trial,
store the winners, export them as the versioned autotune JSON that `kernels.use_autotune` loads.

- `search.py`: exhaustive, random(budget, seed), successive halving;
- `trials.py`: one config: validity, correctness against the default config's outputs, timing, record;
- `tune.py`: `tune_kernels(session, op=, shapes=, strategy=, budget=, sweep_id=, device=)` and `tuned_table`;
- `export.py`: `build_export(session, device_name=)` and `write_export(path, session, ...)`;
- `sweep.py`: the hook for sweeps with `tune: true`: `tuning_state(session)` (the reads), `tune_missing(state, ...)`
  (measures, no session: a rank process runs it), `store_tuning(session, outcome)` (the writes, in the worker),
  `ensure_tuned(session, ...)` (all three in one process) and `payload_table` (their configs for a launch plan);
- `clock.py`: the tuner's timers (CUDA events with L2 flush; wall clock on CPU, never exported).
"""

from runners.tuner.export import ExportError, build_export, export_from_rows, write_export
from runners.tuner.search import STRATEGIES, SearchResult, candidates, search
from runners.tuner.sweep import TuningOutcome, ensure_tuned, payload_table, store_tuning, tune_missing, tuning_state
from runners.tuner.trials import Trial, run_trial
from runners.tuner.tune import Shape, launched_configs, make_case, tune_case, tune_kernels, tuned_table

__all__ = [
    "STRATEGIES",
    "ExportError",
    "SearchResult",
    "Shape",
    "Trial",
    "TuningOutcome",
    "build_export",
    "candidates",
    "ensure_tuned",
    "export_from_rows",
    "launched_configs",
    "make_case",
    "payload_table",
    "run_trial",
    "search",
    "store_tuning",
    "tune_case",
    "tune_kernels",
    "tune_missing",
    "tuned_table",
    "tuning_state",
    "write_export",
]
