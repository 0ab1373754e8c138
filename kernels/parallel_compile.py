"""A call's first launch on a cold Triton cache: compile every kernel its forward and backward will launch at once, in
threads, instead of one after another as the launches reach them.

`compile_ahead(key, dry_run)` runs `dry_run` (the call's launch sequence: `kernels.dispatch.checked_forward` passes
its forward and backward on the call's own tensors) once per `key`. During it every Triton launch of this thread is a
`warmup` (Triton's own path: bind the arguments, compile, do not launch) under Triton 3.6's `AsyncCompileMode`, which
submits each compile to a thread pool and, when the dry run returns, waits for them all and stores each kernel in its
`JITFunction`'s cache under the key the launch computed. The call that follows then finds every kernel compiled: the
same `triton.compile` of the same specialisation, only run in parallel. A worker also builds the kernel's C launcher
(Triton compiles one with gcc per signature at the first launch, about as long as a small kernel's compile).

- Threads: Triton's MLIR passes, LLVM and ptxas (a subprocess) release the GIL; its Python front end (AST to TTIR,
  about a fifth of a compile) does not, and runs one at a time.
- Nothing launches during the dry run and nothing reads device data: its tensors are the call's inputs and the
  uninitialised outputs of launches that did not run. No host sync; the host waits for the compiles only.
- Warm calls: a set lookup on `key` (`kernels.dispatch` builds it from shapes, dtypes and options, not T, so a varlen
  batch of a new length does not run it again). A launch the dry run missed compiles at its launch, as before.
- A dry run that raises (the call itself will raise the same error) or a compile that fails (the launch compiles
  again and raises Triton's error) is dropped: the call then runs exactly as without this module.
- A kernel of another compiler in the call (GDN's TileLang walks) is submitted to the background builds
  (`build_beside`: `kernels.builds.BUILDS`, once per build key) and skips its launch there: the TileLang builds run
  beside each other and the Triton compiles (TVM's passes and nvcc release the GIL for part of their time; two builds
  in two threads took 10.8 s against 14.3 s one after the other on a 2-core host, session 25). The dry run does not
  wait for them: `kernels.first_call` decides, from the keys it asked for (`asking_builds`), whether the call waits
  or runs on Triton meanwhile. Outside a dry run a launch that needs a kernel still building waits for that build.
- Off under TRITON_INTERPRET=1 (interpreted kernels compile nothing), with CPBENCH_PARALLEL_COMPILE=0, with a Triton
  without `triton.runtime._async_compile` (3.6.0 has it), and inside a caller's own AsyncCompileMode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from kernels.builds import BUILDS
from kernels.interpreter import interpreting

__all__ = ["PARALLEL_COMPILE_ENV", "asking_builds", "build_beside", "compile_ahead", "parallel_compile_enabled"]

logger = logging.getLogger(__name__)

PARALLEL_COMPILE_ENV = "CPBENCH_PARALLEL_COMPILE"
MAX_WORKERS = 16  # one per core of the H200 host; a fwd+bwd compiles 7-8 kernels

# set only inside compile_ahead's dry run, in its own thread: that thread's launches compile and do not run
_DRY_RUN: ContextVar[bool] = ContextVar("kernels_compile_ahead_dry_run", default=False)
# a set receiving the build keys `build_beside` is asked for in a dry run (`asking_builds`)
_ASKED: ContextVar[set[Hashable] | None] = ContextVar("kernels_builds_asked", default=None)


class _Patch:
    """JITFunction.run wrapped while a dry run is under way (counted: dry runs of several threads may overlap)."""

    lock = threading.Lock()
    users = 0
    orig_run: Callable[..., Any] | None = None
    done: set[Hashable] = set()  # the keys whose dry run ran (or was tried)


def parallel_compile_enabled() -> bool:
    """True unless TRITON_INTERPRET=1 or CPBENCH_PARALLEL_COMPILE is 0 / false / no."""
    flag = os.environ.get(PARALLEL_COMPILE_ENV, "1").strip().lower()
    return flag not in ("0", "false", "no") and not interpreting()


def build_beside(key: Hashable, build: Callable[..., object], *args: Any) -> bool:
    """In `compile_ahead`'s dry run (this thread): submit `build(*args)` (a kernel of another compiler, GDN's TileLang
    walks) to the background builds once per `key` (`kernels.builds.BUILDS`; the dry run does not wait for it), note
    `key` in the set of `asking_builds` where one is open, and return True: the caller then does not launch. Outside a
    dry run: wait for `key`'s build if one is running and return False (the caller builds, a cache hit once built,
    and launches as usual)."""
    if not _DRY_RUN.get():
        BUILDS.settle(key)
        return False
    asked = _ASKED.get()
    if asked is not None:
        asked.add(key)
    BUILDS.submit(key, build, *args)
    return True


@contextlib.contextmanager
def asking_builds() -> Iterator[set[Hashable]]:
    """A set that receives the build keys `build_beside` is asked for in this context while inside (a dry run's
    launches of one plan: `kernels.first_call`)."""
    asked: set[Hashable] = set()
    token = _ASKED.set(asked)
    try:
        yield asked
    finally:
        _ASKED.reset(token)


def compile_ahead(key: Hashable, dry_run: Callable[[], object]) -> bool:
    """Compile, in parallel, every Triton kernel `dry_run` launches, once per `key` (module docstring); True when it
    ran `dry_run`. Cheap when `key` was seen: one set lookup."""
    if key in _Patch.done or not parallel_compile_enabled():
        return False
    _Patch.done.add(key)
    try:
        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:  # a Triton without async compile (3.6 has it): every kernel compiles at its launch
        return False
    if active_mode.get() is not None:  # the caller's own AsyncCompileMode: leave its compiles to it
        return False
    workers = max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
    with _launches_compile_only(), _CompilePool(workers) as pool:
        mode = AsyncCompileMode(pool, ignore_errors=True)
        with mode:
            token = _DRY_RUN.set(True)
            try:
                dry_run()
            except Exception as err:  # the call itself raises it (or, if the dry run alone failed, runs as before)
                logger.debug("compile_ahead: dry run of %r failed (%s); the call compiles as it launches", key, err)
            finally:
                _DRY_RUN.reset(token)
        logger.debug("compile_ahead: %d kernels compiled for %r", len(mode.future_kernels), key)
    return True


@contextlib.contextmanager
def _launches_compile_only() -> Iterator[None]:
    """While inside, a launch from a thread in a dry run is a `warmup` (compile, no launch); other threads unchanged."""
    from triton.runtime.jit import JITFunction

    with _Patch.lock:
        if _Patch.users == 0:
            orig = JITFunction.run
            _Patch.orig_run = orig

            def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
                return orig(self, *args, grid=grid, warmup=warmup or _DRY_RUN.get(), **kwargs)

            JITFunction.run = run  # type: ignore[method-assign]
        _Patch.users += 1
    try:
        yield
    finally:
        with _Patch.lock:
            _Patch.users -= 1
            if _Patch.users == 0:
                JITFunction.run = _Patch.orig_run  # type: ignore[method-assign]


class _CompilePool(ThreadPoolExecutor):
    """The AsyncCompileMode executor: each job compiles a kernel, then builds its C launcher into the file cache."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(_compile_and_launcher, fn, *args, **kwargs)


def _compile_and_launcher(compile_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    kernel = compile_fn(*args, **kwargs)
    try:
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)  # cached by source: the first launch loads it
    except Exception as err:  # the first launch builds it again and raises Triton's own error
        logger.debug("compile_ahead: launcher of %s not built here (%s)", kernel.name, err)
    return kernel
