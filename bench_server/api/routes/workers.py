"""Workers: the runner processes the store knows, with their devices, heartbeat, state and current point.

`state` is "lost" for a worker that is not stopped and whose heartbeat is older than its lease (killed, or cut
off from the store), on the store's clock. Host, pid and the name (which carries them) are shown only to a
caller with the API token: without it the name is `worker-<id>` and host and pid are null.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from bench_server.api.deps import SessionDep, bearer, is_trusted, require_read
from bench_server.schemas import WorkerPublic, WorkersPublic
from db import crud
from db.clock import store_now
from runners.settings import get_worker_settings

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic, dependencies=[Depends(require_read)])
def read_workers(request: Request, session: SessionDep,
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Any:
    """Every registered worker; `alive` unless stopped or lost. Host and pid need the token."""
    now = store_now(session)
    default_lease = get_worker_settings().LEASE_S
    trusted = is_trusted(request, credentials)
    data = []
    for w in crud.list_workers(session):
        state = crud.worker_state(w, now, default_lease)
        row = {**{c: getattr(w, c, None) for c in WorkerPublic.model_fields}, "state": state,
               "alive": state not in ("stopped", "lost")}
        if not trusted:
            row.update(name=f"worker-{w.id}", host=None, pid=None)
        data.append(WorkerPublic.model_validate(row))
    return {"data": data, "count": len(data)}
