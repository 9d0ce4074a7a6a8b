"""Job arrays (sweeps): a job's kind ("job", "array" or "task"), a task's array and index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="job"))
        batch.add_column(sa.Column("parent", sa.String(32), nullable=False, server_default=""))
        batch.add_column(sa.Column("task_index", sa.Integer, nullable=True))
        batch.create_index("ix_jobs_parent", ["parent"])


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
