"""`api_router`: every resource's router, mounted by `create_app` under /api/v1; an undeclared query parameter is a
422 on each of its routes (`deps.reject_unknown_query`)."""

from fastapi import APIRouter, Depends

from bench_server.api.deps import reject_unknown_query
from bench_server.api.routes import configs, results, sweeps, workers

api_router = APIRouter(dependencies=[Depends(reject_unknown_query)])
for module in (sweeps, results, configs, workers):
    api_router.include_router(module.router)
