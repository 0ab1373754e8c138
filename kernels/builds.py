"""Kernels of another compiler (GDN's TileLang walks) built in background threads, one build per build key, so that a
call need not wait for them: while a build runs, the calls whose "auto" choices would take its kernel run on Triton
(`kernels.first_call`), and once it is built the next calls take it. Standard library only.

    TILELANG_BUILD_ENV    CPBENCH_TILELANG_BUILD: "background" (the default) or "wait" (`build_mode`; ENVIRONMENT.md);
                          `first_call_note(mode)`: what a benchmark's first-call figure holds under it
    BUILDS                the process's registry (`BuildRegistry`): `submit(key, build, *args)` once per key (later
                          submits of the key are no-ops), `built` (the keys built), `failed(key)`, `settle(key)`, `wait(keys, timeout)`
    wait_for_builds       (public: `kernels.wait_for_builds(timeout=None)`) wait for every build submitted so far;
                          True when none is still running. Benchmarks call it after their first call, before timing

- A build runs `build(*args)` in one of `MAX_BUILD_WORKERS` threads (TVM's passes and nvcc release the GIL for part of
  their time; their Python parts hold it, so a short step's host time may grow while a build runs). `build` caches
  its kernel itself (`functools.cache`): the launch that follows builds nothing.
- A build that raises is logged once (a warning, one line: the key's kernel and the error's first line), stays failed
  for the process (`failed(key)`; never retried, so a call that chose it on "auto" stays on Triton) and never
  raises here; a launch that asks for the kernel explicitly builds it again and raises TileLang's own error there.
- "wait" makes a first call wait for the builds it asked for (the kernels the same from the first step: the numbers do
  not change between steps as the plan switches), as before session 28.
- A process that exits while a build runs waits for it (the executor's threads are joined at exit); the kernel is
  then in TileLang's cache on disk for the next process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Set
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

__all__ = ["BUILDS", "MAX_BUILD_WORKERS", "TILELANG_BUILD_ENV", "TILELANG_BUILD_MODES", "BuildRegistry", "build_mode",
           "first_call_note", "wait_for_builds"]  # fmt: skip

logger = logging.getLogger(__name__)

TILELANG_BUILD_ENV = "CPBENCH_TILELANG_BUILD"
# how a first call treats the TileLang kernels its "auto" choices take and that are not built yet (the default first):
# run on Triton while they build in the background, or wait for them
TILELANG_BUILD_MODES: tuple[str, ...] = ("background", "wait")
MAX_BUILD_WORKERS = 4  # a GDN step builds two or three kernels (forward walk, reverse walk; the Ag pass when asked)


def build_mode() -> str:
    """CPBENCH_TILELANG_BUILD, read at each call's first dry run: one of TILELANG_BUILD_MODES (unset or empty: the
    first); a ValueError listing them otherwise."""
    mode = os.environ.get(TILELANG_BUILD_ENV, "").strip().lower() or TILELANG_BUILD_MODES[0]
    if mode not in TILELANG_BUILD_MODES:
        raise ValueError(f"{TILELANG_BUILD_ENV} must be one of {', '.join(TILELANG_BUILD_MODES)}, got {mode!r}")
    return mode


def first_call_note(mode: str) -> str:
    """What our first call's figure holds under the build mode `mode` (a benchmark report's words)."""
    if mode == "wait":
        return f"ours waits for its TileLang builds ({TILELANG_BUILD_ENV}=wait)"
    return (f"ours on Triton while its TileLang kernels build, not waited for ({TILELANG_BUILD_ENV}={mode}; "
            "timed calls wait for them)")  # fmt: skip


class BuildRegistry:
    """Builds by key in background threads (module docstring): each key built once, its outcome kept."""

    def __init__(self, workers: int = MAX_BUILD_WORKERS) -> None:
        self._workers = workers
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # started at the first submit
        self._futures: dict[Hashable, Future[None]] = {}
        self._ready: set[Hashable] = set()
        self._failed: dict[Hashable, str] = {}

    def submit(self, key: Hashable, build: Callable[..., object], *args: Any) -> bool:
        """Start `build(*args)` in the background unless `key` was submitted before; True when this call started it."""
        with self._lock:
            if key in self._futures:
                return False
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="cpbench-build")
            self._futures[key] = self._pool.submit(self._run, key, build, *args)
        return True

    def _run(self, key: Hashable, build: Callable[..., object], *args: Any) -> None:
        try:
            build(*args)
        except Exception as err:  # logged once, kept: the calls that chose it on "auto" stay on Triton
            lines = str(err).strip().splitlines()
            reason = f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
            self._failed[key] = reason
            logger.warning("the background build of %s failed (%s); calls that chose it on 'auto' stay on Triton",
                           _name(key), reason)  # fmt: skip
            return
        self._ready.add(key)

    def ready(self, key: Hashable) -> bool:
        """Whether `key`'s build finished without error."""
        return key in self._ready

    @property
    def built(self) -> Set[Hashable]:
        """The keys whose build finished without error (the live set, read-only: `needs <= BUILDS.built`)."""
        return self._ready

    def failed(self, key: Hashable) -> str | None:
        """Why `key`'s build failed (one line), or None (not submitted, running or built)."""
        return self._failed.get(key)

    def settle(self, key: Hashable) -> None:
        """Wait for `key`'s build if one is running (a launch that needs the kernel now); no-op otherwise."""
        fut = self._futures.get(key)
        if fut is not None and key not in self._ready and key not in self._failed:
            wait_futures([fut])

    def wait(self, keys: Iterable[Hashable] | None = None, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: no limit) for the builds of `keys` (None: every build submitted so far);
        True when none of them is still running (built or failed)."""
        with self._lock:
            futures = list(self._futures.values()) if keys is None else [self._futures[k] for k in keys
                                                                         if k in self._futures]  # fmt: skip
        return not wait_futures(futures, timeout=timeout).not_done


def _name(key: Hashable) -> str:
    """A build key's kernel for the log line: its first item where it is a tuple (`("fwd_walk", *build)`)."""
    return str(key[0]) if isinstance(key, tuple) and key else repr(key)


BUILDS = BuildRegistry()


def wait_for_builds(timeout: float | None = None) -> bool:
    """Wait for the TileLang kernels building in the background (up to `timeout` seconds; None: no limit); True when
    none is still building. After it, calls whose "auto" choices take those kernels run them (a benchmark calls it
    after its first call and before it times, so that it never times a mix of Triton and TileLang steps).

    Examples::

        import kernels
        o, _ = kernels.chunk_gdn(q, k, v, g, beta)   # first call: Triton while TileLang's walks build
        kernels.wait_for_builds()                    # the walks built (or failed: logged once, Triton stays)
    """
    return BUILDS.wait(timeout=timeout)
