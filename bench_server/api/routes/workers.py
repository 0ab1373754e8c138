"""Workers: the runner processes the store knows, with their devices, heartbeat and current point."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Depends

from bench_server.api.deps import SessionDep, require_read
from bench_server.schemas import WorkerPublic, WorkersPublic
from db import crud
from runners.settings import get_worker_settings

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic, dependencies=[Depends(require_read)])
def read_workers(session: SessionDep) -> Any:
    """Every registered worker; `alive` when not stopped and its heartbeat is within two lease periods."""
    now = datetime.now(timezone.utc)
    horizon = 2 * get_worker_settings().LEASE_S
    data = []
    for w in crud.list_workers(session):
        alive = w.status != "stopped" and (now - w.last_heartbeat).total_seconds() < horizon
        data.append(WorkerPublic.model_validate({**{c: getattr(w, c) for c in WorkerPublic.model_fields if c != "alive"},
                                                 "alive": alive}))
    return {"data": data, "count": len(data)}
