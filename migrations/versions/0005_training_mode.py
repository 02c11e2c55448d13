"""Training jobs: a job's mode and optimizer; configs keyed by mode as well (issue 12).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

MODES = "mode IN ('infer', 'train')"


def upgrade() -> None:
    """Existing jobs and configs are inference ones; a config's key gains its mode."""
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('mode', sa.String(8), server_default='infer', nullable=False))
        batch.add_column(sa.Column('optimizer', sa.String(16), nullable=True))
        batch.create_check_constraint(op.f('ck_jobs_mode'), MODES)
    op.drop_index('ix_tuned_configs_lookup', table_name='tuned_configs')
    with op.batch_alter_table('tuned_configs') as batch:
        batch.add_column(sa.Column('mode', sa.String(8), server_default='infer', nullable=False))
        batch.drop_constraint('uq_tuned_configs_target', type_='unique')
        batch.create_unique_constraint(
            'uq_tuned_configs_target', ['model_id', 'device', 'mode', 'hardware_key']
        )
        batch.create_check_constraint(op.f('ck_tuned_configs_mode'), MODES)
    op.create_index(
        'ix_tuned_configs_lookup', 'tuned_configs', ['fingerprint', 'device', 'mode'], unique=False
    )


def downgrade() -> None:
    """Training configs have no place in the older key: they are deleted, then the columns."""
    op.execute("DELETE FROM tuned_configs WHERE mode = 'train'")
    op.drop_index('ix_tuned_configs_lookup', table_name='tuned_configs')
    with op.batch_alter_table('tuned_configs') as batch:
        batch.drop_constraint(op.f('ck_tuned_configs_mode'), type_='check')
        batch.drop_constraint('uq_tuned_configs_target', type_='unique')
        batch.create_unique_constraint(
            'uq_tuned_configs_target', ['model_id', 'device', 'hardware_key']
        )
        batch.drop_column('mode')
    op.create_index(
        'ix_tuned_configs_lookup', 'tuned_configs', ['fingerprint', 'device'], unique=False
    )
    with op.batch_alter_table('jobs') as batch:
        batch.drop_constraint(op.f('ck_jobs_mode'), type_='check')
        batch.drop_column('optimizer')
        batch.drop_column('mode')
