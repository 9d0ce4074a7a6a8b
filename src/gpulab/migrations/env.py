"""Alembic's environment for the ``alembic`` command (writing a revision): the database is
``GPULAB_DATABASE_URL``; the models are gpulab.db's. gpulab runs revisions without it
(:func:`gpulab.db.prepare_schema`)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from gpulab.db import Base

url = os.environ.get("GPULAB_DATABASE_URL", "sqlite:///data/gpulab.sqlite")
with create_engine(url).connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
