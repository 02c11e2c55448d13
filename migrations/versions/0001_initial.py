"""Initial schema: models, jobs, tuned configs, site decisions, profiles.

Revision ID: 0001
Revises: 
Create Date: 2026-01-01

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('sha256', name=op.f('uq_models_sha256'))
    )
    op.create_index(op.f('ix_models_fingerprint'), 'models', ['fingerprint'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('device', sa.String(length=16), nullable=False),
    sa.Column('budget_s', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('lease_token', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('not_before', sa.DateTime(timezone=True), nullable=True),
    sa.Column('progress', sa.Float(), nullable=False),
    sa.Column('message', sa.String(length=500), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('worker_id', sa.String(length=255), nullable=True),
    sa.Column('worker_hardware', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')", name=op.f('ck_jobs_status')),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_jobs_model_id_models'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    op.create_index('ix_jobs_claim', 'jobs', ['status', 'device', 'not_before'], unique=False)
    op.create_index(op.f('ix_jobs_model_id'), 'jobs', ['model_id'], unique=False)

    op.create_table('tuned_configs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('device', sa.String(length=16), nullable=False),
    sa.Column('hardware_key', sa.String(length=255), nullable=False),
    sa.Column('hardware', sa.JSON(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('etag', sa.String(length=80), nullable=False),
    sa.Column('program_sha256', sa.String(length=64), nullable=False),
    sa.Column('aoti_sha256', sa.String(length=64), nullable=True),
    sa.Column('report_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_tuned_configs_job_id_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_tuned_configs_model_id_models'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tuned_configs')),
    sa.UniqueConstraint('model_id', 'device', 'hardware_key', name='uq_tuned_configs_target')
    )
    op.create_index('ix_tuned_configs_lookup', 'tuned_configs', ['fingerprint', 'device'], unique=False)
    op.create_index(op.f('ix_tuned_configs_model_id'), 'tuned_configs', ['model_id'], unique=False)

    op.create_table('profiles',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('trace_sha256', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['config_id'], ['tuned_configs.id'], name=op.f('fk_profiles_config_id_tuned_configs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_profiles')),
    sa.UniqueConstraint('config_id', 'kind', name='uq_profiles_config_kind')
    )
    op.create_table('site_decisions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('site_id', sa.String(length=128), nullable=False),
    sa.Column('pass_names', sa.JSON(), nullable=False),
    sa.Column('baseline_s', sa.Float(), nullable=True),
    sa.Column('candidate_s', sa.Float(), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('ci_low', sa.Float(), nullable=True),
    sa.Column('ci_high', sa.Float(), nullable=True),
    sa.Column('accepted', sa.Boolean(), nullable=False),
    sa.Column('verdict', sa.String(length=500), nullable=True),
    sa.ForeignKeyConstraint(['config_id'], ['tuned_configs.id'], name=op.f('fk_site_decisions_config_id_tuned_configs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_site_decisions'))
    )
    op.create_index(op.f('ix_site_decisions_config_id'), 'site_decisions', ['config_id'], unique=False)
    op.create_index(op.f('ix_site_decisions_site_id'), 'site_decisions', ['site_id'], unique=False)



def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(op.f('ix_site_decisions_site_id'), table_name='site_decisions')
    op.drop_index(op.f('ix_site_decisions_config_id'), table_name='site_decisions')

    op.drop_table('site_decisions')
    op.drop_table('profiles')
    op.drop_index(op.f('ix_tuned_configs_model_id'), table_name='tuned_configs')
    op.drop_index('ix_tuned_configs_lookup', table_name='tuned_configs')

    op.drop_table('tuned_configs')
    op.drop_index(op.f('ix_jobs_model_id'), table_name='jobs')
    op.drop_index('ix_jobs_claim', table_name='jobs')

    op.drop_table('jobs')
    op.drop_index(op.f('ix_models_fingerprint'), table_name='models')

    op.drop_table('models')
