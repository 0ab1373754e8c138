"""The submit process: a large POST /sweeps body is parsed, validated, expanded and stored in another process.

A 1 MiB spec (a varlen length list of 340,000 entries) costs 30-60 ms of pydantic-core parsing, tens of ms of JSON
encoding for the store and the answer, and for 10,000 lists a 10,000-row INSERT: C calls that hold the GIL for their
whole length, during which no other request of the server (/healthz) moves. `SubmitPool` runs that work in one
spawned child process (started with the server, `start`; stopped with it, `close`) and gets back only the finished
HTTP answer: the 201's JSON bytes, the validation errors (the parent raises them as `RequestValidationError`, so
the app's handler answers exactly as for an in-process parse), an `HTTPException`'s status and detail, or the
exception the store raised (re-raised in the parent: 503 for an outage, 422 for a value out of range, as in-process).
Bodies under `min_bytes` stay in the server's process (a round trip to the child costs about a millisecond).

Death of the child (kill -9, a crash) never hangs a request: the parent waits on the pipe and the process's
sentinel together, restarts the child and runs the body again on the new one, unless the child had announced its
commit (`COMMITTING`): then the sweep it named is looked up, and its answer is built from the store when the commit
went through. A child that dies twice on one body, or takes more than `timeout_s`, gives 503 with Retry-After.
The child imports no torch until a submit needs the engine's mode list, as the server does; it exits when the
parent's end of the pipe closes (the parent killed too), and ignores SIGINT (the server's Ctrl-C stops it).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
import weakref
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

__all__ = ["COMMITTING", "SubmitPool"]

logger = logging.getLogger(__name__)

COMMITTING = "committing"  # the child's note before its commit: (COMMITTING, sweep id, created_at)
_READY = "ready"
_SCALAR = (str, int, float, bool, type(None))


class WorkerDied(Exception):
    """The child stopped before answering; `committing` is its last note (sweep id, created_at) or None."""

    def __init__(self, committing: tuple[int, Any] | None, timed_out: bool = False) -> None:
        super().__init__("the submit process stopped" if not timed_out else "the submit process timed out")
        self.committing = committing
        self.timed_out = timed_out


def _slim(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validation errors as the app's 422 handler reads them, without echoed containers (a model-level error's
    input is the whole 1 MiB body, which the handler drops anyway): pickled back cheaply."""
    return [{**e, "input": e["input"] if isinstance(e.get("input"), _SCALAR) else ()} if "input" in e else e for e in errors]


def _answer(raw: bytes, sessionmaker: Any, note: Any) -> tuple[Any, ...]:
    """One body's HTTP answer, computed in the child by the route's own function (`routes.sweeps.submit_body`)."""
    from bench_server.api.routes.sweeps import submit_body

    try:
        return ("ok", submit_body(sessionmaker, raw, before_commit=note))
    except RequestValidationError as err:
        return ("invalid", _slim(list(err.errors())))
    except HTTPException as err:
        return ("http", err.status_code, err.detail, err.headers)


