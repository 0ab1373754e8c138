"""Sweeps: submit (POST, token), list (paginated), read one with its progress, cancel (token).

The body of a submit is parsed and validated in a worker thread (`spec_body`), not on the event loop: a 1 MiB
spec (a long varlen length list) takes tens of ms to check, and other requests (/healthz) go on meanwhile. Its
schema is still the `SweepCreate` model's (`SPEC_SCHEMA`, put in the OpenAPI components by `bench_server.main`).
Python's cyclic collector is held off while a submit runs (`COLLECTOR_PAUSE`): its full collections over a big
spec's objects would stop every other request.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from bench_server.api.deps import SessionDep, require_read, require_token
from bench_server.schemas import Message, SweepCancelled, SweepCreate, SweepProgress, SweepPublic, SweepsPublic
from db import crud, queue
from db.models import Sweep
from runners.engine import submit_spec
from runners.errors import SpecError
from runners.spec import INT32_MAX

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

NOT_FOUND = "Sweep not found"
SPEC_SCHEMA = "SweepSpec"  # the request body's component name in the OpenAPI schema


class CollectorPause:
    """Python's cyclic garbage collector held off while any submit runs (a context manager; submits may overlap).

    A 1 MiB spec makes some 100,000 objects (its lists, the expanded points' rows): enough to start full
    collections, each stopping every thread of the server for 40-300 ms (a /healthz meanwhile waited up to 1 s).
    The submit's objects are freed by reference counting when it ends; cyclic garbage waits for the next collection."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False

    def __enter__(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.resume = gc.isenabled()
                gc.disable()
            self.depth += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.resume:
                gc.enable()


COLLECTOR_PAUSE = CollectorPause()


async def collector_paused() -> AsyncIterator[None]:
    """The submit's dependency: `COLLECTOR_PAUSE` from before its body is parsed until it has been answered."""
    with COLLECTOR_PAUSE:
        yield


def _parse_spec(raw: bytes) -> SweepCreate:
    try:
        return SweepCreate.model_validate_json(raw)
    except ValidationError as err:  # located in the body, as FastAPI's own body errors are
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]) from None


async def spec_body(request: Request) -> SweepCreate:
    """The submitted spec, parsed and validated off the event loop (a JSON or spec error is a 422)."""
    return await run_in_threadpool(_parse_spec, await request.body())


def sweep_public(session: Session, sweep: Sweep) -> dict[str, Any]:
    progress = SweepProgress(**crud.sweep_progress(session, sweep_id=sweep.id),
                             unreliable=crud.sweeps_unreliable(session, sweep_ids=[sweep.id])[sweep.id])
    return {**{c: getattr(sweep, c) for c in SweepPublic.model_fields if c != "progress"}, "progress": progress}


@router.post(
    "",
    response_model=SweepPublic,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(require_token), Depends(collector_paused)],
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{SPEC_SCHEMA}"}}}}},
    responses={422: {"description": "the body is not JSON text, or not a valid spec (the fields named)", "content": {
                   "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}},
               401: {"model": Message},
               403: {"model": Message},
               413: {"model": Message, "description": "a body over CPBENCH_MAX_BODY_BYTES, or a grid of more points than "
                     "CPBENCH_MAX_POINTS_PER_SWEEP (20000 unless set)"}},
)
def create_sweep(session: SessionDep, spec: Annotated[SweepCreate, Depends(spec_body)]) -> Any:
    """Submit a sweep; its grid is expanded into queued (or skipped) points.

    A grid over CPBENCH_MAX_POINTS_PER_SWEEP is refused while the body is parsed (the spec's own limit, answered
    with 413 by the app's validation handler), before this runs. A body that is not JSON text (or holds a lone
    surrogate, which is not Unicode) is a 422.
    """
    try:
        sweep = submit_spec(session, spec)
        session.commit()
    except SpecError as err:
        session.rollback()
        raise HTTPException(status_code=422, detail=[{"loc": ["body"], "msg": str(err), "type": "spec"}]) from None
    return sweep_public(session, sweep)


@router.get("", response_model=SweepsPublic, dependencies=[Depends(require_read)])
def read_sweeps(
    session: SessionDep,
    skip: int = Query(0, ge=0, le=INT32_MAX),
    limit: int = Query(50, ge=1, le=500),
    tag: str | None = Query(None, max_length=255),
) -> Any:
    """Sweeps, newest first, with their progress; `tag` keeps those carrying it."""
    sweeps, count = crud.list_sweeps(session, skip=skip, limit=limit, tag=tag)
    return {"data": [sweep_public(session, s) for s in sweeps], "count": count}


@router.get("/{sweep_id}", response_model=SweepPublic, dependencies=[Depends(require_read)],
            responses={404: {"model": Message}})
def read_sweep(session: SessionDep, sweep_id: int = Path(ge=1, le=INT32_MAX)) -> Any:
    """Status and progress counts of one sweep."""
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return sweep_public(session, sweep)


@router.post("/{sweep_id}/cancel", response_model=SweepCancelled, dependencies=[Depends(require_token)],
             responses={422: {"description": "the body is not JSON text, or not a valid spec (the fields named)", "content": {
                   "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}},
               401: {"model": Message}, 403: {"model": Message}, 404: {"model": Message}})
def cancel_sweep(session: SessionDep, sweep_id: int = Path(ge=1, le=INT32_MAX)) -> Any:
    """Cancel a sweep: its queued points are cancelled; running points finish and keep their results."""
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    cancelled = queue.cancel_sweep(session, sweep_id=sweep_id)
    session.expire_all()  # the sweep's attributes are read again, after the cancel
    return {**sweep_public(session, sweep), "cancelled_points": cancelled}
