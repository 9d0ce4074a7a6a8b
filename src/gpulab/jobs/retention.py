"""Retention of ended jobs: their records, histories, events and saved logs are deleted once
the job's own ``auto_delete_after`` (else the site's ``job_retention``) has passed since its
end. What was billed stays (:mod:`gpulab.jobs.usage`'s monthly totals are kept apart), and
what the engine still holds of a deleted job (a container, volumes) goes with the
supervisor's sweep of workloads without a record.

:func:`delete_expired` deletes one bounded batch (blocking: run it off the event loop); the
service's task (:mod:`gpulab.service.tasks.retention`) calls it in a loop with a pause
between batches, so that no transaction holds the database's write lock long. The record
layer's compare-and-set (:meth:`~gpulab.jobs.records.JobRecords.delete_expired`) never
deletes a job that is not ended, nor a SYNC_FAILED one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from ..lifecycle import utcnow
from .records import JobRecords

log = logging.getLogger("gpulab.jobs")


def delete_expired(
    records: JobRecords,
    saved_logs: Callable[[str], list[Path]],
    *,
    default: float | None,
    batch: int,
    now: datetime | None = None,
) -> list[str]:
    """Delete one batch of at most ``batch`` ended jobs whose retention is over (``default``:
    the site's, in seconds, for jobs that set none; None: those are kept), then their saved
    logs (``saved_logs(job_id)``: the files); the ids deleted, oldest end first."""
    gone = records.delete_expired(now or utcnow(), default, batch)
    for job in gone:
        for path in saved_logs(job["id"]):
            try:
                path.unlink(missing_ok=True)
            except OSError as e:  # a log left behind is no reason to stop the sweep
                log.warning("retention: could not remove %s: %s", path, e)
    if gone:
        log.info("retention: deleted %d ended jobs' records and logs", len(gone))
    return [job["id"] for job in gone]
