"""Store settings from the environment (prefix `CPBENCH_`): the database URL and the artifact folder.

| variable                | default                                 | meaning                                            |
| ----------------------- | --------------------------------------- | -------------------------------------------------- |
| `CPBENCH_DATABASE_URL`  | `sqlite:///<cwd>/.cpbench/cpbench.db`   | SQLAlchemy URL; `postgresql://` means psycopg 3    |
| `CPBENCH_ARTIFACT_DIR`  | `.cpbench/artifacts`                    | where trace files and other artifacts are written  |
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_database_url() -> str:
    return f"sqlite:///{Path.cwd() / '.cpbench' / 'cpbench.db'}"


def normalize_url(url: str) -> str:
    """Pick the psycopg 3 driver for bare PostgreSQL URLs (`postgresql://`, `postgres://`); others pass unchanged."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def check_database_url(value: str) -> str:
    """The validator of every settings class holding CPBENCH_DATABASE_URL: refuse an empty URL, normalise the driver."""
    value = value.strip()
    if not value:
        raise ValueError("CPBENCH_DATABASE_URL is empty; give an SQLAlchemy URL such as sqlite:///path/to/cpbench.db")
    return normalize_url(value)


class DbSettings(BaseSettings):
    """Where the store lives. Read once per process through `get_db_settings()`."""

    model_config = SettingsConfigDict(env_prefix="CPBENCH_", extra="ignore")

    DATABASE_URL: str = Field(default_factory=default_database_url)
    ARTIFACT_DIR: Path = Path(".cpbench/artifacts")

    @field_validator("DATABASE_URL")
    @classmethod
    def _normalize(cls, value: str) -> str:
        return check_database_url(value)


@lru_cache(maxsize=1)
def get_db_settings() -> DbSettings:
    return DbSettings()
