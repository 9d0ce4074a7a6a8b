"""Retention at scale (issue #32): an index (instance, updated) on jobs, so that the retention
sweep's pick of the jobs that ended longest ago is a walk that stops at its batch instead of a
read of every ended job; and notebooks.billed_pruned_us, the billed time of the part of a
notebook's history that retention deleted (its usage adds it to what the kept history bills).
Nothing moves; building the index reads the jobs table once (seconds for 100,000 jobs).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_instance_updated", "jobs", ["instance", "updated"])
    with op.batch_alter_table("notebooks") as batch:
        batch.add_column(
            sa.Column("billed_pruned_us", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
