"""The API token: where it comes from (environment, the token file, or generated on first start) and how a
presented bearer token is checked (constant time).

When `CPBENCH_API_TOKEN` is unset, the first start generates a token, writes it to `.cpbench/api_token` beside the
SQLite database (beside the working directory for other databases; `CPBENCH_TOKEN_FILE` overrides), mode 600, and
logs it once at WARNING; later starts read the same file and say only where it is. A token read from the file
needs as many characters as CPBENCH_API_TOKEN (`MIN_TOKEN_CHARS`), and a file that other users may read (or write)
is refused with the `chmod 600` that fixes it: a token others can read guards nothing. Every refusal is one
`TokenFileError` line that never shows the token.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from bench_server.core.config import MIN_TOKEN_CHARS, ServerSettings
from db.session import is_sqlite, sqlite_path
from runners.errors import CpbenchError

__all__ = ["ApiToken", "TokenFileError", "ensure_api_token", "token_file", "verify_token"]

logger = logging.getLogger(__name__)

TOKEN_FILE_NAME = "api_token"


@dataclass(frozen=True)
class ApiToken:
    """The token writes need, and where it came from: "env", "file" or "generated" (new in `path`)."""

    token: str
    source: str
    path: Path | None = None


def token_file(settings: ServerSettings) -> Path:
    """`<db dir>/.cpbench/api_token` for an SQLite file (the db dir itself when it is named `.cpbench`)."""
    if settings.TOKEN_FILE is not None:
        return settings.TOKEN_FILE
    url = settings.DATABASE_URL
    db_file = sqlite_path(url) if is_sqlite(url) else None
    folder = db_file.resolve().parent if db_file is not None else Path.cwd()
    state = folder if folder.name == ".cpbench" else folder / ".cpbench"
    return state / TOKEN_FILE_NAME


class TokenFileError(CpbenchError):
    """The token file cannot be used (too short, empty, or readable by others); the message says the fix."""


def _read(path: Path) -> str | None:
    """The token stored in `path`, None when there is no such file; refuses a file others may access or a short token."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise TokenFileError(f"cannot read the token file {path}: {err.strerror}") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileError(
            f"token file {path} is accessible to other users (mode {stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
        )
    if len(token) < MIN_TOKEN_CHARS:
        what = "is empty" if not token else f"holds a token of {len(token)} characters"
        raise TokenFileError(
            f"token file {path} {what}; a token needs at least {MIN_TOKEN_CHARS}: delete the file "
            "(a new token is generated at the next start) or set CPBENCH_API_TOKEN"
        )
    return token


def ensure_api_token(settings: ServerSettings, *, announce: bool = True) -> ApiToken:
    """The configured token, or the stored one, or a new one stored now (mode 600) and logged once.

    `announce=False`: the caller shows a generated token itself (`cpbench serve` prints it); it is not logged.
    """
    if settings.API_TOKEN:
        return ApiToken(settings.API_TOKEN, "env")
    path = token_file(settings)
    if (token := _read(path)) is not None:
        logger.info("API token read from %s", path)
        return ApiToken(token, "file", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:
        # O_EXCL: two processes starting at once agree on whichever token was written first
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # written meanwhile by another process: it may still be empty for an instant
        stored = _read(path)
        if stored is None:
            raise TokenFileError(f"token file {path} vanished while starting; start again") from None
        return ApiToken(stored, "file", path)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    if announce:
        logger.warning("generated API token (stored in %s; send it as 'Authorization: Bearer <token>'): %s", path, token)
    return ApiToken(token, "generated", path)


def verify_token(presented: str | None, expected: str) -> bool:
    return presented is not None and secrets.compare_digest(presented.encode(), expected.encode())
