"""`create_app()`: assembles the cpbench service; it does no work of its own.

    uvicorn --factory bench_server.main:create_app      (or `cpbench serve`)

- refuses to start on a store that is not migrated (`db.migrate.require_migrated` raises
  `StoreNotMigratedError`, whose message says to run `cpbench db upgrade`);
- settles the API token (`core.security.ensure_api_token`: environment, token file, or generated and logged once);
- mounts the REST API under /api/v1 (operation ids "<tag>-<name>"), its Swagger UI at /docs (served from the
  installed swagger-ui-bundle-v2 package, no CDN), /healthz, the dashboard pages and plotly.js at /static/plotly.min.js;
- request bodies over CPBENCH_MAX_BODY_BYTES get 413, and so does a spec whose grid passes the points limit;
- every bad input to the API is a 4xx whose body is valid JSON (a dashboard page answers HTML; non-finite
  numbers in a 422 are echoed as text, a lone surrogate as its escape; a value the store's column cannot hold is
  422, not 500); a query parameter a route does not declare is 422 on /api/v1 and /healthz
  (`api.deps.reject_unknown_query`); a NUL in the URL is 422 and every response carries the security headers
  (`core.hardening`);
- a POST /sweeps body of CPBENCH_SUBMIT_POOL_BYTES or more is validated and stored in the submit process
  (`core.submit_pool.SubmitPool`, `app.state.submit_pool`), started and stopped by the app's lifespan (or started by
  the first such body when the server runs without one);
- while the store is unavailable (down, unreachable, or an SQLite write lock held past CPBENCH_STORE_WAIT_S) every
  route that needs it answers 503 JSON with `Retry-After`, and `/healthz` says "store unavailable" and nothing more
  (the error goes to the server log).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from bench_server import docs, pages
from bench_server.api.deps import reject_unknown_query
from bench_server.api.router import api_router
from bench_server.api.routes.sweeps import SPEC_SCHEMA
from bench_server.core.config import API_V1_STR, ServerSettings, get_settings
from bench_server.core.hardening import HardeningMiddleware
from bench_server.core.limits import BodySizeLimitMiddleware
from bench_server.core.security import ensure_api_token
from bench_server.core.submit_pool import SubmitPool
from bench_server.schemas import Health, SweepCreate
from db import crud
from db.migrate import require_migrated, safe_url
from db.session import get_sessionmaker
from runners.settings import get_worker_settings
from runners.versions import cpbench_version

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # what a 503 asks the client to wait: about a store restart's time, or a held lock's
STORE_UNAVAILABLE = {"detail": "store unavailable; retry later"}
_OUTAGES = (OperationalError, InterfaceError, PoolTimeoutError)  # the store is down, unreachable or locked


def custom_generate_unique_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def _json_safe(value: Any) -> Any:
    """`value` with every non-finite float as its text and every string that UTF-8 cannot encode (a lone surrogate,
    which JSON text may carry) with its escape, so that the answer is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _error_entry(e: dict[str, Any]) -> dict[str, Any]:
    out = {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")}
    got = e.get("input")
    if got is None or isinstance(got, (str, int, float, bool)):  # a whole echoed body is noise (and may be 1 MiB)
        out["input"] = got[:200] if isinstance(got, str) else got
    if e.get("ctx"):
        out["ctx"] = {k: (v if isinstance(v, (int, float, bool, type(None))) else str(v)) for k, v in e["ctx"].items()}
    return _json_safe(jsonable_encoder(out))


async def _validation_error(request: Request, exc: RequestValidationError) -> Any:
    """422 naming the fields; a grid over the points limit (the spec's own check) is 413 instead."""
    errors = exc.errors()
    if any(e.get("type") == "limit" and tuple(e.get("loc", ())) == ("body",) for e in errors):
        return JSONResponse(status_code=413, content={"detail": "; ".join(e["msg"] for e in errors)})
    return JSONResponse(status_code=422, content={"detail": [_error_entry(e) for e in errors]})


async def _data_error(request: Request, exc: DataError) -> Any:
    """A value the store's column cannot hold (out of its range, a NUL...) is the client's error, not the server's."""
    logger.info("refused a value the store cannot hold: %s", str(exc.orig).splitlines()[0] if exc.orig else exc)
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "msg": "a value is out of the range the store can hold",
                                                              "type": "store_range"}]})


async def _store_unavailable(request: Request, exc: Exception) -> Any:
    """A store outage is the server's temporary state, not a bug: 503 JSON with Retry-After, the error in the log."""
    logger.warning("store unavailable for %s %s: %s", request.method, request.url.path,
                   str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return JSONResponse(status_code=503, content=STORE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_S)})


async def _unencodable(request: Request, exc: UnicodeEncodeError) -> Any:
    """A string the store cannot encode (a lone surrogate in a body) is the client's error."""
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["body"], "type": "unicode",
                                                              "msg": "a string is not valid Unicode (a lone surrogate)"}]})


async def _overflow(request: Request, exc: OverflowError) -> Any:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["query"], "msg": "a number is out of range",
                                                              "type": "range"}]})


def _ping(request: Request) -> None:
    with request.app.state.sessionmaker() as session:
        crud.ping(session)


