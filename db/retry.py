"""Riding out a store outage: which errors are transient, and a retry loop with capped exponential backoff.

Transient: the connection was lost or refused, the server is shutting down or starting up, SQLite's write lock
was held past the busy timeout ("database is locked"), a serialization failure or deadlock (SQLSTATE 40001,
40P01). Anything else (a missing table, a constraint, a bug) is raised at once.

`StoreRetry` is shared by the threads of one worker: the outage is logged once when it starts and once when the
store answers again, however many calls wait on it meanwhile.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

__all__ = ["StoreRetry", "StoreUnavailable", "is_transient"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_TEXT = (
    "database is locked", "database is busy", "connection", "server closed", "terminating connection",
    "could not serialize", "deadlock detected", "shutting down", "starting up", "could not connect", "timeout expired",
    "no route to host", "broken pipe", "ssl syscall", "consuming input failed", "the database system is",
)
_PERMANENT_TEXT = ("no such table", "no such column", "does not exist", "syntax error", "unique constraint",
                   "violates", "readonly database", "disk i/o error")


def is_transient(err: BaseException) -> bool:
    """True for a store error that may go away by itself (see the module docstring)."""
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return True
    if isinstance(err, (sa_exc.DisconnectionError, sa_exc.TimeoutError)):
        return True
    if isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        code = getattr(getattr(err, "orig", None), "sqlstate", None)
        if code in ("40001", "40P01") or (code or "").startswith("08") or (code or "").startswith("57P"):
            return True
        text = str(err.orig if err.orig is not None else err).lower()
        if any(t in text for t in _PERMANENT_TEXT):
            return False
        return any(t in text for t in _TRANSIENT_TEXT) or code is None
    return False


class StoreUnavailable(RuntimeError):
    """The store stayed unavailable and the caller gave up waiting (its `give_up` said so)."""


class StoreRetry:
    """Retry store calls through transient errors with capped, jittered exponential backoff (thread-safe)."""

    def __init__(self, *, who: str, max_delay_s: float = 30.0, base_delay_s: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.who, self.max_delay_s, self.base_delay_s, self._sleep = who, max_delay_s, base_delay_s, sleep
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.outages = 0
        self.longest_outage_s = 0.0

    def _down(self, what: str, err: BaseException) -> None:
        with self._lock:
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.outages += 1
                first = str(getattr(err, "orig", None) or err).strip().splitlines()[:1]
                logger.warning("%s: store unavailable (%s: %s); retrying with backoff", self.who, what, first[0] if first else err)

    def _up(self) -> None:
        with self._lock:
            if self.down_since is not None:
                took = time.monotonic() - self.down_since
                self.longest_outage_s = max(self.longest_outage_s, took)
                self.down_since = None
                logger.warning("%s: store available again after %.1f s", self.who, took)

    def call(self, what: str, fn: Callable[[], T], *, give_up: Callable[[], bool] | None = None) -> T:
        """`fn()` once it succeeds; transient errors wait and retry, others raise. `give_up()` True: StoreUnavailable."""
        attempt = 0
        while True:
            try:
                value = fn()
            except Exception as err:
                if not is_transient(err):
                    raise
                self._down(what, err)
                if give_up is not None and give_up():
                    raise StoreUnavailable(f"{what}: the store is unavailable") from err
                delay = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt, 30))
                attempt += 1
                self._sleep(delay * (0.5 + random.random() / 2))
                continue
            self._up()
            return value

    def attempt(self, what: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """`fn()` once: (True, value), or (False, None) after a transient error (recorded as an outage)."""
        try:
            value = fn()
        except Exception as err:
            if not is_transient(err):
                raise
            self._down(what, err)
            return False, None
        self._up()
        return True, value
