"""Deletes ended jobs whose retention is over (:mod:`gpulab.jobs.retention`), in the
background, in bounded batches with a pause between them."""

from __future__ import annotations

import asyncio
import logging

from ...jobs.retention import delete_expired
from ...jobs.supervisor.supervisor import JobSupervisor
from ...settings import GpulabSettings

log = logging.getLogger(__name__)

#: seconds between two batches of one sweep: the write lock is free for the submissions,
#: transitions and notebook spawns queued behind a batch
BATCH_PAUSE = 0.1


async def sweep(settings: GpulabSettings, supervisor: JobSupervisor) -> int:
    """Delete every ended job whose retention is over, ``job_retention_batch`` per
    transaction (each one off the event loop), pausing :data:`BATCH_PAUSE` between
    batches; how many were deleted."""
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
