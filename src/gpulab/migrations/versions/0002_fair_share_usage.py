"""The fair share's table: each user's recent GPU use, decayed (gpulab.fairshare).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fair_share_usage",
        sa.Column("instance", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(255), primary_key=True),
        sa.Column("gpu_seconds", sa.Float, nullable=False),
        sa.Column("as_of", sa.DateTime, nullable=False),
        sa.Column("groups", sa.Text, nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
