"""A notebook waiting for GPUs waits for its GPU model and node pool: gpu_waits.gpu_model and
node_pool ("" for any).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_waits") as batch:
        batch.add_column(sa.Column("gpu_model", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("node_pool", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
