"""Request hygiene and response headers, as one pure ASGI middleware.

- A NUL character anywhere in the path or the query string (`%00` or raw) gets a 422 JSON answer before any route
  runs: neither the stores nor the logs can hold it.
- Every response carries `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY`, `Referrer-Policy` and a
  Content-Security-Policy that allows only this origin's scripts and styles (the offline plotly and Swagger UI
  bundles, and the pages' own inline scripts), no framing, no plugins and no foreign connections.
"""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "SECURITY_HEADERS", "HardeningMiddleware"]

CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"content-security-policy", CSP.encode()),
)


def _has_nul(scope: Scope) -> bool:
    raw_path = scope.get("raw_path") or scope.get("path", "").encode()
    for part in (raw_path, scope.get("query_string", b""), scope.get("path", "").encode()):
        if b"\x00" in part or b"\x00" in unquote_to_bytes(part):
            return True
    return False


class HardeningMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in SECURITY_HEADERS if h[0] not in names)]
            await send(message)

        if _has_nul(scope):
            payload = json.dumps({"detail": [{"loc": ["query"], "msg": "the URL must not contain a NUL character",
                                              "type": "nul"}]}).encode()
            await send_with_headers({"type": "http.response.start", "status": 422,
                                     "headers": [(b"content-type", b"application/json"),
                                                 (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        await self.app(scope, receive, send_with_headers)