class StorePing:
    """/healthz's check of the store. SQLite: `SELECT 1` (no lock, no page read: microseconds) on a connection kept
    for it, on the event loop, so a kept-alive /healthz makes no hop to the thread pool (on a busy host the hop's two
    thread switches were most of its time); the connection is opened in the thread pool and dropped when a ping
    fails. PostgreSQL (a network round trip, a connect that may wait): one hop, a session opened and closed there."""

    def __init__(self, url: str) -> None:
        self.inline = url.startswith("sqlite")
        self.conn: Connection | None = None

    async def __call__(self, request: Request) -> None:
        if not self.inline:
            await run_in_threadpool(_ping, request)
            return
        if self.conn is None:
            conn = await run_in_threadpool(request.app.state.sessionmaker.kw["bind"].connect)
            if self.conn is None:
                self.conn = conn
            else:  # another /healthz opened one meanwhile
                await run_in_threadpool(conn.close)
        conn = self.conn
        try:
            crud.ping(conn)
            conn.rollback()
        except Exception:
            self.conn = None
            await run_in_threadpool(conn.close)
            raise

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


async def _health(request: Request) -> Any:
    """The store checked by `StorePing` (no thread hop on SQLite; one, not three, on PostgreSQL)."""
    try:
        await request.app.state.store_ping(request)
        db = "ok"
    except Exception:  # the endpoint's job is to report, not to raise; the details stay in the server log
        logger.warning("healthz: the store is unavailable", exc_info=True)
        db = "store unavailable"
    body = {"status": "ok" if db == "ok" else "degraded", "db": db, "version": request.app.version}
    if db == "ok":
        return JSONResponse(status_code=200, content=body)
    return JSONResponse(status_code=503, content=body, headers={"Retry-After": str(RETRY_AFTER_S)})


def _description(settings: ServerSettings) -> str:
    reads = ("Reads (GET) are open: the token is optional (it shows workers' host and pid), unless the server runs "
             "with CPBENCH_READS_OPEN=false." if settings.READS_OPEN else
             "Reads (GET) need the token too: this server runs with CPBENCH_READS_OPEN=false.")
    return (f"Writes (POST) need the API token as `Authorization: Bearer <token>`. {reads} "
            f"A sweep's grid may hold at most {get_worker_settings().MAX_POINTS_PER_SWEEP} points "
            f"(CPBENCH_MAX_POINTS_PER_SWEEP; larger: 413), a body at most {settings.MAX_BODY_BYTES} bytes "
            "(CPBENCH_MAX_BODY_BYTES; larger: 413). Unknown query parameters and invalid values are 422; while the "
            "store is unavailable, 503 with Retry-After.")


def _openapi(app: FastAPI, reads_open: bool) -> Callable[[], dict[str, Any]]:
    """The generated schema, with the token optional on reads when they are open (`security: [{bearer}, {}]`)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                                 description=app.description, routes=app.routes)
            spec = SweepCreate.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(spec.pop("$defs", {}))
            components[SPEC_SCHEMA] = spec  # the body of POST /sweeps, validated off the event loop (`submit_body`)
            for path_item in schema.get("paths", {}).values():
                get = path_item.get("get")
                if reads_open and get is not None and get.get("security"):
                    get["security"] = [*get["security"], {}]
            app.openapi_schema = schema
        return app.openapi_schema

    return build


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The submit process starts with the server (its imports done before the first large body) and stops with it."""
    pool: SubmitPool | None = app.state.submit_pool
    if pool is not None:
        pool.start()
    try:
        yield
    finally:
        if pool is not None:
            await run_in_threadpool(pool.close)
        await run_in_threadpool(app.state.store_ping.close)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The app for `settings` (default: from the environment)."""
    settings = settings or get_settings()
    require_migrated(settings.DATABASE_URL)
    token = ensure_api_token(settings)
    app = FastAPI(
        title="cpbench",
        version=cpbench_version(),
        summary="Benchmarks and autotuning of context-parallel delta-rule attention kernels (GDN, KDA)",
        description=_description(settings),
        openapi_url=f"{API_V1_STR}/openapi.json",
        docs_url=None,  # served by bench_server.docs from local files, not FastAPI's CDN page
        redoc_url=None,
        generate_unique_id_function=custom_generate_unique_id,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.openapi = _openapi(app, settings.READS_OPEN)  # type: ignore[method-assign]
    app.state.sessionmaker = get_sessionmaker(settings.DATABASE_URL, wait_s=settings.STORE_WAIT_S)
    app.state.api_token = token.token
    app.state.token_source = token.source
    app.state.store_ping = StorePing(settings.DATABASE_URL)
    app.state.read_threads = 2 if settings.DATABASE_URL.startswith("sqlite") else 8  # api.deps.run_in_session
    app.state.submit_pool = (SubmitPool(settings.DATABASE_URL, wait_s=settings.STORE_WAIT_S, min_bytes=settings.SUBMIT_POOL_BYTES)
                             if settings.SUBMIT_POOL else None)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.MAX_BODY_BYTES)
    app.add_middleware(HardeningMiddleware)  # outermost: its headers go on every answer, the 413 included
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(DataError)(_data_error)
    app.exception_handler(OverflowError)(_overflow)
    app.exception_handler(UnicodeEncodeError)(_unencodable)
    for outage in _OUTAGES:
        app.exception_handler(outage)(_store_unavailable)
    app.include_router(api_router, prefix=API_V1_STR)
    app.add_api_route("/healthz", _health, methods=["GET"], response_model=Health, tags=["health"], name="healthz",
                      summary="Liveness of the server and its database", responses={503: {"model": Health}},
                      dependencies=[Depends(reject_unknown_query)])
    app.include_router(docs.router)
    app.include_router(pages.static_router)
    app.include_router(pages.router)
    logger.info("cpbench app on %s (token from %s, reads %s)", safe_url(settings.DATABASE_URL), token.source,
                "open" if settings.READS_OPEN else "need the token")
    return app
