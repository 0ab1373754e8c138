"""Dependencies of the routes, as `Annotated` aliases: a database session, the settings, and the token checks.

`require_token` guards every write: no `Authorization: Bearer` header → 401 (with `WWW-Authenticate: Bearer`), a
wrong token → 403. `require_read` does the same for reads only when `CPBENCH_READS_OPEN` is false.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from bench_server.core.config import ServerSettings
from bench_server.core.security import verify_token

__all__ = ["SessionDep", "bearer", "SettingsDep", "get_db", "get_settings_dep", "require_read", "require_token"]

bearer = _bearer = HTTPBearer(auto_error=False, description="The API token (CPBENCH_API_TOKEN, or the one generated at first start)")


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessionmaker() as session:
        yield session


def get_settings_dep(request: Request) -> ServerSettings:
    return request.app.state.settings


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings_dep)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    if credentials is None:
        raise HTTPException(status_code=status.HTTP_401_UNAUTHORIZED, detail="Not authenticated: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    if not verify_token(credentials.credentials, request.app.state.api_token):
        raise HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail="Invalid token")


def require_token(request: Request, credentials: Credentials) -> None:
    """Writes: a valid bearer token or 401/403."""
    _check(request, credentials)


def require_read(request: Request, credentials: Credentials) -> None:
    """Reads: open by default; with CPBENCH_READS_OPEN=false, as for writes."""
    if not request.app.state.settings.READS_OPEN:
        _check(request, credentials)
