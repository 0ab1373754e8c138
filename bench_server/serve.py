"""`cpbench serve`: the API and the dashboards with uvicorn (`bench_server.main.create_app`).

    cpbench serve [--host 127.0.0.1] [--port 8000] [--db URL] [--demo] [--log-level info]

Refuses an unmigrated store (run `cpbench db upgrade`). Prints the API token once when it was just generated
(CPBENCH_API_TOKEN unset, no token file yet). `--demo`: when the store holds no sweep, submits
runners/suites/demo.yaml; then starts one worker in a background process (`runners.worker.run_worker`), stopped
with the server, and prints the dashboard URL. `--port 0` picks a free port (the URL printed is the real one).
The app's submit process (large POST /sweeps bodies, `bench_server.core.submit_pool`) starts and stops with the
server (the app's lifespan): SIGTERM or Ctrl-C leaves no child behind.

The verb lives in bench_server (the top of the dependency graph) and `bench_server.cli` adds it to the engine's
`runners.cli` app: runners never imports the server.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import socket
from pathlib import Path
from typing import Any

import typer

from runners.cli.common import DbOption
from runners.errors import CpbenchError

__all__ = ["DEMO_SPEC", "register", "serve"]

DEMO_SPEC = Path(__file__).resolve().parent.parent / "runners" / "suites" / "demo.yaml"


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket; its accepted connections get TCP_NODELAY (`bench_server.live.tcp_socket`)."""
    from bench_server.live import tcp_socket

    sock = tcp_socket(host)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise CpbenchError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _submit_demo(url: str) -> int | None:
    """Queue the demo sweep when the store holds no sweep; returns its id (None when sweeps exist)."""
    from db import crud
    from db.session import session_scope
    from runners.engine import submit_spec

    with session_scope(url) as s:
        if crud.list_sweeps(s, skip=0, limit=1)[1] > 0:
            return None
        if not DEMO_SPEC.is_file():
            raise CpbenchError(f"demo spec {DEMO_SPEC} is missing from this installation")
        return submit_spec(s, DEMO_SPEC).id


def _demo_worker(url: str, verbose: int = 0) -> None:  # the child: SIGTERM makes run_worker release its point and return
    from runners.cli.logs import quiet
    from runners.worker import run_worker

    logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                        format="%(asctime)s worker %(levelname)s %(name)s: %(message)s")
    quiet(verbose)
    run_worker(url)


_SIGTERM_EXIT = "sigterm"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(_SIGTERM_EXIT)


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 for every interface)"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port; 0 picks a free one"),
    db: DbOption = None,
    demo: bool = typer.Option(False, "--demo", help="queue the demo sweep into an empty store and run one worker"),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level"),
) -> None:
    """Serve the REST API (/api/v1, docs at /docs) and the dashboards."""
    import uvicorn

    from bench_server.core.config import ServerSettings
    from bench_server.core.security import ensure_api_token
    from bench_server.main import create_app
    from db.migrate import require_migrated

    overrides: dict[str, Any] = {"DATABASE_URL": db} if db else {}
    settings = ServerSettings(**overrides)
    url = settings.DATABASE_URL
    require_migrated(url)
    token = ensure_api_token(settings, announce=False)
    if token.source == "generated":
        typer.echo(f"API token (stored in {token.path}; shown once): {token.token}")
    app = create_app(settings)
    gc.freeze()  # the modules' and the app's objects: the collector no longer walks them (its full passes are shorter)
    sock = _bind(host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base = f"http://{shown}:{sock.getsockname()[1]}"
    worker = None
    if demo:
        sweep_id = _submit_demo(url)
        level = logging.getLogger().getEffectiveLevel()  # -v / -vv of this command
        verbose = 2 if level <= logging.DEBUG else (1 if level <= logging.INFO else 0)
        worker = multiprocessing.get_context("spawn").Process(target=_demo_worker, args=(url, verbose),
                                                              name="cpbench-demo-worker")
        worker.start()
        typer.echo(f"demo: sweep {sweep_id} queued; one worker started (pid {worker.pid})" if sweep_id is not None
                   else f"demo: the store already holds sweeps; one worker started (pid {worker.pid})")
        typer.echo(f"dashboard: {base}/sweeps/{sweep_id}" if sweep_id is not None else f"dashboard: {base}/")
    else:
        typer.echo(f"dashboard: {base}/")
    typer.echo(f"API docs: {base}/docs")
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, proxy_headers=False))
    # uvicorn re-raises a captured SIGTERM once it has shut down; with the default handler that would kill this
    # process before the worker is stopped, so turn it into a normal exit
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run(sockets=[sock])
    except SystemExit as stop:
        if stop.code != _SIGTERM_EXIT:
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        if worker is not None and worker.is_alive():
            worker.terminate()  # SIGTERM: the worker releases its point and marks itself stopped
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
