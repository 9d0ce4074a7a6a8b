"""gpulab 0.1.0's schema: the tables as the first release made them without a revision.

A new database never runs this step (it is made from the models and stamped with the newest
revision). A database gpulab 0.1.0 made has no revision: :func:`gpulab.db.prepare_schema`
stamps it 0001 when it has every table and column below, and otherwise runs this step, which
makes the tables it lacks and adds the columns that builds before 0.1.0 added in place (each
nullable or with a server default, as they were added then), so no data moves.

Revision ID: 0001
Revises:
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def tables() -> sa.MetaData:
    """The schema of revision 0001, frozen here (never the models of a later gpulab)."""
    m = sa.MetaData()
    sa.Table(
        "notebooks",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("user", sa.String(255), nullable=False, index=True),
        sa.Column("server", sa.String(255), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("options", sa.Text, nullable=True),
        sa.Column("user_options", sa.Text, nullable=True),
        sa.Column("container", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False, server_default=""),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.Column("running_since", sa.DateTime, nullable=True),
        sa.Column("stop_reason", sa.String(64), nullable=False),
        sa.Column("stop_message", sa.Text, nullable=False),
        sa.UniqueConstraint("instance", "user", "server"),
    )
    sa.Table(
        "notebook_events",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("notebook_id", sa.Integer, sa.ForeignKey("notebooks.id"), nullable=False),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Index("ix_notebook_events_notebook_id", "notebook_id"),
    )
    sa.Table(
        "gpu_allocations",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("share", sa.Integer, nullable=False),
        sa.Column("workload", sa.String(255), nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.UniqueConstraint("instance", "device", "share"),
    )
    sa.Table(
        "disk_bookings",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False, index=True),
        sa.Column("workload", sa.String(255), nullable=False, index=True),
        sa.Column("volume", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("since", sa.DateTime, nullable=False),
        sa.UniqueConstraint("instance", "node", "volume"),
    )
    sa.Table(
        "jobs",
        m,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False, index=True),
        sa.Column("owner", sa.String(255), nullable=False, index=True),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("state", sa.String(32), nullable=False, index=True),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("submitted", sa.DateTime, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.Column("running_since", sa.DateTime, nullable=True),
        sa.Column("container", sa.String(255), nullable=False),
        sa.Column("devices", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False, server_default=""),
        sa.Column("over_quota", sa.Integer, nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("hang_restarts", sa.Integer, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("request", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False, server_default=""),
        sa.Column("groups", sa.Text, nullable=False),
    )
    sa.Table(
        "leases",
        m,
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("expires", sa.DateTime, nullable=False),
        sa.Column("term", sa.Integer, nullable=False),
    )
    sa.Table(
        "job_events",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False, index=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=True),
    )
    sa.Table(
        "user_secrets",
        m,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False, index=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("token", sa.Text, nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.UniqueConstraint("instance", "owner", "name"),
    )
    return m


def upgrade() -> None:
    bind = op.get_bind()
    have = sa.inspect(bind)
    for table in tables().sorted_tables:
        if not have.has_table(table.name):
            table.create(bind)
            continue
        present = {c["name"] for c in have.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                default = column.server_default.arg if column.server_default else None
                op.add_column(
                    table.name,
                    sa.Column(
                        column.name,
                        column.type,
                        nullable=column.nullable,
                        server_default=default,
                    ),
                )


def downgrade() -> None:
    raise NotImplementedError("gpulab has no downgrade: restore the backup taken before")
