"""Schema migrations for the store: `upgrade()` (what `cpbench db upgrade` runs) and `require_migrated()`, which
the worker and the server call before they start, so they refuse an unmigrated database with the command to run.

The Alembic Config is built here from `db/alembic.ini` with absolute paths, so nothing depends on the cwd.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from db.errors import StoreNotMigratedError
from db.session import get_engine, is_sqlite, resolve_url, sqlite_path

logger = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    """The Alembic Config for the store at `url` (default: `CPBENCH_DATABASE_URL`)."""
    config = Config(str(_HERE / "alembic.ini"))
    config.set_main_option("script_location", str(_HERE / "migrations"))
    config.remove_main_option("prepend_sys_path")
    config.attributes["url"] = resolve_url(url)
    return config


def safe_url(url: str) -> str:
    """`url` with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def head_revision() -> str:
    """The newest revision shipped with this code."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, "db/migrations/versions holds no revision"
    return head


def current_revision(url: str | None = None) -> str | None:
    """The revision the database at `url` is at, or None when it has never been migrated."""
    url = resolve_url(url)
    if is_sqlite(url):
        path = sqlite_path(url)
        if path is not None and not path.exists():
            return None  # do not create an empty file just to look
    with get_engine(url).connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(url: str | None = None, revision: str = "head") -> str | None:
    """Migrate the database at `url` to `revision` (creating it on SQLite); returns the revision reached."""
    url = resolve_url(url)
    logger.info("upgrading %s to %s", safe_url(url), revision)
    command.upgrade(alembic_config(url), revision)
    return current_revision(url)


def downgrade(url: str | None = None, revision: str = "base") -> str | None:
    """Migrate the database at `url` back to `revision`; returns the revision reached (None at base)."""
    url = resolve_url(url)
    logger.info("downgrading %s to %s", safe_url(url), revision)
    command.downgrade(alembic_config(url), revision)
    return current_revision(url)


def require_migrated(url: str | None = None) -> None:
    """Raise `StoreNotMigratedError` unless the database at `url` is at the head revision."""
    url = resolve_url(url)
    current, head = current_revision(url), head_revision()
    if current != head:
        raise StoreNotMigratedError(
            f"database at {safe_url(url)} is not migrated (at {current or 'empty'}, head is {head}): run `cpbench db upgrade`"
        )
