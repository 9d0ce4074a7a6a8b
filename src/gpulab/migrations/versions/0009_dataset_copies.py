"""The dataset cache's copies in the database (gpulab.data.datasets): one row per (node,
volume), shared by the hub (notebooks) and the service (jobs), with its size, state, pull
lease, pins and last use.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dataset_copies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("volume", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("lease_until", sa.DateTime, nullable=True),
        sa.Column("pins", sa.Text, nullable=True),
        sa.Column("last_used", sa.DateTime, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.UniqueConstraint("instance", "node", "volume"),
    )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
