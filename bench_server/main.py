"""`create_app()`: assembles the cpbench service; it does no work of its own.

    uvicorn --factory bench_server.main:create_app      (or `cpbench serve`)

- refuses to start on a store that is not migrated (`db.migrate.require_migrated` raises
  `StoreNotMigratedError`, whose message says to run `cpbench db upgrade`);
- settles the API token (`core.security.ensure_api_token`: environment, token file, or generated and logged once);
- mounts the REST API under /api/v1 (operation ids "<tag>-<name>"), its Swagger UI at /docs (served from the
  installed swagger-ui-bundle-v2 package, no CDN), /healthz, the dashboard pages and plotly.js at /static/plotly.min.js;
- request bodies over CPBENCH_MAX_BODY_BYTES get 413, and so does a spec whose grid passes the points limit;
- every bad input is a 4xx whose body is valid JSON (non-finite numbers in a 422 are echoed as text; a value the
  store's column cannot hold is 422, not 500); a NUL in the URL is 422 and every response carries the security
  headers (`core.hardening`);
- `/healthz` says "store unavailable" and nothing more about a store error (the error goes to the server log).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DataError

from bench_server import docs, pages
from bench_server.api.deps import SessionDep
from bench_server.api.router import api_router
from bench_server.core.config import API_V1_STR, ServerSettings, get_settings
from bench_server.core.hardening import HardeningMiddleware
from bench_server.core.limits import BodySizeLimitMiddleware
from bench_server.core.security import ensure_api_token
from bench_server.schemas import Health
from db import crud
from db.migrate import require_migrated, safe_url
from db.session import get_sessionmaker
from runners.versions import cpbench_version

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def custom_generate_unique_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


def _json_safe(value: Any) -> Any:
    """`value` with every non-finite float as its text, so that the answer is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
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


async def _overflow(request: Request, exc: OverflowError) -> Any:
    return JSONResponse(status_code=422, content={"detail": [{"loc": ["query"], "msg": "a number is out of range",
                                                              "type": "range"}]})


def _health(request: Request, session: SessionDep) -> Any:
    try:
        crud.ping(session)
        db = "ok"
    except Exception:  # the endpoint's job is to report, not to raise; the details stay in the server log
        logger.warning("healthz: the store is unavailable", exc_info=True)
        db = "store unavailable"
    body = {"status": "ok" if db == "ok" else "degraded", "db": db, "version": request.app.version}
    return JSONResponse(status_code=200 if db == "ok" else 503, content=body)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The app for `settings` (default: from the environment)."""
    settings = settings or get_settings()
    require_migrated(settings.DATABASE_URL)
    token = ensure_api_token(settings)
    app = FastAPI(
        title="cpbench",
        version=cpbench_version(),
        summary="Benchmarks and autotuning of context-parallel delta-rule attention kernels (GDN, KDA)",
        openapi_url=f"{API_V1_STR}/openapi.json",
        docs_url=None,  # served by bench_server.docs from local files, not FastAPI's CDN page
        redoc_url=None,
        generate_unique_id_function=custom_generate_unique_id,
    )
    app.state.settings = settings
    app.state.sessionmaker = get_sessionmaker(settings.DATABASE_URL)
    app.state.api_token = token.token
    app.state.token_source = token.source
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.MAX_BODY_BYTES)
    app.add_middleware(HardeningMiddleware)  # outermost: its headers go on every answer, the 413 included
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(DataError)(_data_error)
    app.exception_handler(OverflowError)(_overflow)
    app.include_router(api_router, prefix=API_V1_STR)
    app.add_api_route("/healthz", _health, methods=["GET"], response_model=Health, tags=["health"], name="healthz",
                      summary="Liveness of the server and its database", responses={503: {"model": Health}})
    app.include_router(docs.router)
    app.include_router(pages.static_router)
    app.include_router(pages.router)
    logger.info("cpbench app on %s (token from %s, reads %s)", safe_url(settings.DATABASE_URL), token.source,
                "open" if settings.READS_OPEN else "need the token")
    return app
