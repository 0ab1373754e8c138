"""HTML pages of the dashboards and their CSV downloads: rows from `dashboards.data`, figures from
`dashboards.figures`, HTML from `dashboards.render` and the jinja2 templates in dashboards/templates.

    /                         sweeps with live progress and unreliable counts (the page polls GET
                              /api/v1/sweeps), filtered by ?name= (substring), ?tag=, ?status= (a shown status,
                              `dashboards.data.INDEX_STATUSES`); the sweeps of one regression run are collapsed into
                              one row
    /sweeps/{id}              one sweep: progress (polls GET /api/v1/sweeps/{id}) and its figures, on one slice
                              of (op, backend, H, K, V, dtype, direction, layout) picked by query parameters;
                              backend=all (the default when the sweep has several) draws every backend side by side
    /tuning                   tuning trials and the tuned configs (?sweep=, ?device=, ?kernel=)
    /history                  nightly history per benchmark key with regression verdicts (?key= substring)
    /scaling                  the scaling model's predicted best scheme per (T, W, hosts), with the links and kernel
                              rate it used and where they came from (?sweep= fits the rate on that sweep's W=1
                              `none` points; ?op=, direction=, H=, K=, V=, dtype=, backend=, layout=,
                              max_ranks_per_host=, exact=true (the exact schemes only); the links:
                              CPBENCH_COMM_PARAMS, `cpbench bench comm`'s JSON)
    /dash/{id}/{figure}.csv   the table behind a sweep figure (same query parameters as the page)
    /dash/all/{figure}.csv    the table behind the tuning or history figure
    /static/plotly.min.js     plotly.js from the installed plotly package (never a CDN)

Each figure sits in a div with id `fig-<name>`; its traces carry `meta.mode` (or `meta.kernel` / `meta.key`).

The sweep page also lists its skipped points grouped by backend and reason, its unreliable measurements (stop rule not
converged: `measurements.unreliable`, with n and p10-p90) and, on a fwd+bwd slice, each point's per-gradient errors
(`dashboards.figures.accuracy.grad_frame`). Its figures and tables are computed once per sweep revision (the sweep's
status and point counts) and query string, and kept in a small in-process cache (`SweepPageCache`).

A browser route's error (404: no such sweep or page; 422: a bad path or query value) is an HTML page with the code
and what went wrong (`HTMLErrorRoute`; the API under /api keeps its JSON errors).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session
from starlette.routing import Match
from starlette.types import Scope

import dashboards
from bench_server.api.deps import SessionDep, require_read
from dashboards import data, links, render, scaling_model
from dashboards.figures import SWEEP_FIGURES, accuracy, history, scaling_map, tuning
from dashboards.figures.common import empty_figure
from db import crud
from db.models import Sweep
from kernels.vocabulary import DTYPE_BYTES
from runners.settings import get_worker_settings
from runners.spec import INT32_MAX

templates = Jinja2Templates(directory=Path(dashboards.__file__).parent / "templates")

PAGE_SIZE = 50


def _error_page(request: Request, status: int, detail: Any) -> HTMLResponse:
    """The HTML page of a browser route's error: the code, its name and what went wrong (a 422's fields, one a line)."""
    if isinstance(detail, list):
        lines = [f"{'.'.join(str(x) for x in e.get('loc', ()) if x not in ('path', 'query'))}: {e.get('msg')}"
                 + (f" (got {str(e['input'])[:80]!r})" if e.get("input") is not None else "") for e in detail]
    else:
        lines = [str(detail)]
    title = {404: "Not found", 422: "Invalid request"}.get(status, "Error")
    return templates.TemplateResponse(request, "error.html", {"status": status, "title": title, "lines": lines},
                                      status_code=status)


class HTMLErrorRoute(APIRoute):
    """A dashboard route whose HTTP errors (404, a 422 of a bad path or query value) are HTML pages, not JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _error_page(request, 422, exc.errors())
            except HTTPException as exc:
                if exc.status_code in (401, 403):  # the token check keeps its JSON answer and headers
                    raise
                return _error_page(request, exc.status_code, exc.detail)

        return route


