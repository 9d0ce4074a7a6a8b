"""A reader's request for a job's output (``/api/jobs/{id}/logs``, ``gpulab job logs``): the
rank asked for, the cap on the log streams open at once, and where the output is now: the
job's workloads while they exist (waited for, when following a job that has not started
yet), else what was saved at its end.

Above :mod:`gpulab.jobs.logs` (what is kept, how ranks merge, the cap) and the supervisor
(its runtime, records and saved logs), which imports ``logs.py``: so this is its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..lifecycle import JobState
from ..names import rank_name
from ..runtime.base import WorkloadGone
from .gang import rank_of, workers_of
from .logs import MAX_LOG_STREAMS_PER_USER, LogStreams, merged_tail, strip_stamps
from .states import ENDED

if TYPE_CHECKING:
    from .supervisor import JobSupervisor

J = JobState
#: a job in these states may not have its workloads yet: a follower waits for them
NOT_STARTED = frozenset({J.QUEUED.value, J.INITIALIZING.value, J.PENDING.value})
#: seconds between two looks for a job's workloads, while a follower waits
WAIT_POLL = 0.5
#: the log streams open in this service (each holds a thread of the service's log pool)
STREAMS = LogStreams()

#: runs a blocking read (of the engine's logs) where the caller wants it: the service's pool
Blocking = Callable[[Callable[[], bytes]], Awaitable[bytes]]


@dataclass(frozen=True)
class JobOutput:
    """What a reader of a job's output gets: ``live``, the workloads to read (each with the
    prefix of its lines: ``""`` for one workload's output as it comes, ``"[rank K] "`` for a
    distributed job's ranks, line by line); else ``whole``, the answer at once (what was
    saved at the job's end, or every rank's tail merged in time order)."""

    whole: bytes = b""
    live: tuple[tuple[str, str], ...] = ()


def first_rank(job: dict) -> int | None:
    """Whose output a job's page follows when it opens: every rank (None) while following
    them all takes at most half of a user's log streams (:data:`MAX_LOG_STREAMS_PER_USER`,
    one a rank), or once the job has ended (what was saved is read, no stream held); else
    rank 0 only (a bigger distributed job, running: its reader picks another rank)."""
    if workers_of(job) <= MAX_LOG_STREAMS_PER_USER // 2:
        return None
    return None if job["state"] in {s.value for s in ENDED} else 0


@contextlib.asynccontextmanager
async def read(
    sup: JobSupervisor,
    job: dict,
    rank: str | None,
    user: str,
    follow: bool,
    gone: Callable[[], bool],
    blocking: Blocking,
) -> AsyncIterator[JobOutput | None]:
    """``user``'s read of ``job``'s output: of one ``rank`` (the text a caller sent; None:
    the job's, or every rank's of a distributed job), ``follow``ed or not. Holds the log
    streams the read takes while the block lasts (:class:`~gpulab.jobs.refusals.Busy` over a
    cap; a rank the job lacks is NotFound, one that is no number Invalid, both before the
    cap). Yields the :class:`JobOutput`, or None when ``gone()`` says the reader left while
    it waited for the job to start. ``blocking`` runs the merged read of every rank's tail."""
    job_id, workers = job["id"], workers_of(job)
    number = rank_of(rank, job_id, workers) if rank is not None else None
    with STREAMS.held(user, workers, number, follow):
        yield await find(sup, job_id, workers, number, follow, gone, blocking)


async def find(
    sup: JobSupervisor,
    job_id: str,
    workers: int,
    rank: int | None,
    follow: bool,
    gone: Callable[[], bool],
    blocking: Blocking,
) -> JobOutput | None:
    """Where the output of ``job_id`` (one ``rank``'s, or every rank's) is now: see
    :func:`read`."""
    base = sup.container_name(job_id)
    if workers > 1 and rank is None:
        names = [rank_name(base, r) for r in range(workers)]
    else:
        rank = rank if workers > 1 else None  # a one-worker job's rank 0 is the job
        names = [rank_name(base, rank or 0)]
    started = await workloads_exist(sup, job_id, names, follow, gone)
    if started is None:
        return None
    if not started:  # gone (or never started): what was saved
        saved = await asyncio.to_thread(_read, sup.log_file(job_id, rank))
        return JobOutput(whole=saved if rank is None else strip_stamps(saved))
    if len(names) == 1:
        return JobOutput(live=(("", names[0]),))
    if follow:
        return JobOutput(live=tuple((f"[rank {r}] ", n) for r, n in enumerate(names)))
    with contextlib.suppress(WorkloadGone):  # ended and removed meanwhile
        return JobOutput(whole=await blocking(functools.partial(merged_tail, sup.runtime, names)))
    return JobOutput()


async def workloads_exist(
    sup: JobSupervisor, job_id: str, names: list[str], follow: bool, gone: Callable[[], bool]
) -> bool | None:
    """Whether every one of ``names`` exists; following a job that has not started yet,
    wait for them (or for its end). None: the reader went meanwhile (``gone()``)."""
    while True:
        found = await asyncio.gather(*(sup.runtime.state(n) for n in names))
        if all(f is not None for f in found) or not follow:
            return all(f is not None for f in found)
        if gone():
            return None
        job = await asyncio.to_thread(sup.records.get, job_id, False)
        if job is None or job["state"] not in NOT_STARTED:
            return False
        await asyncio.sleep(WAIT_POLL)


def _read(path: Path) -> bytes:
    """A saved log's bytes; none if it was never saved."""
    return path.read_bytes() if path.exists() else b""
