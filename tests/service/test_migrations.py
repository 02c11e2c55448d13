"""Alembic is the only way the schema changes: head must equal the models, on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from service.db.engine import make_engine
from service.db.migrate import (
    SchemaMismatch,
    alembic_config,
    current_revision,
    head_revision,
    upgrade_to_head,
)
from service.db.models import Base, utcnow


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


def _insert_config(conn: Any, mode: str | None) -> None:
    columns = {
        "model_id": 1,
        "device": "cpu",
        "hardware_key": "cpu|x|torch2.13.0|t1",
        "hardware": "{}",
        "fingerprint": "f" * 32,
        "config": "{}",
        "etag": '"e"',
        "program_sha256": "p" * 64,
        "report_sha256": "r" * 64,
        "created_at": utcnow(),
        "updated_at": utcnow(),
    }
    if mode is not None:
        columns["mode"] = mode
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    conn.execute(text(f"INSERT INTO tuned_configs ({names}) VALUES ({values})"), columns)


def _modes(engine: Any) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT mode FROM tuned_configs")).scalars())


def test_0005_keys_configs_by_mode_and_its_downgrade_drops_training_ones(db_url: str) -> None:
    """Configs from before training jobs read as inference ones; a training config of the same
    model, device and hardware then fits beside them (and only one per mode)."""
    engine = make_engine(db_url)
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0004")
            conn.execute(
                text(
                    "INSERT INTO models (id, sha256, name, size_bytes, created_at) "
                    "VALUES (1, :sha, 'm', 1, :now)"
                ),
                {"sha": "a" * 64, "now": utcnow()},
            )
            _insert_config(conn, None)
        assert upgrade_to_head(engine) == head_revision()
        assert _modes(engine) == ["infer"]
        with engine.begin() as conn:
            _insert_config(conn, "train")
        assert _modes(engine) == ["infer", "train"]
        with pytest.raises(IntegrityError), engine.begin() as conn:
            _insert_config(conn, "train")
        with pytest.raises(IntegrityError), engine.begin() as conn:
            _insert_config(conn, "serve")
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tuned_configs")).scalar() == 1
    finally:
        engine.dispose()
