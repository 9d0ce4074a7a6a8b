"""Deletes ended jobs whose retention is over (:mod:`gpulab.jobs.retention`), and the part of
notebooks' histories older than the site's ``job_retention`` (each notebook's newest
:data:`~gpulab.notebooks.records.HISTORY_KEPT` events stay, and what that part billed is kept
on the notebook's row), in the background, in bounded batches with a pause between them."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from ...jobs.retention import delete_expired
from ...jobs.supervisor.supervisor import JobSupervisor
from ...lifecycle import utcnow
from ...notebooks.records import NotebookRecords
from ...settings import GpulabSettings

log = logging.getLogger(__name__)

#: seconds between two batches of one sweep: the write lock is free for the submissions,
#: transitions and notebook spawns queued behind a batch
BATCH_PAUSE = 0.1


async def sweep(settings: GpulabSettings, supervisor: JobSupervisor) -> int:
    """Delete every ended job whose retention is over, ``job_retention_batch`` per
    transaction (each one off the event loop), pausing :data:`BATCH_PAUSE` between
    batches, then the notebooks' history older than ``job_retention``
    (:func:`prune_histories`); how many jobs were deleted."""
    total = 0
    while True:
        ids = await asyncio.to_thread(
            delete_expired,
            supervisor.records,
            supervisor.saved_logs,
            default=settings.job_retention,
            batch=settings.job_retention_batch,
        )
        total += len(ids)
        if len(ids) < settings.job_retention_batch:
            break
        await asyncio.sleep(BATCH_PAUSE)
    await prune_histories(
        settings, NotebookRecords(supervisor.records.db, supervisor.records.instance)
    )
    return total


async def prune_histories(settings: GpulabSettings, notebooks: NotebookRecords) -> int:
    """Delete the notebooks' history events older than ``job_retention`` (None: none), each
    notebook's newest kept, ten times ``job_retention_batch`` events a call (a notebook a
    transaction), pausing :data:`BATCH_PAUSE` between calls; how many went."""
    if settings.job_retention is None:
        return 0
    batch = 10 * settings.job_retention_batch
    total = 0
    while True:
        before = utcnow() - timedelta(seconds=settings.job_retention)
        n = await asyncio.to_thread(notebooks.prune_history, before, limit=batch)
        total += n
        if n < batch:
            return total
        await asyncio.sleep(BATCH_PAUSE)


async def retention_loop(settings: GpulabSettings, supervisor: JobSupervisor) -> None:
    """Every ``job_retention_interval`` seconds, while this service leads: :func:`sweep`."""
    while True:
        await asyncio.sleep(settings.job_retention_interval)
        if not supervisor.leading.is_set():
            continue  # a service in standby acts on nothing
        try:
            await sweep(settings, supervisor)
        except Exception:
            log.exception("retention sweep failed")
