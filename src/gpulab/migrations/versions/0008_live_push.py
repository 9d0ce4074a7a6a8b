"""Live pushes of running workloads: jobs.push_requested and live_push, and the same on
notebooks (an owner's "push now" not yet started; the last live push's outcome, as JSON).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("jobs", "notebooks"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("push_requested", sa.DateTime(), nullable=True))
            batch.add_column(sa.Column("live_push", sa.Text(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
