"""Jobs may name the sizes to tune dynamic dimensions at (issue 9).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Add jobs.sizes (NULL: the tuner's default sizes)."""
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('sizes', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('sizes')
