"""Request size limit as a pure ASGI middleware: bodies over `max_bytes` get 413 before any route sees them.

The body is read up to the limit and replayed to the app unchanged. Past the limit the rest is read and dropped
before the 413 goes out (a client still sending would otherwise see its connection reset instead of the answer),
unless the declared `Content-Length` is more than `DRAIN_FACTOR` times the limit: then the 413 goes out at once.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimitMiddleware"]

DRAIN_FACTOR = 16


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > DRAIN_FACTOR * self.max_bytes:
            await self._refuse(send, int(declared))
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                size = await self._drain(receive, message, size)
                await self._refuse(send, size)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, message: Message, size: int) -> int:
        while message.get("more_body", False) and size <= DRAIN_FACTOR * self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
        return size

    async def _refuse(self, send: Send, size: int) -> None:
        body: dict[str, Any] = {"detail": f"request body of {size} bytes is over the limit of {self.max_bytes} bytes "
                                          "(CPBENCH_MAX_BODY_BYTES)"}
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
