"""`api_router`: every resource's router, mounted by `create_app` under /api/v1."""

from fastapi import APIRouter

from bench_server.api.routes import configs, results, sweeps, workers

api_router = APIRouter()
for module in (sweeps, results, configs, workers):
    api_router.include_router(module.router)