def _child(conn: multiprocessing.connection.Connection, url: str, wait_s: float, level: int) -> None:
    """The child's loop: one body in, its answer out, until the parent's end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=level, format="%(asctime)s submit-process %(levelname)s %(name)s: %(message)s")
    from bench_server.api.routes import sweeps  # noqa: F401  (imported before the first body, not during it)
    from db.session import get_sessionmaker

    sessionmaker = get_sessionmaker(url, wait_s=wait_s)
    gc.freeze()
    conn.send((_READY,))
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        gc.disable()  # a spec's 100,000 objects would start full collections; they are freed by reference counting
        try:
            out = _answer(raw, sessionmaker, lambda sweep_id, created: conn.send((COMMITTING, sweep_id, created)))
        except Exception as err:  # the store's errors: re-raised in the parent, whose handlers answer them
            out = ("raise", err)
        finally:
            gc.enable()
        try:
            conn.send(out)
        except OSError:  # the parent is gone
            return
        except Exception as err:  # an answer that does not pickle
            conn.send(("raise", RuntimeError(f"{type(err).__name__}: {err}")))


class SubmitPool:
    """One spawned child that answers large submits (`submit`), one body at a time; `min_bytes`: the smallest
    body sent to it. Thread-safe; `start` is optional (the first `submit` starts the child)."""

    def __init__(self, url: str, *, wait_s: float, min_bytes: int, timeout_s: float = 120.0) -> None:
        self.url = url
        self.wait_s = wait_s
        self.min_bytes = min_bytes
        self.timeout_s = timeout_s
        self.restarts = 0
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._state = threading.Lock()  # guards _proc/_conn
        self._busy = threading.Lock()  # one body at a time on the child
        # per event loop: queued submits wait here, not in a thread
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._closed = False

    def takes(self, raw: bytes) -> bool:
        return len(raw) >= self.min_bytes

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.is_alive() else None

    def start(self) -> None:
        """Start the child unless it runs (a no-op after `close`: the server is stopping)."""
        with self._state:
            if self._closed or (self._proc is not None and self._proc.is_alive()):
                return
            self._stop_locked()
            ctx = multiprocessing.get_context("spawn")
            parent, child = ctx.Pipe()
            level = logging.getLogger().getEffectiveLevel()
            proc = ctx.Process(target=_child, args=(child, self.url, self.wait_s, level), name="cpbench-submit", daemon=True)
            proc.start()
            child.close()  # the child's end lives in the child only: its death reads as EOF here
            self._proc, self._conn = proc, parent
            logger.info("submit process started (pid %s; bodies of %d bytes or more)", proc.pid, self.min_bytes)

    def close(self) -> None:
        """Stop the child for good: its pipe closed (it exits at once when idle), then SIGTERM, then SIGKILL."""
        with self._state:
            self._closed = True
            self._stop_locked()

    def _restart(self) -> None:
        with self._state:
            self._stop_locked()
        self.start()

    def _stop_locked(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            proc.close()

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    async def submit(self, raw: bytes) -> Response:
        """The answer to POST /sweeps with body `raw`: a 201 `Response`, or the exception the route would raise."""
        async with self._lock():
            out = await run_in_threadpool(self._run, raw)
        kind = out[0]
        if kind == "ok":
            return Response(content=out[1], status_code=201, media_type="application/json")
        if kind == "invalid":
            raise RequestValidationError(out[1])
        if kind == "http":
            raise HTTPException(status_code=out[1], detail=out[2], headers=out[3])
        raise out[1]

    def _run(self, raw: bytes) -> tuple[Any, ...]:
        with self._busy:
            for attempt in (1, 2):
                try:
                    return self._roundtrip(raw)
                except WorkerDied as died:
                    self.restarts += 1
                    logger.warning("submit process (attempt %d): %s; restarting it", attempt, died)
                    self._restart()
                    if died.committing is not None and (stored := _stored_answer(self.url, self.wait_s, *died.committing)):
                        return stored
                    if died.timed_out:
                        break
        raise HTTPException(
            status_code=503, detail="the submit process stopped on this body; retry later", headers={"Retry-After": "5"}
        )

    def _roundtrip(self, raw: bytes) -> tuple[Any, ...]:
        self.start()
        with self._state:
            proc, conn = self._proc, self._conn
        if proc is None or conn is None:  # closed: the server is stopping
            raise HTTPException(status_code=503, detail="the server is stopping; retry later", headers={"Retry-After": "5"})
        committing = None
        deadline = time.monotonic() + self.timeout_s
        try:
            conn.send_bytes(raw)
            while True:
                left = deadline - time.monotonic()
                ready = multiprocessing.connection.wait([conn, proc.sentinel], timeout=max(0.0, left))
                if not ready:
                    proc.kill()
                    raise WorkerDied(committing, timed_out=True)
                if conn not in ready:
                    raise WorkerDied(committing)
                msg = conn.recv()
                if msg[0] == COMMITTING:
                    committing = (msg[1], msg[2])
                elif msg[0] != _READY:
                    return msg
        except (EOFError, OSError):
            raise WorkerDied(committing) from None


def _stored_answer(url: str, wait_s: float, sweep_id: int, created_at: Any) -> tuple[Any, ...] | None:
    """The 201 of a sweep whose commit the child announced before dying, when that commit went through."""
    from bench_server.api.routes.sweeps import answer_bytes, sweep_public
    from db import crud
    from db.session import get_sessionmaker

    with get_sessionmaker(url, wait_s=wait_s)() as session:
        sweep = crud.get_sweep(session, sweep_id=sweep_id)
        if sweep is None or sweep.created_at.replace(tzinfo=None) != created_at.replace(tzinfo=None):
            return None  # rolled back (its id may since be another sweep's)
        return ("ok", answer_bytes(sweep_public(session, sweep)))
