"""Sweeps: submit (POST, token), list (paginated), read one with its progress, cancel (token)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, status
from sqlalchemy.orm import Session

from bench_server.api.deps import SessionDep, require_read, require_token
from bench_server.schemas import Message, SweepCancelled, SweepCreate, SweepProgress, SweepPublic, SweepsPublic
from db import crud, queue
from db.models import Sweep
from runners.engine import submit_spec
from runners.errors import SpecError
from runners.spec import INT32_MAX

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

NOT_FOUND = "Sweep not found"


def sweep_public(session: Session, sweep: Sweep) -> dict[str, Any]:
    progress = SweepProgress(**crud.sweep_progress(session, sweep_id=sweep.id))
    return {**{c: getattr(sweep, c) for c in SweepPublic.model_fields if c != "progress"}, "progress": progress}


@router.post(
    "",
    response_model=SweepPublic,
    status_code=status.HTTP_201_CREATED,
    dependencies=[Depends(require_token)],
    responses={400: {"model": Message, "description": "the body is not JSON text"}, 401: {"model": Message},
               403: {"model": Message}, 413: {"model": Message}},
)
def create_sweep(session: SessionDep, spec: SweepCreate) -> Any:
    """Submit a sweep; its grid is expanded into queued (or skipped) points.

    A grid over CPBENCH_MAX_POINTS_PER_SWEEP is refused while the body is parsed (the spec's own limit, answered
    with 413 by the app's validation handler), before this runs.
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
             responses={401: {"model": Message}, 403: {"model": Message}, 404: {"model": Message}})
def cancel_sweep(session: SessionDep, sweep_id: int = Path(ge=1, le=INT32_MAX)) -> Any:
    """Cancel a sweep: its queued points are cancelled; running points finish and keep their results."""
    if (sweep := crud.get_sweep(session, sweep_id=sweep_id)) is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    cancelled = queue.cancel_sweep(session, sweep_id=sweep_id)
    session.expire_all()  # the sweep's attributes are read again, after the cancel
    return {**sweep_public(session, sweep), "cancelled_points": cancelled}
