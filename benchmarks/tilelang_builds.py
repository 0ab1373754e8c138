"""TileLang builds made ahead of a lab's timing, side by side in spawned processes: one TileLang build is 15-40 s of
one thread's work (TVM's passes, codegen, nvcc), and TileLang's disk cache then serves the timing process. The one
place the labs that time several builds do this (`ag_pass_lab`, `decay_products_lab`, `fwd_walk_lab`,
`reverse_bwd_lab`; `tilelang_code_report` takes the generated code the same way): a job names a kernel module and
the arguments of its `_build`."""

from __future__ import annotations

import importlib
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

# (kernel module, its `_build`'s arguments)
Job = tuple[str, tuple[Any, ...]]
T = TypeVar("T")


def _build_one(job: Job) -> float:
    """`module._build(*args)` in a worker process (it fills TileLang's disk cache); its seconds."""
    module, args = job
    t0 = time.perf_counter()
    importlib.import_module(module)._build(*args)
    return time.perf_counter() - t0


def _source_one(job: Job) -> str:
    """The CUDA TileLang generated for `module._build(*args)`, in a worker process."""
    module, args = job
    return str(importlib.import_module(module)._build(*args).get_kernel_source())


def _side_by_side(fn: Callable[[Job], T], jobs: Sequence[Job], workers: int) -> list[T]:
    """fn of every job, `workers` side by side in spawned processes (no CUDA state shared), in the jobs' order.
    Nothing is started for no jobs; workers below 1 count as one."""
    if not jobs:
        return []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=ctx) as pool:
        return list(pool.map(fn, jobs))


def build_ahead(jobs: Sequence[Job], workers: int) -> list[float]:
    """Every job built, `workers` side by side in spawned processes; each one's seconds, in the jobs' order."""
    return _side_by_side(_build_one, jobs, workers)


def kernel_sources(jobs: Sequence[Job], workers: int) -> list[str]:
    """Every job's generated CUDA (`benchmarks/tilelang_code_report.py`), built side by side as `build_ahead`'s."""
    return _side_by_side(_source_one, jobs, workers)
