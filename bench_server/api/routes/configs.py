"""Tuned configs: the autotune JSON that training jobs load (`CPBENCH_AUTOTUNE=autotune.json`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from bench_server.api.deps import SessionDep, require_read
from bench_server.schemas import Message

router = APIRouter(prefix="/configs", tags=["configs"])


@router.get("/export", dependencies=[Depends(require_read)], responses={400: {"model": Message}, 404: {"model": Message}})
def export_configs(
    session: SessionDep,
    device: str | None = Query(None, description="device name; required when configs exist for several devices"),
    allow_cpu: bool = Query(False, description="export CPU timings (tests only: they say nothing about a GPU)"),
) -> dict[str, Any]:
    """The versioned autotune JSON of one device's tuned configs."""
    from runners.tuner.export import ExportError, build_export  # the tuner imports torch: only when exporting

    try:
        return build_export(session, device_name=device, allow_cpu=allow_cpu)
    except ExportError as err:
        code = 404 if str(err).startswith("no tuned configs") else 400
        raise HTTPException(status_code=code, detail=str(err)) from None
