"""Indexes for pages that stay flat with a year of records (issue #32): the newest jobs
(instance, submitted, id), a user's newest (instance, owner, submitted, id), a user's jobs by
state (instance, owner, state, kind) and everyone's counts by state and the live jobs
(instance, state, kind), and a month's report by user (billed_months: instance, month,
owner). Each is what one page or list reads:
a walk of the index that stops at the page's end, or counts without reading the rows.
Nothing moves; building them reads the jobs table once (seconds for 100,000 jobs).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_instance_submitted", "jobs", ["instance", "submitted", "id"])
    op.create_index(
        "ix_jobs_instance_owner_submitted", "jobs", ["instance", "owner", "submitted", "id"]
    )
    op.create_index("ix_jobs_instance_owner_state", "jobs", ["instance", "owner", "state", "kind"])
    op.create_index("ix_jobs_instance_state", "jobs", ["instance", "state", "kind"])
    op.create_index(
        "ix_billed_months_instance_month", "billed_months", ["instance", "month", "owner"]
    )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