router = APIRouter(include_in_schema=False, dependencies=[Depends(require_read)], route_class=HTMLErrorRoute)


def _progress(session: Session, sweep_id: int) -> dict[str, int]:
    return crud.sweep_progress(session, sweep_id=sweep_id)


def _query(request: Request) -> str:
    return "?" + urlencode(list(request.query_params.items())) if request.query_params else ""


@router.get("/", response_class=HTMLResponse)
def sweeps_page(request: Request, session: SessionDep, page: int = Query(1, le=INT32_MAX // PAGE_SIZE),
                name: str = "", tag: str = "", status: str = "") -> Any:
    page = max(page, 1)
    groups = data.sweep_index(session, name=name.strip() or None, tag=tag.strip() or None, status=status or None)
    count = len(groups)
    filters = {k: v for k, v in (("name", name), ("tag", tag), ("status", status)) if v}
    return templates.TemplateResponse(request, "sweeps.html", {
        "rows": groups[(page - 1) * PAGE_SIZE: page * PAGE_SIZE], "count": count, "page": page,
        "pages": max(1, -(-count // PAGE_SIZE)), "page_size": PAGE_SIZE, "filters": filters,
        "statuses": data.INDEX_STATUSES, "filter_query": urlencode(filters),
    })


def _sweep_or_404(session: Session, sweep_id: int) -> Sweep:
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail="Sweep not found")
    return sweep


class SweepPageCache:
    """The computed part of sweep pages (figure divs, tables), per (store, sweep, revision, query string); least
    recently used first out. A sweep's revision is its status and point counts: any point that finishes, fails, is
    skipped or re-queued changes it, so a cached page is never older than the store's progress."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self.items: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = build()  # outside the lock: two first requests may both build; the second one's value is kept
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


SWEEP_PAGES = SweepPageCache()


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, session: SessionDep, sweep_id: int = PathParam(ge=1, le=INT32_MAX)) -> Any:
    sweep = _sweep_or_404(session, sweep_id)
    progress = _progress(session, sweep_id)
    status = data.display_status(sweep.status, progress)
    key = (str(session.get_bind().engine.url), sweep_id, sweep.status, tuple(sorted(progress.items())),
           tuple(sorted(request.query_params.multi_items())))
    page = SWEEP_PAGES.get(key, lambda: _sweep_content(session, sweep_id, request.query_params, progress))
    return templates.TemplateResponse(request, "sweep.html", {
        "sweep": sweep, "status": status, "progress": progress, "plotly": True, **page})


def _sweep_content(session: Session, sweep_id: int, params: Any, progress: dict[str, int]) -> dict[str, Any]:
    """What the sweep page computes from its rows: the slice, the figures and the tables."""
    rows = data.sweep_rows(session, sweep_id, limit=get_worker_settings().MAX_POINTS_PER_SWEEP)
    options = data.slice_options(rows)
    sliced, selection = data.apply_slice(rows, params)
    query = "?" + urlencode(selection) if selection else ""
    nothing = None if any(r["status"] == "done" for r in rows) else (
        f"no point finished: {progress['failed']} failed (errors above)" if progress["failed"] else None)
    figures = [{
        "name": name, "title": module.TITLE, "csv": f"/dash/{sweep_id}/{name}.csv{query}",
        "div": render.figure_div(empty_figure(module.TITLE, nothing) if nothing else module.figure(sliced), f"fig-{name}"),
    } for name, module in SWEEP_FIGURES.items()]
    return {
        "figures": figures, "options": {a: v for a, v in options.items() if len(v) > 1}, "selection": selection,
        "n_rows": len(rows), "n_sliced": len(sliced), "errors": _errors([r for r in rows if r["status"] == "failed"]),
        "skipped": _skipped([r for r in rows if r["status"] == "skipped"]),
        "unreliable": [r for r in rows if r["status"] == "done" and r.get("unreliable")],
        "grads": (grads := accuracy.grad_frame(sliced)), "grad_names": accuracy.grad_names(grads),
    }


def _skipped(skipped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Skipped points grouped by backend and reason (a peer's reasons are its own), most frequent first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in skipped:
        reason = (r.get("reason") or "").strip() or "(no reason recorded)"
        backend = str(r.get("backend") or "")
        groups.setdefault((backend, reason), {"backend": backend, "reason": reason, "points": []})["points"].append(r)
    return sorted(groups.values(), key=lambda g: (-len(g["points"]), g["backend"]))


def _errors(failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed points grouped by their error's last line (the exception), most frequent first; each group keeps the
    full text of its first error (a traceback keeps its line breaks) and the points it hit."""
    groups: dict[str, dict[str, Any]] = {}
    for r in failed:
        text = (r.get("error") or "").strip() or "(no error recorded)"
        head = text.splitlines()[-1]
        g = groups.setdefault(head, {"head": head, "text": text, "points": []})
        g["points"].append(r)
    return sorted(groups.values(), key=lambda g: -len(g["points"]))


@router.get("/tuning", response_class=HTMLResponse)
def tuning_page(request: Request, session: SessionDep, sweep: int | None = Query(None, ge=1, le=INT32_MAX), device: str | None = None,
                kernel: str | None = None) -> Any:
    rows = data.tuning_rows(session, sweep_id=sweep, device_name=device, kernel=kernel)
    fig = render.figure_div(tuning.figure(rows), "fig-tuning")
    return templates.TemplateResponse(request, "tuning.html", {
        "figure": {"name": "tuning", "title": tuning.TITLE, "div": fig, "csv": f"/dash/all/tuning.csv{_query(request)}"},
        "configs": data.tuned_config_rows(session, device_name=device), "n_trials": len(rows), "plotly": True,
    })


@router.get("/history", response_class=HTMLResponse)
def history_page(request: Request, session: SessionDep, key: str | None = None) -> Any:
    keys = data.history_keys(session, contains=key or None, limit=data.HISTORY_KEYS + 1)
    capped = len(keys) > data.HISTORY_KEYS
    keys = keys[: data.HISTORY_KEYS]
    rows = data.history_rows(session, keys=keys)
    fig = render.figure_div(history.figure(rows), "fig-history")
    return templates.TemplateResponse(request, "history.html", {
        "figure": {"name": "history", "title": history.TITLE, "div": fig, "csv": f"/dash/all/history.csv{_query(request)}"},
        "keys": keys, "key": key or "", "plotly": True, "capped": capped, "cap": data.HISTORY_KEYS,
        "verdicts": [r for r in rows if r["verdict"] and r["verdict"] != "SAME"],
    })


@router.get("/scaling", response_class=HTMLResponse)
def scaling_page(request: Request, session: SessionDep, sweep: int | None = Query(None, ge=1, le=INT32_MAX),
                 op: Literal["gdn", "kda"] = "gdn", direction: Literal["fwd", "fwd+bwd"] = "fwd",
                 H: int = Query(16, ge=1, le=1024), K: int = Query(128, ge=1, le=1024), V: int = Query(128, ge=1, le=1024),
                 dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16", backend: str = "triton",
                 layout: Literal["contiguous", "zigzag"] = "contiguous",
                 max_ranks_per_host: int = Query(8, ge=1, le=128), exact: bool = False) -> Any:
    params, doc, problem = links.load_params()
    if sweep is not None:
        _sweep_or_404(session, sweep)
        rows = data.sweep_rows(session, sweep, limit=get_worker_settings().MAX_POINTS_PER_SWEEP)
        rates = scaling_model.fit_rates(rows, source=f"sweep {sweep}: its W=1 `none` points")
    else:
        rates = scaling_model.DEFAULT_RATES
    family = (op, backend, dtype, H, K, V, direction)
    rate, rate_family = scaling_model.choose_rate(rates, family)
    cells = [] if rate is None else scaling_model.best_schemes(
        Ts=scaling_model.SCALING_TS, Ws=scaling_model.SCALING_WS, hosts=scaling_model.SCALING_HOSTS, rate=rate,
        params=params, op=op, H=H, K=K, V=V, dtype_bytes=DTYPE_BYTES[dtype], direction=direction, layout=layout,
        max_ranks_per_host=max_ranks_per_host, modes=scaling_model.cp_modes(exact_only=exact))
    fig = scaling_map.figure(cells) if rate is not None else empty_figure(
        scaling_map.TITLE, f"no kernel rate for {op} {direction}" + (f" in sweep {sweep}" if sweep else ""))
    return templates.TemplateResponse(request, "scaling.html", {
        "figure": {"name": scaling_map.NAME, "title": scaling_map.TITLE, "div": render.figure_div(fig, "fig-scaling_map")},
        "cells": scaling_map.frame(cells), "links": params.describe(), "problem": problem, "rate": rate,
        "rate_family": dict(zip(scaling_model.FAMILY_KEYS, rate_family, strict=True)) if rate_family else None,
        "asked_family": dict(zip(scaling_model.FAMILY_KEYS, family, strict=True)), "sweep": sweep, "env": links.PARAMS_ENV,
        "check": links.comm_check(doc) if doc else [], "plotly": True,
        "query": {"op": op, "direction": direction, "H": H, "K": K, "V": V, "dtype": dtype, "backend": backend,
                  "layout": layout, "max_ranks_per_host": max_ranks_per_host, "sweep": sweep or "", "exact": exact},
    })


def _csv(text: str, filename: str) -> Response:
    return Response(text, media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})


@router.get("/dash/{scope}/{figure}.csv")
def figure_csv(request: Request, session: SessionDep, scope: str, figure: str) -> Response:
    """The table a figure plots, as CSV. `scope` is a sweep id, or `all` for tuning and history."""
    params = request.query_params
    if scope == "all" and figure == "history":
        rows = data.history_rows(session, keys=data.history_keys(session, contains=params.get("key") or None))
        return _csv(render.to_csv(history.frame(rows), history.COLUMNS), "cpbench-history.csv")
    if figure == "tuning" and (scope == "all" or scope.isdigit()):
        sweep_id = int(scope) if scope.isdigit() else (int(params["sweep"]) if params.get("sweep", "").isdigit() else None)
        rows = data.tuning_rows(session, sweep_id=sweep_id, device_name=params.get("device"), kernel=params.get("kernel"))
        return _csv(render.to_csv(tuning.frame(rows), tuning.COLUMNS), f"cpbench-tuning-{scope}.csv")
    if not scope.isdigit() or figure not in SWEEP_FIGURES:
        raise HTTPException(status_code=404, detail=f"no figure {figure!r} for {scope!r}; sweep figures: "
                                                    f"{', '.join(SWEEP_FIGURES)}; 'all' has tuning and history")
    sweep_id = int(scope)
    _sweep_or_404(session, sweep_id)
    module = SWEEP_FIGURES[figure]
    sliced, _ = data.apply_slice(data.sweep_rows(session, sweep_id, limit=get_worker_settings().MAX_POINTS_PER_SWEEP), params)
    return _csv(render.to_csv(module.frame(sliced), module.COLUMNS), f"cpbench-sweep{sweep_id}-{figure}.csv")


class _PageNotFoundRoute(HTMLErrorRoute):
    """The last dashboard route: any other GET path outside /api, /docs and /static is an HTML 404 page."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if path.startswith(("/api/", "/docs", "/static/", "/healthz")):
            return Match.NONE, {}
        return super().matches(scope)


def not_found_page(request: Request, path: str) -> Any:
    raise HTTPException(status_code=404, detail=f"no page at /{path}: the pages are /, /sweeps/<id>, /tuning, /history and /scaling")


# added after the other pages (`create_app` includes this router last), so it only sees paths no route matched
router.routes.append(_PageNotFoundRoute("/{path:path}", not_found_page, methods=["GET"], include_in_schema=False,
                                        response_class=HTMLResponse, dependencies=[Depends(require_read)]))

static_router = APIRouter(include_in_schema=False)


@static_router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(render.plotly_js_path(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})
