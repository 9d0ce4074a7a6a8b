"""Notebooks that wait for GPUs: the queue's rows beside the jobs' (gpulab.gpus.waits).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_waits",
        sa.Column("instance", sa.String(64), primary_key=True),
        sa.Column("workload", sa.String(255), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False, index=True),
        sa.Column("groups", sa.Text, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.Column("until", sa.DateTime, nullable=False),
        sa.Column("granted", sa.Integer, nullable=False),
        sa.Column("place", sa.Integer, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
