"""Distributed jobs: the world size and every rank's uploaded program (issue 13).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Add jobs.world_size (existing jobs: 1 rank) and jobs.rank_models (NULL: 1 rank)."""
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(
            sa.Column('world_size', sa.Integer(), server_default='1', nullable=False)
        )
        batch.add_column(sa.Column('rank_models', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('rank_models')
        batch.drop_column('world_size')
