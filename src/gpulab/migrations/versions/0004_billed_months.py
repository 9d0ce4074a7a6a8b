"""Billing totals per user per month, kept apart from the job records.

Adds ``billed_months`` (a user's billed job minutes and GPU-minutes settled in a month, UTC)
and ``jobs.settled_minutes`` (what of a job's bill is already in those totals), then fills
both from the records found: each job's history is read once and every closed billed
period's minutes are settled in the month it closed (:func:`gpulab.billing.settlements`,
the rule the service applies from now on), so that the usage API and the monthly report
answer what they answered before the upgrade. Job ids are read in chunks, so a large
database is not loaded whole.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import json
from collections import defaultdict

import sqlalchemy as sa
from alembic import op

from gpulab.billing import month_of, settlements

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_CHUNK = 500


def _gpus(spec_text: str | None) -> int:
    """Every worker's GPUs of a stored spec (as gpulab.jobs.usage.gpus_of reads it)."""
    try:
        spec = json.loads(spec_text) if spec_text else {}
        gpus = int((spec.get("resources") or {}).get("gpus") or 0)
        workers = max(1, int(spec.get("workers") or 1))
    except (TypeError, ValueError, AttributeError):
        return 0
    return gpus * workers


def upgrade() -> None:
    op.create_table(
        "billed_months",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("minutes", sa.BigInteger, nullable=False),
        sa.Column("gpu_minutes", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("instance", "owner", "month"),
    )
    op.create_index("ix_billed_months_owner", "billed_months", ["owner"])
    op.add_column(
        "jobs", sa.Column("settled_minutes", sa.Integer, nullable=False, server_default="0")
    )

    bind = op.get_bind()
    jobs = sa.table(
        "jobs",
        sa.column("id", sa.String),
        sa.column("instance", sa.String),
        sa.column("owner", sa.String),
        sa.column("spec", sa.Text),
        sa.column("settled_minutes", sa.Integer),
    )
    events = sa.table(
        "job_events",
        sa.column("id", sa.Integer),
        sa.column("job_id", sa.String),
        sa.column("kind", sa.String),
        sa.column("state", sa.String),
        sa.column("at", sa.DateTime),
    )
    totals: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    rows = bind.execute(
        sa.select(jobs.c.id, jobs.c.instance, jobs.c.owner, jobs.c.spec).order_by(jobs.c.id)
    ).all()
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        history: dict[str, list] = {row.id: [] for row in chunk}
        for e in bind.execute(
            sa.select(events.c.job_id, events.c.state, events.c.at)
            .where(events.c.job_id.in_(list(history)), events.c.kind == "transition")
            .order_by(events.c.job_id, events.c.id)
        ):
            history[e.job_id].append(e)
        for row in chunk:
            settled = 0
            for at, minutes in settlements(history[row.id]):
                key = (row.instance, row.owner, month_of(at))
                totals[key][0] += minutes
                totals[key][1] += minutes * _gpus(row.spec)
                settled += minutes
            if settled:
                bind.execute(
                    sa.update(jobs).where(jobs.c.id == row.id).values(settled_minutes=settled)
                )
    if totals:
        months = sa.table(
            "billed_months",
            sa.column("instance", sa.String),
            sa.column("owner", sa.String),
            sa.column("month", sa.String),
            sa.column("minutes", sa.BigInteger),
            sa.column("gpu_minutes", sa.BigInteger),
        )
        bind.execute(
            sa.insert(months),
            [
                {"instance": i, "owner": o, "month": m, "minutes": t[0], "gpu_minutes": t[1]}
                for (i, o, m), t in sorted(totals.items())
            ],
        )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
