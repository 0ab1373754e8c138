"""`create_app()`: assembles the cpbench service; it does no work of its own.

    uvicorn --factory bench_server.main:create_app      (or `cpbench serve`)

- refuses to start on a store that is not migrated (`db.migrate.require_migrated` raises
  `StoreNotMigratedError`, whose message says to run `cpbench db upgrade`);
- settles the API token (`core.security.ensure_api_token`: environment, token file, or generated and logged once);
- mounts the REST API under /api/v1 (operation ids "<tag>-<name>"), its Swagger UI at /docs (served from the
  installed swagger-ui-bundle-v2 package, no CDN), /healthz, the dashboard pages and plotly.js at /static/plotly.min.js;
- request bodies over CPBENCH_MAX_BODY_BYTES get 413, and so does a spec whose grid passes the points limit.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import text

from bench_server import docs, pages
from bench_server.api.deps import SessionDep
from bench_server.api.router import api_router
from bench_server.core.config import API_V1_STR, ServerSettings, get_settings
from bench_server.core.limits import BodySizeLimitMiddleware
from bench_server.core.security import ensure_api_token
from bench_server.schemas import Health
from db.migrate import require_migrated, safe_url
from db.session import get_sessionmaker
from runners.versions import cpbench_version

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def custom_generate_unique_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


async def _validation_error(request: Request, exc: RequestValidationError) -> Any:
    """422 naming the fields; a grid over the points limit (the spec's own check) is 413 instead."""
    errors = exc.errors()
    if any(e.get("type") == "limit" and tuple(e.get("loc", ())) == ("body",) for e in errors):
        return JSONResponse(status_code=413, content={"detail": "; ".join(e["msg"] for e in errors)})
    return await request_validation_exception_handler(request, exc)


def _health(request: Request, session: SessionDep) -> Any:
    try:
        session.execute(text("SELECT 1"))
        db = "ok"
    except Exception as err:  # the endpoint's job is to report, not to raise
        db = f"error: {type(err).__name__}: {err}"[:300]
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
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.include_router(api_router, prefix=API_V1_STR)
    app.add_api_route("/healthz", _health, methods=["GET"], response_model=Health, tags=["health"], name="healthz",
                      summary="Liveness of the server and its database", responses={503: {"model": Health}})
    app.include_router(docs.router)
    app.include_router(pages.static_router)
    app.include_router(pages.router)
    logger.info("cpbench app on %s (token from %s, reads %s)", safe_url(settings.DATABASE_URL), token.source,
                "open" if settings.READS_OPEN else "need the token")
    return app
