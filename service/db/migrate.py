"""Bring a database to the schema this code expects, through Alembic and nothing else."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Engine

from service.db.engine import IMMEDIATE
from service.package_data import package_dir

# The repository's migrations/ directory, shipped in the wheel as the package service.migrations.
MIGRATIONS_PACKAGE = "service.migrations"


class SchemaMismatch(RuntimeError):
    """The database holds a schema revision this version of fxtune does not know."""


def migrations_dir() -> Path:
    return package_dir(MIGRATIONS_PACKAGE)


def alembic_config() -> Config:
    """alembic.ini's settings that matter at run time, in code: the service reads no .ini file
    (alembic.ini is for developers running `alembic` from the repository)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("path_separator", "os")
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise SchemaMismatch(f"no migrations found under {migrations_dir()}")
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade_to_head(engine: Engine) -> str:
    """Upgrade in one transaction; refuse clearly when the database is ahead of this code."""
    cfg = alembic_config()
    current = current_revision(engine)
    known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    if current is not None and current not in known:
        raise SchemaMismatch(
            f"the database is at schema revision {current!r}, which this fxtune does not know "
            f"(its newest is {head_revision()!r}); upgrade fxtune or point FXTUNE_DATABASE_URL "
            "at another database"
        )
    with engine.connect().execution_options(**{IMMEDIATE: True}) as conn, conn.begin():
        cfg.attributes["connection"] = conn
        try:
            command.upgrade(cfg, "head")
        except CommandError as exc:
            raise SchemaMismatch(f"could not migrate the database: {exc}") from exc
    return head_revision()
