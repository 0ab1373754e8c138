"""Alembic environment for the cpbench store.

The URL comes from, in order: `config.attributes["url"]` (set by `db.migrate`), the `sqlalchemy.url` option,
then `CPBENCH_DATABASE_URL` (`db.settings`). `config.attributes["connection"]` may carry an open connection
to migrate instead. SQLite gets batch mode (ALTER TABLE through table copies); types are compared so that a
column type change shows up in autogenerate.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

import db.models  # noqa: F401  (registers every table on Base.metadata)
from db.base import Base
from db.session import get_engine, resolve_url
from db.types import UTCDateTime

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return resolve_url(config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or None)


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    # migrations spell the plain type, so they do not import db.types
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        **kwargs,
    )


def run_migrations_offline() -> None:
    url = _url()
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"}, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    with get_engine(_url()).connect() as connection:
        _run(connection)
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
