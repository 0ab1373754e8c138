"""Triton on a machine (or a run) without a GPU: the verbs that run kernels turn the Triton interpreter on themselves.

Triton reads TRITON_INTERPRET when the kernels are decorated, i.e. when `kernels` is imported, so this runs in
`runners.cli.main` before any verb: for `run`, `worker`, `tune`, `regress` and `serve --demo`, when the variable is
unset and Triton is not imported yet, it is set to 1 if the verb runs on the CPU (`--cpu`, `--device cpu`) or no
CUDA device is present. The rank processes a worker spawns inherit it. A process that runs points without it (the
Python API on a machine without a GPU) does not offer the triton backend (`runners.grid.available_backends`), so
those points are stored as skipped with the reason instead of failing inside Triton.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence

__all__ = ["KERNEL_VERBS", "use_interpreter_if_cpu", "verb_of"]

logger = logging.getLogger(__name__)

KERNEL_VERBS = ("run", "worker", "tune", "regress", "serve")


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb of a `cpbench` command line (the first word that is not a global option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _cpu_only(argv: Sequence[str]) -> bool:
    args = list(argv)
    if "--cpu" in args or "--device=cpu" in args:
        return True
    return any(a == "--device" and i + 1 < len(args) and args[i + 1] == "cpu" for i, a in enumerate(args))


def _triton_imported() -> bool:
    return "triton" in sys.modules


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def use_interpreter_if_cpu(argv: Sequence[str], *, cuda_available: Callable[[], bool] = _cuda_available) -> bool:
    """Set TRITON_INTERPRET=1 when this command will run Triton kernels on the CPU (see the module doc); returns
    whether it set it. Leaves a value the user set, and does nothing once Triton is imported."""
    verb = verb_of(argv)
    if verb not in KERNEL_VERBS or (verb == "serve" and "--demo" not in argv):
        return False
    if "TRITON_INTERPRET" in os.environ or _triton_imported() or "--help" in argv:
        return False
    if not (_cpu_only(argv) or not cuda_available()):
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    logger.info("no GPU for this run: Triton kernels run in the interpreter (TRITON_INTERPRET=1)")
    return True
