"""Each run's wall time in the job record (issue 47): the tuning child's seconds per attempt.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """jobs.run_seconds: a list, one entry per attempt a worker reported; NULL before."""
    op.add_column('jobs', sa.Column('run_seconds', sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column('jobs', 'run_seconds')
