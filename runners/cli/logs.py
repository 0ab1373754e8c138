"""What the default log leaves out: lines a user cannot act on. `-v` (INFO) and `-vv` (DEBUG) keep everything.

`quiet(verbose)` runs in the CLI's root callback, before any verb starts rank processes (which inherit the
environment): Alembic's INFO lines ("Context impl ...", "Will assume ...") are held to WARNING; Kineto's
`USDT ... profiler_start/stop` lines, two per rank per profiled point, are turned off (KINETO_LOG_LEVEL above its
highest level); torch's FutureWarning that `all_gather_into_tensor` is deprecated, raised on every call, is ignored
(PYTHONWARNINGS for the ranks, a filter here). A value the user set for either variable is kept.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["ALL_GATHER_WARNING", "KINETO_SILENT", "quiet"]

KINETO_SILENT = "6"  # Kineto's levels run VERBOSE=0 ... USDT=5: 6 prints none of them
ALL_GATHER_WARNING = "`torch.distributed.all_gather_into_tensor` is deprecated"
QUIET_LOGGERS = ("alembic",)


def quiet(verbose: int) -> None:
    """Keep the default log to what a user can act on (see the module doc); does nothing at -v or -vv."""
    if verbose:
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)
    if "PYTHONWARNINGS" not in os.environ:
        os.environ["PYTHONWARNINGS"] = f"ignore:{ALL_GATHER_WARNING}:FutureWarning"
    warnings.filterwarnings("ignore", message=f".*{ALL_GATHER_WARNING}", category=FutureWarning)
