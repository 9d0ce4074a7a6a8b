"""Retention of ended jobs: ``jobs.delete_at``, when an ended job that set its own
``auto_delete_after`` is deleted (indexed: the service's sweep looks it up every minute).
A new column, empty for every existing job (none set the field before): nothing moves.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("delete_at", sa.DateTime, nullable=True))
    op.create_index("ix_jobs_delete_at", "jobs", ["delete_at"])


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
