"""Results: one flat row per point (point, measurement, profile, environment), filtered and paginated, as JSON
({data, count}) or CSV (`format=csv`; nested values as JSON text, the total count in `X-Total-Count`)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from bench_server.api.deps import SessionDep, require_read
from bench_server.schemas import ResultsPublic
from dashboards.render import to_csv
from db import crud
from runners.settings import DEFAULT_MAX_POINTS_PER_SWEEP
from runners.spec import INT32_MAX

router = APIRouter(prefix="/results", tags=["results"])

MAX_LIMIT = DEFAULT_MAX_POINTS_PER_SWEEP


@router.get("", response_model=ResultsPublic, dependencies=[Depends(require_read)],
            responses={200: {"content": {"text/csv": {}}, "description": "JSON page, or CSV with format=csv"}})
def read_results(
    session: SessionDep,
    sweep: int | None = Query(None, ge=1, le=INT32_MAX, description="sweep id"),
    op: str | None = None,
    mode: list[str] | None = Query(None, description="repeat to match several"),
    backend: str | None = None,
    B: int | None = Query(None, ge=1, le=INT32_MAX),
    T: int | None = Query(None, ge=1, le=2**63 - 1),
    W: int | None = Query(None, ge=1, le=INT32_MAX),
    lb: float | None = Query(None, ge=-1e300, le=0),
    device: str | None = Query(None, description="device name of the environment, e.g. 'NVIDIA H200' or 'cpu'"),
    status: str | None = Query(None, description="point status: queued, running, done, failed, skipped, cancelled"),
    skip: int = Query(0, ge=0, le=INT32_MAX),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    format: Literal["json", "csv"] = "json",
) -> Any:
    """Results of points, filtered by sweep, op, mode, backend, B, T, W, lb, device and status."""
    rows, count = crud.list_results(session, sweep_id=sweep, op=op, mode=mode, backend=backend, B=B, T=T, W=W, lb=lb,
                                    device=device, status=status, skip=skip, limit=limit)
    if format == "csv":
        name = f"cpbench-results{'-sweep' + str(sweep) if sweep is not None else ''}.csv"
        return Response(to_csv(rows, crud.RESULT_FIELDS), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{name}"', "X-Total-Count": str(count)})
    return {"data": rows, "count": count}
