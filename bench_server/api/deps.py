"""Dependencies of the routes, as `Annotated` aliases: a database session, the settings, and the token checks.

`require_token` guards every write: no `Authorization: Bearer` header → 401 (with `WWW-Authenticate: Bearer`), a
wrong token → 403. `require_read` does the same for reads only when `CPBENCH_READS_OPEN` is false; `is_trusted`
says whether a caller presented the right token (what anonymous readers may not see, e.g. worker host and pid).
`reject_unknown_query` (a dependency of every API route and /healthz) answers 422 to a query parameter the route
does not declare, instead of ignoring it (`?direction=fwd` on a route without that filter would otherwise return
every row).

The checks are `async def`: pure CPU work of microseconds, run on the event loop, where a plain `def` would cost each
request a hop to the thread pool and back (about 0.1-0.2 ms of CPU each, and a wait for the GIL under load). For the
same reason the hot read routes (/results, a sweep) are `async def` and make one hop, `run_in_session`, where the
`SessionDep` dependency and a sync route make three (the session's start, the route, the session's end). Those hops
run at most `app.state.read_threads` at a time (2 on SQLite, whose reads are CPU work under the GIL; 8 on
PostgreSQL, whose reads wait on the network; the others wait on the event loop): 20 clients' reads in 20 threads
spent their CPU passing the GIL around (/results under 20 clients on the 2-core VM, three runs each: 245-290 ->
356-417 req/s, p99 167-203 -> 93-121 ms, 3.4-4.0 -> 2.3-2.4 ms of CPU per request).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request, status
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from bench_server.core.config import ServerSettings
from bench_server.core.security import verify_token

__all__ = ["SessionDep", "bearer", "SettingsDep", "get_db", "get_settings_dep", "is_trusted", "reject_unknown_query",
           "require_read", "require_token", "run_in_session"]

bearer = _bearer = HTTPBearer(auto_error=False, description="The API token (CPBENCH_API_TOKEN, or the one generated at first start)")


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessionmaker() as session:
        yield session


R = TypeVar("R")


_READ_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def _read_slots(threads: int) -> asyncio.Semaphore:
    """The running event loop's `threads` slots for `run_in_session`."""
    slots = _READ_SLOTS.setdefault(asyncio.get_running_loop(), {})
    if threads not in slots:
        slots[threads] = asyncio.Semaphore(threads)
    return slots[threads]


async def run_in_session(request: Request, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """`fn(session, *args, **kwargs)` in the thread pool, at most `app.state.read_threads` at a time, with a session
    opened and closed there: one hop."""

    def call() -> R:
        with request.app.state.sessionmaker() as session:
            return fn(session, *args, **kwargs)

    async with _read_slots(request.app.state.read_threads):
        return await run_in_threadpool(call)


async def get_settings_dep(request: Request) -> ServerSettings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings_dep)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    if credentials is None:
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Not authenticated: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    if not verify_token(credentials.credentials, request.app.state.api_token):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="Invalid token")


async def require_token(request: Request, credentials: Credentials) -> None:
    """Writes: a valid bearer token or 401/403."""
    _check(request, credentials)


async def require_read(request: Request, credentials: Credentials) -> None:
    """Reads: open by default; with CPBENCH_READS_OPEN=false, as for writes."""
    if not request.app.state.settings.READS_OPEN:
        _check(request, credentials)


def is_trusted(request: Request, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """The caller presented the API token (whatever the read policy)."""
    return credentials is not None and verify_token(credentials.credentials, request.app.state.api_token)


def _query_names(dependant: Dependant) -> frozenset[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


def _allowed_query(route: object) -> frozenset[str]:
    """The query parameters `route` declares (kept on the route: it is not hashable)."""
    allowed = getattr(route, "_cpbench_query_names", None)
    if allowed is None:
        dependant = getattr(route, "dependant", None)
        allowed = _query_names(dependant) if dependant is not None else frozenset()
        if route is not None:
            route._cpbench_query_names = allowed  # type: ignore[attr-defined]
    return allowed


async def reject_unknown_query(request: Request) -> None:
    """422 naming each query parameter the matched route does not declare, and the ones it does."""
    allowed = _allowed_query(request.scope.get("route"))
    unknown = [name for name in dict.fromkeys(request.query_params.keys()) if name not in allowed]
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise RequestValidationError([
            {"type": "extra_forbidden", "loc": ("query", name), "input": request.query_params[name],
             "msg": f"unknown query parameter {name!r}; this route takes: {known}"}
            for name in unknown
        ])
