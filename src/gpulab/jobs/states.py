"""The families of job states that the records, the scheduler and the pages share."""

from __future__ import annotations

from ..lifecycle import JobState

#: a job that holds (or is about to hold, or to give back) its container and GPUs
ACTIVE = frozenset(
    {
        JobState.INITIALIZING,
        JobState.PENDING,
        JobState.RUNNING,
        JobState.RESTARTING,
        JobState.INTERRUPTING,
        JobState.TIMEOUT,
        JobState.FINALIZING,
    }
)
ENDED = frozenset(
    {JobState.DONE, JobState.INTERRUPTED, JobState.FAILED, JobState.ERROR, JobState.SYNC_FAILED}
)
