"""Dashboard figures: each module is pure (result rows in, `go.Figure` out) and exposes NAME, TITLE, COLUMNS,
`frame(rows)` (the table it plots, also served as CSV) and `figure(rows)`.

SWEEP_FIGURES are drawn from one sweep's results; `tuning` and `history` from trials and nightly runs.
"""

from dashboards.figures import accuracy, best_mode, comm, history, latency, libraries, predicted, scaling, syncs, tuning

SWEEP_FIGURES = {m.NAME: m for m in (best_mode, libraries, latency, scaling, predicted, comm, syncs, accuracy)}
ALL_FIGURES = {**SWEEP_FIGURES, tuning.NAME: tuning, history.NAME: history}

__all__ = ["ALL_FIGURES", "SWEEP_FIGURES", "accuracy", "best_mode", "comm", "history", "latency", "libraries", "predicted", "scaling",
           "syncs", "tuning"]
