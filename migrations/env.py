"""Alembic environment: the service's models are the target; the URL comes from FXTUNE_*."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, text

from service.db.engine import make_engine
from service.db.models import Base, UTCDateTime

target_metadata = Base.metadata

# Any two service processes may start at once against one PostgreSQL; one migrates, one waits.
_PG_LOCK_KEY = 0x6678_7475_6E65


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_item=_render_item,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        context.run_migrations()


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.core.config import Settings

    return Settings().resolved_database_url


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
