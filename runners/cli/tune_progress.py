"""What `cpbench tune` shows while it searches: one line as each kernel's search starts, one line per finished
rung (or per 10 trials of a rung), and on a terminal a live count of the current rung's trials (rich, transient);
a piped log gets only the lines, never a redrawn bar. Implements `runners.tuner.result.TuneProgress`.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["TRIALS_PER_LINE", "TuneProgressPrinter"]

TRIALS_PER_LINE = 10  # a long rung on a piped log: one line per this many trials


class TuneProgressPrinter:
    """Prints a tuning run's progress (see the module docstring); `close()` ends the live bar."""

    def __init__(self, *, live: bool) -> None:
        self._bar: Progress | None = None
        if live:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
        self._task: Any = None
        self._kernel, self._rung, self._count, self._ok, self._best = "", 0, 0, 0, None

    def kernel_started(self, kernel: str, key: str, *, configs: int, dropped: int) -> None:
        self.flush()
        self._kernel, self._rung = kernel, 0
        self._reset(configs)
        left_out = f" ({dropped} invalid for this shape left out)" if dropped else ""
        self._say(f"searching {kernel} at {key}: {configs} config(s) on the first rung{left_out}")

    def trial_done(self, trial: Any) -> None:
        if trial.rung != self._rung:
            self.flush()
            self._rung = trial.rung
            self._reset(None)
        self._count += 1
        if trial.status == "ok" and trial.median_ms is not None:
            self._ok += 1
            self._best = trial.median_ms if self._best is None else min(self._best, trial.median_ms)
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=1)
        elif self._count % TRIALS_PER_LINE == 0:
            self._say(f"  {self._kernel} rung {self._rung}: {self._count} trial(s) so far")

    def close(self) -> None:
        self.flush()
        if self._bar is not None:
            self._bar.stop()

    def _reset(self, total: int | None) -> None:
        self._count, self._ok, self._best = 0, 0, None
        if self._bar is not None:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._task = self._bar.add_task(escape(f"{self._kernel} rung {self._rung}"), total=total)

    def flush(self) -> None:
        """One line for the rung that just ended (called too when a kernel is decided, before its result line)."""
        if not self._count:
            return
        best = f", best {self._best:.4f} ms" if self._best is not None else ""
        self._say(f"  {self._kernel} rung {self._rung}: {self._count} trial(s), {self._ok} correct and timed{best}")
        self._count = 0

    def _say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(escape(line), highlight=False)
        else:
            typer.echo(line, err=True)
