"""Billed time of a notebook or a job, from its history (pure).

Below both domains: the notebooks' usage and the jobs' records and usage share this rule.
A notebook is billed like a job: its RUNNING state has the same string value as the job's.

Billing runs from each entry into RUNNING until the job leaves the running family of states
(RUNNING, RESTARTING, TIMEOUT, INTERRUPTING): the start of FINALIZING, or the job's end
(FAILED, ERROR, ...) or re-queueing (QUEUED), whichever comes first. Periods are summed over
the job's whole life (restarts and re-queues included) and charged per commenced minute of the
total. QUEUED, INITIALIZING and PENDING are never billed, nor is an INTERRUPTING reached before
the job ever ran in that attempt. A job still in a billed state is billed up to ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from .lifecycle import JobState

__all__ = ["BILLED_STATES", "billed_minutes", "billed_time", "user_usage"]

#: states billed once the job has entered RUNNING
BILLED_STATES = frozenset(
    {JobState.RUNNING, JobState.RESTARTING, JobState.TIMEOUT, JobState.INTERRUPTING}
)


class _Event(Protocol):
    @property
    def state(self) -> str: ...

    @property
    def at(self) -> datetime: ...


def billed_time(history: Sequence[_Event], now: datetime) -> timedelta:
    """Total billed time (not rounded). Events are taken in time order."""
    total = timedelta(0)
    since: datetime | None = None
    for event in sorted(history, key=lambda e: e.at):
        state = str(event.state)
        if since is not None and state not in BILLED_STATES:
            total += max(event.at - since, timedelta(0))
            since = None
        elif since is None and state == JobState.RUNNING:
            since = event.at
    if since is not None:
        total += max(now - since, timedelta(0))
    return total


def billed_minutes(history: Sequence[_Event], now: datetime) -> int:
    """Commenced minutes billed: ceil(total billed seconds / 60); 0 if it never ran."""
    minutes, rest = divmod(billed_time(history, now), timedelta(minutes=1))
    return minutes + (1 if rest else 0)


def user_usage(jobs_minutes: int, notebooks_minutes: int) -> dict[str, int]:
    """A user's billed minutes: their jobs', their notebooks', and what they are billed in all
    (the two together), under the names the usage API answers."""
    return {
        "jobs_billed_minutes": jobs_minutes,
        "notebooks_billed_minutes": notebooks_minutes,
        "billed_minutes": jobs_minutes + notebooks_minutes,
    }
