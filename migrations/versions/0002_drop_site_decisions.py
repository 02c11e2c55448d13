"""Drop site_decisions: the config JSON is the one source of per-site decisions.

The table was a lossy copy (reason folded into the verdict; count, summary and rounds dropped)
that nothing read, yet every /report request loaded it.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_site_decisions_site_id"), table_name="site_decisions")
    op.drop_index(op.f("ix_site_decisions_config_id"), table_name="site_decisions")
    op.drop_table("site_decisions")


def downgrade() -> None:
    op.create_table(
        "site_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("site_id", sa.String(length=128), nullable=False),
        sa.Column("pass_names", sa.JSON(), nullable=False),
        sa.Column("baseline_s", sa.Float(), nullable=True),
        sa.Column("candidate_s", sa.Float(), nullable=True),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("verdict", sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(
            ["config_id"],
            ["tuned_configs.id"],
            name=op.f("fk_site_decisions_config_id_tuned_configs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_site_decisions")),
    )
    op.create_index(op.f("ix_site_decisions_config_id"), "site_decisions", ["config_id"])
    op.create_index(op.f("ix_site_decisions_site_id"), "site_decisions", ["site_id"])
