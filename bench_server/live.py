"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread: for tests and benchmarks that go over HTTP.

    with LiveServer(create_app(settings)) as server:
        httpx.get(server.url + "/healthz")

`tcp_socket()` makes the listening socket of this and of `cpbench serve`: an IPPROTO_TCP socket with TCP_NODELAY.
asyncio sets TCP_NODELAY on an accepted connection only when its socket says IPPROTO_TCP (a plain
`socket(AF_INET, SOCK_STREAM)` says 0), and Linux copies the listener's TCP_NODELAY to what it accepts; without it,
Nagle's algorithm and the client's delayed ACK hold each kept-alive answer's last segment for about 40 ms.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn


def tcp_socket(host: str) -> socket.socket:
    """An unbound TCP socket for `host` (IPv6 when it holds a colon) with SO_REUSEADDR and TCP_NODELAY."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class LiveServer:
    """`sock`: a bound socket to serve on (default: a new one on `host`, a free port)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = tcp_socket(host)
            sock.bind((host, 0))
        self.sock = sock
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name=f"uvicorn-{self.port}")

    def start(self, timeout_s: float = 15.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
