"""Server settings from the environment (prefix `CPBENCH_`), read once per process by `get_settings()`.

| variable                       | default                               | meaning                                                     |
| ------------------------------ | ------------------------------------- | ----------------------------------------------------------- |
| `CPBENCH_DATABASE_URL`         | `sqlite:///<cwd>/.cpbench/cpbench.db` | the store (same variable as the worker's)                   |
| `CPBENCH_API_TOKEN`            | unset                                 | bearer token for writes; unset: generated once, kept in `.cpbench/api_token` beside the database |
| `CPBENCH_READS_OPEN`           | true                                  | false: reads (API and dashboards) need the token too        |
| `CPBENCH_MAX_BODY_BYTES`       | 1048576                               | larger request bodies get 413                               |
| `CPBENCH_MAX_POINTS_PER_SWEEP` | 20000                                 | read by the spec (`runners.settings`): a larger grid gets 413 |
| `CPBENCH_TOKEN_FILE`           | unset                                 | where a generated token is kept, instead of the default     |
| `CPBENCH_STORE_WAIT_S`         | 5                                     | longest wait of a request for the store (SQLite write lock, PostgreSQL connection or lock); then 503 |
| `CPBENCH_SUBMIT_POOL_BYTES`    | 131072                                | POST /sweeps bodies of this size or more are validated and stored in the submit process (`core.submit_pool`); 0: every body |
| `CPBENCH_SUBMIT_POOL`          | true                                  | false: every body in the server's own process                |

Tests build a `ServerSettings(...)` and pass it to `create_app(settings)`; `get_settings.cache_clear()` re-reads.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from db.settings import check_database_url, get_db_settings

__all__ = ["API_V1_STR", "MIN_TOKEN_CHARS", "ServerSettings", "check_token_length", "get_settings"]

API_V1_STR = "/api/v1"
MIN_TOKEN_CHARS = 16


def check_token_length(token: str, where: str) -> None:
    """A token shorter than MIN_TOKEN_CHARS is refused; the message gives its length, never the token."""
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where} must be at least {MIN_TOKEN_CHARS} characters, got {len(token)}")


class ServerSettings(BaseSettings):
    """What `create_app` needs: the store, the token policy and the request limits."""

    # hide_input_in_errors: a refused CPBENCH_API_TOKEN is never echoed
    model_config = SettingsConfigDict(env_prefix="CPBENCH_", env_ignore_empty=True, extra="ignore", hide_input_in_errors=True)

    # an unset (or, with env_ignore_empty, empty) variable falls back to the store's own settings, which refuse an
    # empty URL: so every command treats CPBENCH_DATABASE_URL="" alike
    DATABASE_URL: str = Field(default_factory=lambda: get_db_settings().DATABASE_URL)
    API_TOKEN: str | None = None
    READS_OPEN: bool = True
    MAX_BODY_BYTES: int = Field(1 << 20, ge=1024)
    TOKEN_FILE: Path | None = None
    STORE_WAIT_S: float = Field(5.0, gt=0, le=300)
    SUBMIT_POOL_BYTES: int = Field(128 << 10, ge=0)
    SUBMIT_POOL: bool = True

    @field_validator("DATABASE_URL")
    @classmethod
    def _normalize(cls, value: str) -> str:
        return check_database_url(value)

    @field_validator("API_TOKEN")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        if value is not None:
            check_token_length(value.strip(), "CPBENCH_API_TOKEN")
        return value.strip() if value else None


@lru_cache(maxsize=1)
def get_settings() -> ServerSettings:
    return ServerSettings()
