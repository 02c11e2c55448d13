"""Quotas per caller: the identity each upload's bytes and each job are charged to (issue 47).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """models.owner and jobs.owner; rows from before quotas are charged to nobody (NULL)."""
    op.add_column('models', sa.Column('owner', sa.String(64), nullable=True))
    op.create_index(op.f('ix_models_owner'), 'models', ['owner'], unique=False)
    op.add_column('jobs', sa.Column('owner', sa.String(64), nullable=True))
    op.create_index('ix_jobs_owner', 'jobs', ['owner', 'status'], unique=False)


def downgrade() -> None:
    """Columns dropped in place (SQLite 3.35+ can): batch mode would copy `models` into a new
    table and drop the old one, and with foreign keys on that deletes every job and config."""
    op.drop_index('ix_jobs_owner', table_name='jobs')
    op.drop_column('jobs', 'owner')
    op.drop_index(op.f('ix_models_owner'), table_name='models')
    op.drop_column('models', 'owner')
