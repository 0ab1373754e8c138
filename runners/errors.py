"""User-facing errors of the engine: `CpbenchError` and its subclasses.

The CLI (`runners.cli.main`) turns any `CpbenchError` into one red line and exit status 1; anything else is a
bug and keeps its traceback. Errors of one grid point (a failed correctness gate, a crashed rank) are not
raised to the user: the worker stores them on the point (`failed`, with the text) and carries on.
"""

from __future__ import annotations

__all__ = [
    "CorrectnessError",
    "CpbenchError",
    "GangError",
    "SpecError",
    "SweepNotFoundError",
]


class CpbenchError(Exception):
    """A mistake the user can fix (bad spec, unknown sweep, missing device); shown as one line, exit 1."""


class SpecError(CpbenchError):
    """An invalid sweep spec. The message names the field (`axes.T.0: ...`) and the value received."""


class SweepNotFoundError(CpbenchError):
    """No sweep with the given id in the store."""


class GangError(CpbenchError):
    """A rank gang failed a job: a rank crashed, timed out, or the ranks disagreed. `restarted` says whether
    the gang was torn down (it is started again on its next use)."""

    def __init__(self, message: str, *, restarted: bool = False, retryable: bool = True) -> None:
        super().__init__(message)
        self.restarted = restarted
        self.retryable = retryable


class CorrectnessError(CpbenchError):
    """A point's output is further from `none` or from the reference than its tolerance: it is not timed."""
