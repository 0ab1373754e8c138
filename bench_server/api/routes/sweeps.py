"""Sweeps: submit (POST, token), list (paginated), read one with its progress, cancel (token).

The body of a submit is parsed, validated and stored off the event loop (`submit_body`): in a worker thread, or,
from CPBENCH_SUBMIT_POOL_BYTES up, in the submit process (`bench_server.core.submit_pool`), since a 1 MiB spec (a
long varlen length list) costs tens of ms of C code that holds the GIL, and other requests (/healthz) go on
meanwhile. Both give the same answer: the 201's JSON as FastAPI would serialize `SweepPublic` (`answer_bytes`), or
the same errors. Its schema is still the `SweepCreate` model's (`SPEC_SCHEMA`, put in the OpenAPI components by
`bench_server.main`). Python's cyclic collector is held off while a submit runs (`COLLECTOR_PAUSE`): its full
collections over a big spec's objects would stop every other request.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from bench_server.api.deps import SessionDep, require_read, require_token, run_in_session
from bench_server.schemas import Message, SweepCancelled, SweepCreate, SweepPublic, SweepsPublic
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


def parse_spec_body(raw: bytes) -> SweepCreate:
    """The submitted spec; a JSON or spec error is a `RequestValidationError` located in the body (a 422)."""
    try:
        return SweepCreate.model_validate_json(raw)
    except ValidationError as err:  # located in the body, as FastAPI's own body errors are
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]) from None


_ANSWER = TypeAdapter(SweepPublic)


def answer_bytes(content: dict[str, Any]) -> bytes:
    """The 201's body: `content` validated and serialized as FastAPI does for the route's `response_model`."""
    return _ANSWER.dump_json(_ANSWER.validate_python(content), by_alias=True)


def submit_body(maker: sessionmaker[Session], raw: bytes,
                before_commit: Callable[[int, Any], None] | None = None) -> bytes:
    """Parse, validate and store a submitted body; its 201 answer's bytes. `before_commit(sweep id, created_at)`
    is called once the sweep is flushed (the submit process's note to the server)."""
    spec = parse_spec_body(raw)
    with maker() as session:
        try:
            sweep = submit_spec(session, spec)
            if before_commit is not None:
                before_commit(sweep.id, sweep.created_at)
            session.commit()
        except SpecError as err:
            session.rollback()
            raise HTTPException(status_code=422, detail=[{"loc": ["body"], "msg": str(err), "type": "spec"}]) from None
        return answer_bytes(sweep_public(session, sweep))


def sweep_public(session: Session, sweep: Sweep) -> dict[str, Any]:
    """A stored sweep as every route answers it: `crud.sweep_view` (its columns and counts, unreliable included)."""
    view = crud.sweep_view(session, sweep_id=sweep.id)
    assert view is not None, f"sweep {sweep.id} was read, then not found"
    return view


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
async def create_sweep(request: Request) -> Any:
    """Submit a sweep; its grid is expanded into queued (or skipped) points.

    A grid over CPBENCH_MAX_POINTS_PER_SWEEP is refused while the body is parsed (the spec's own limit, answered
    with 413 by the app's validation handler). A body that is not JSON text (or holds a lone surrogate, which is
    not Unicode) is a 422.
    """
    raw = await request.body()
    pool = request.app.state.submit_pool
    if pool is not None and pool.takes(raw):
        return await pool.submit(raw)
    body = await run_in_threadpool(submit_body, request.app.state.sessionmaker, raw)
    return Response(content=body, status_code=status.HTTP_201_CREATED, media_type="application/json")


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


def _sweep(session: Session, sweep_id: int) -> Sweep:
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return sweep


@router.get("/{sweep_id}", response_model=SweepPublic, dependencies=[Depends(require_read)],
            responses={404: {"model": Message}})
async def read_sweep(request: Request, sweep_id: int = Path(ge=1, le=INT32_MAX)) -> Any:
    """Status and progress counts of one sweep."""
    return await run_in_session(request, lambda session: _sweep_view(session, sweep_id))


def _sweep_view(session: Session, sweep_id: int) -> dict[str, Any]:
    """`GET /sweeps/{id}`'s answer: `crud.sweep_view` (two Core queries), a 404 when there is no such sweep."""
    if (view := crud.sweep_view(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return view


@router.post("/{sweep_id}/cancel", response_model=SweepCancelled, dependencies=[Depends(require_token)],
             responses={422: {"description": "the body is not JSON text, or not a valid spec (the fields named)", "content": {
                   "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}},
               401: {"model": Message}, 403: {"model": Message}, 404: {"model": Message}})
def cancel_sweep(session: SessionDep, sweep_id: int = Path(ge=1, le=INT32_MAX)) -> Any:
    """Cancel a sweep: its queued points are cancelled; running points finish and keep their results."""
    sweep = _sweep(session, sweep_id)
    cancelled = queue.cancel_sweep(session, sweep_id=sweep_id)
    session.expire_all()  # the sweep's attributes are read again, after the cancel
    return {**sweep_public(session, sweep), "cancelled_points": cancelled}
