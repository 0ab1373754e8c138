"""Results: one flat row per point (point, measurement, profile, environment), filtered and paginated, as JSON
({data, count}) or CSV (`format=csv`; nested values as JSON text, the total count in `X-Total-Count`).

The filters on named values (op, mode, direction, status) take only the project's vocabulary: any other
value is a 422 naming the allowed ones (not an empty page); `backend` takes peer plugins' names too. Anonymous readers get neither the worker (host:pid)
nor the host of a result, as on /workers; a failed point's error is its summary line, without the traceback
(`db.crud.short_error`; the full text stays in the worker's log and the store).

A finished page of at most 1,000 rows is kept per revision of its rows (`RESULT_PAGES`, `db.crud.results_revision`):
a repeated request costs one light query while nothing it shows has changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic_core import to_json
from sqlalchemy.orm import Session

from bench_server.api.deps import bearer, is_trusted, require_read, run_in_session
from bench_server.pages import SweepPageCache
from bench_server.schemas import ResultsPublic
from dashboards.render import to_csv
from db import crud
from db.models import POINT_STATUSES
from kernels.vocabulary import MODES, OPS, POINT_DIRECTIONS
from runners.settings import DEFAULT_MAX_POINTS_PER_SWEEP
from runners.spec import INT32_MAX

if TYPE_CHECKING:
    OpName: TypeAlias = str
    ModeName: TypeAlias = str
    DirectionName: TypeAlias = str
    StatusName: TypeAlias = str
else:  # Literal of the vocabularies: FastAPI answers 422 naming them, and the schema lists them
    OpName, ModeName = Literal[OPS], Literal[MODES]
    DirectionName, StatusName = Literal[POINT_DIRECTIONS], Literal[POINT_STATUSES]

router = APIRouter(prefix="/results", tags=["results"])

# finished pages (JSON bytes or CSV), per (store, filters, page, format, token shown, revision of the page's rows:
# `crud.results_revision`); a request computes the revision (a light query) and builds the page only when it changed
RESULT_PAGES = SweepPageCache(size=32)
CACHED_LIMIT = 1000  # larger pages (up to 20,000 rows, tens of MB) are built each time, never kept

MAX_LIMIT = DEFAULT_MAX_POINTS_PER_SWEEP


@router.get("", response_model=ResultsPublic, dependencies=[Depends(require_read)],
            responses={200: {"content": {"text/csv": {}}, "description": "JSON page, or CSV with format=csv"}})
async def read_results(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    sweep: int | None = Query(None, ge=1, le=INT32_MAX, description="sweep id"),
    op: OpName | None = None,
    mode: list[ModeName] | None = Query(None, description="repeat to match several"),
    backend: str | None = Query(None, max_length=255, description="torch, triton, fla or a peer plugin's name"),
    direction: DirectionName | None = Query(None, description="fwd (forward step) or fwd+bwd (training step)"),
    B: int | None = Query(None, ge=1, le=INT32_MAX),
    T: int | None = Query(None, ge=1, le=2**63 - 1),
    W: int | None = Query(None, ge=1, le=INT32_MAX),
    lb: float | None = Query(None, ge=-1e300, le=0),
    device: str | None = Query(None, description="device name of the environment, e.g. 'NVIDIA H200' or 'cpu'"),
    status: StatusName | None = Query(None, description="point status"),
    skip: int = Query(0, ge=0, le=INT32_MAX),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    format: Literal["json", "csv"] = "json",
) -> Any:
    """Results of points, filtered by sweep, op, mode, backend, direction, B, T, W, lb, device and status.

    Without the token, `worker` and `host` are null; `error` is a failed point's summary line in every case.
    """
    filters = {"sweep_id": sweep, "op": op, "mode": tuple(mode) if mode else None, "backend": backend,
               "direction": direction, "B": B, "T": T, "W": W, "lb": lb, "device": device, "status": status}
    trusted = is_trusted(request, credentials)
    return await run_in_session(request, _answer, filters, skip=skip, limit=limit, trusted=trusted, format=format,
                                sweep=sweep)


def _answer(session: Session, filters: dict[str, Any], *, skip: int, limit: int, trusted: bool, format: str,
            sweep: int | None) -> Response:
    """The page's response: kept per revision of its rows (`RESULT_PAGES`) up to `CACHED_LIMIT` rows."""
    build = lambda: _page(session, filters, skip=skip, limit=limit, trusted=trusted, csv=format == "csv")  # noqa: E731
    if limit > CACHED_LIMIT:
        page = build()
    else:
        revision = crud.results_revision(session, skip=skip, limit=limit, **filters)
        key = (str(session.get_bind().engine.url), tuple(filters.items()), skip, limit, format, trusted, revision)
        page = RESULT_PAGES.get(key, build)
    if format == "csv":
        name = f"cpbench-results{'-sweep' + str(sweep) if sweep is not None else ''}.csv"
        return Response(page["body"], media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{name}"', "X-Total-Count": str(page["count"])})
    return Response(page["body"], media_type="application/json")


def _page(session: Session, filters: dict[str, Any], *, skip: int, limit: int, trusted: bool, csv: bool) -> dict[str, Any]:
    """The body of a results page ({"body": bytes or CSV text, "count"}), as `RESULT_PAGES` keeps it."""
    rows, count = crud.list_results(session, skip=skip, limit=limit, **filters)
    for row in rows:
        row["error"] = crud.short_error(row["error"])
        if not trusted:
            row.update(worker=None, host=None)
    if csv:
        return {"body": to_csv(rows, crud.RESULT_FIELDS), "count": count}
    # serialized as the schema says, without validating again what the store's typed columns gave (a third of the
    # page's CPU): pydantic-core's JSON, non-finite numbers as null, as the response model would
    return {"body": to_json({"data": rows, "count": count}, inf_nan_mode="null"), "count": count}
