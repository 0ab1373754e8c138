"""What the default log leaves out: lines a user cannot act on. `-v` (INFO) and `-vv` (DEBUG) keep everything.

`quiet(verbose)` runs in the CLI's root callback, before any verb starts rank processes (which inherit the
environment): Alembic's INFO lines ("Context impl ...", "Will assume ...") are held to WARNING; Kineto's
`USDT ... profiler_start/stop` lines, two per rank per profiled point, are turned off (KINETO_LOG_LEVEL above its
highest level); torch's FutureWarning that `all_gather_into_tensor` is deprecated, raised on every call, is ignored
(PYTHONWARNINGS for the ranks, a filter here). A value the user set for either variable is kept. Under the
Triton interpreter (TRITON_INTERPRET=1, the CPU runs), numpy's "overflow encountered" RuntimeWarnings are ignored
too: the interpreter evaluates every lane of a block in numpy, masked-off padding lanes included (e.g. `exp` of a
gate difference past a sequence's end), and those lanes are never stored; a value that reached an output would not
be finite and fail the correctness gate (the points) or disqualify the trial (the tuner), so the warning says
nothing a user can act on.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["ALL_GATHER_WARNING", "KINETO_SILENT", "NUMPY_OVERFLOW", "quiet"]

KINETO_SILENT = "6"  # Kineto's levels run VERBOSE=0 ... USDT=5: 6 prints none of them
ALL_GATHER_WARNING = "`torch.distributed.all_gather_into_tensor` is deprecated"
NUMPY_OVERFLOW = "overflow encountered"  # numpy's RuntimeWarning on the interpreter's masked-off lanes
QUIET_LOGGERS = ("alembic",)


def quiet(verbose: int) -> None:
    """Keep the default log to what a user can act on (see the module doc); does nothing at -v or -vv."""
    if verbose:
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if "PYTHONWARNINGS" not in os.environ:
        ignored = [f"ignore:{ALL_GATHER_WARNING}:FutureWarning"]
        ignored += [f"ignore:{NUMPY_OVERFLOW}:RuntimeWarning"] if interpreted else []
        os.environ["PYTHONWARNINGS"] = ",".join(ignored)
    warnings.filterwarnings("ignore", message=f".*{ALL_GATHER_WARNING}", category=FutureWarning)
    if interpreted:
        warnings.filterwarnings("ignore", message=NUMPY_OVERFLOW, category=RuntimeWarning)
