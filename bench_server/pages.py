"""HTML pages of the dashboards and their CSV downloads: rows from `dashboards.data`, figures from
`dashboards.figures`, HTML from `dashboards.render` and the jinja2 templates in dashboards/templates.

    /                         sweeps with live progress (the page polls GET /api/v1/sweeps)
    /sweeps/{id}              one sweep: progress (polls GET /api/v1/sweeps/{id}) and its figures, on one slice
                              of (op, backend, H, K, V, dtype, direction, layout) picked by query parameters
    /tuning                   tuning trials and the tuned configs (?sweep=, ?device=, ?kernel=)
    /history                  nightly history per benchmark key with regression verdicts (?key= substring)
    /dash/{id}/{figure}.csv   the table behind a sweep figure (same query parameters as the page)
    /dash/all/{figure}.csv    the table behind the tuning or history figure
    /static/plotly.min.js     plotly.js from the installed plotly package (never a CDN)

Each figure sits in a div with id `fig-<name>`; its traces carry `meta.mode` (or `meta.kernel` / `meta.key`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

import dashboards
from bench_server.api.deps import SessionDep, require_read
from dashboards import data, render
from dashboards.figures import SWEEP_FIGURES, history, tuning
from db import crud
from db.models import Sweep
from runners.settings import get_worker_settings
from runners.spec import INT32_MAX

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_read)])
templates = Jinja2Templates(directory=Path(dashboards.__file__).parent / "templates")

PAGE_SIZE = 50


def _progress(session: Session, sweep_id: int) -> dict[str, int]:
    return crud.sweep_progress(session, sweep_id=sweep_id)


def _query(request: Request) -> str:
    return "?" + urlencode(list(request.query_params.items())) if request.query_params else ""


@router.get("/", response_class=HTMLResponse)
def sweeps_page(request: Request, session: SessionDep, page: int = Query(1, le=INT32_MAX // PAGE_SIZE)) -> Any:
    page = max(page, 1)
    sweeps, count = crud.list_sweeps(session, skip=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    rows = [{"sweep": s, "progress": _progress(session, s.id)} for s in sweeps]
    return templates.TemplateResponse(request, "sweeps.html", {
        "rows": rows, "count": count, "page": page, "pages": max(1, -(-count // PAGE_SIZE)), "page_size": PAGE_SIZE,
    })


def _sweep_or_404(session: Session, sweep_id: int) -> Sweep:
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail="Sweep not found")
    return sweep


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(request: Request, session: SessionDep, sweep_id: int = PathParam(ge=1, le=INT32_MAX)) -> Any:
    sweep = _sweep_or_404(session, sweep_id)
    rows = data.sweep_rows(session, sweep_id, limit=get_worker_settings().MAX_POINTS_PER_SWEEP)
    options = data.slice_options(rows)
    sliced, selection = data.apply_slice(rows, request.query_params)
    query = "?" + urlencode(selection) if selection else ""
    figures = [{
        "name": name, "title": module.TITLE, "div": render.figure_div(module.figure(sliced), f"fig-{name}"),
        "csv": f"/dash/{sweep_id}/{name}.csv{query}",
    } for name, module in SWEEP_FIGURES.items()]
    return templates.TemplateResponse(request, "sweep.html", {
        "sweep": sweep, "progress": _progress(session, sweep_id), "figures": figures, "plotly": True,
        "options": {a: v for a, v in options.items() if len(v) > 1}, "selection": selection,
        "n_rows": len(rows), "n_sliced": len(sliced), "failed": [r for r in rows if r["status"] == "failed"][:50],
    })


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
    keys = data.history_keys(session, contains=key or None)
    rows = data.history_rows(session, keys=keys)
    fig = render.figure_div(history.figure(rows), "fig-history")
    return templates.TemplateResponse(request, "history.html", {
        "figure": {"name": "history", "title": history.TITLE, "div": fig, "csv": f"/dash/all/history.csv{_query(request)}"},
        "keys": keys, "key": key or "", "plotly": True,
        "verdicts": [r for r in rows if r["verdict"] and r["verdict"] != "SAME"],
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


static_router = APIRouter(include_in_schema=False)


@static_router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(render.plotly_js_path(), media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})
