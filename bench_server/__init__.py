"""The cpbench service: a FastAPI app (`bench_server.main.create_app`) with the REST API under /api/v1, the
dashboard pages, /healthz and plotly.js served locally. Started by `cpbench serve`.
"""
