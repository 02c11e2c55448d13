"""Alembic is the only way the schema changes: head must equal the models, on both backends."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from service.db.engine import make_engine
from service.db.migrate import (
    SchemaMismatch,
    alembic_config,
    current_revision,
    head_revision,
    upgrade_to_head,
)
from service.db.models import Base


def test_head_matches_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert upgrade_to_head(engine) == head_revision()
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
        assert upgrade_to_head(engine) == head_revision()  # idempotent on restart
    finally:
        engine.dispose()


def test_downgrade_to_base_removes_every_table(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade_to_head(engine)
        cfg = alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()


def test_refuses_a_database_from_a_newer_fxtune(tmp_path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        upgrade_to_head(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
        with pytest.raises(SchemaMismatch, match="from_the_future"):
            upgrade_to_head(engine)
    finally:
        engine.dispose()


def test_upgrading_drops_the_duplicate_site_table_and_keeps_configs(tmp_path) -> None:
    """0002 removes site_decisions (a lossy copy of the config JSON) and nothing else."""
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        cfg = alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0001")
        assert "site_decisions" in inspect(engine).get_table_names()
        assert upgrade_to_head(engine) == head_revision()
        tables = set(inspect(engine).get_table_names())
        assert "site_decisions" not in tables
        assert {"models", "jobs", "tuned_configs", "profiles"} <= tables
    finally:
        engine.dispose()
