"""Billed time of a notebook or a job, from its history (pure).

Below both domains: the notebooks' usage and the jobs' records and usage share this rule.
A notebook is billed like a job: its RUNNING state has the same string value as the job's.

Billing runs from each entry into RUNNING until the job leaves the running family of states
(RUNNING, RESTARTING, TIMEOUT, INTERRUPTING): the start of FINALIZING, or the job's end
(FAILED, ERROR, ...) or re-queueing (QUEUED), whichever comes first. Periods are summed over
the job's whole life (restarts and re-queues included) and charged per commenced minute of the
total. QUEUED, INITIALIZING and PENDING are never billed, nor is an INTERRUPTING reached before
the job ever ran in that attempt. A job still in a billed state is billed up to ``now``.

Kept totals (what deleting records must never change): each time a billed period closes, the
job's bill so far (:func:`settled_minutes`: the commenced minutes of its closed periods) grows
by some minutes, which are *settled* in the month (UTC) of that close (:func:`month_of`); the
service adds them to its owner's total for that month in the same transaction
(``gpulab.jobs.records``). A job's settled minutes add up to :func:`billed_minutes` once it
ended; a live job's open period (:func:`billed_by_month`: the month of ``now``) is added when
the totals are read. :func:`settlements` is the rule as a scan of one history, which the
totals are tested against.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from .lifecycle import JobState

__all__ = [
    "BILLED_STATES",
    "billed_by_month",
    "billed_minutes",
    "billed_time",
    "month_of",
    "parse_month",
    "settled_minutes",
    "settlements",
    "user_usage",
]

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


def _commenced(total: timedelta) -> int:
    minutes, rest = divmod(total, timedelta(minutes=1))
    return minutes + (1 if rest else 0)


def month_of(at: datetime) -> str:
    """The billing month of ``at`` (UTC, or naive UTC): ``"2026-11"``."""
    return f"{at.year:04d}-{at.month:02d}"


_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")


def parse_month(text: object) -> str:
    """A billing month as users write it, ``"2026-11"``; ValueError saying what is allowed."""
    m = _MONTH_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
        shown = repr(text)[:40]
        raise ValueError(f"month must be a month such as 2026-11 (YYYY-MM), not {shown}")
    return text  # type: ignore[return-value]


def settlements(history: Sequence[_Event]) -> list[tuple[datetime, int]]:
    """(when, minutes) each time a billed period closes and the job's bill grows: the
    commenced minutes of its closed periods so far, less those settled before. They add up to
    :func:`settled_minutes`. Events are taken in time order."""
    out: list[tuple[datetime, int]] = []
    closed = timedelta(0)
    settled = 0
    since: datetime | None = None
    for event in sorted(history, key=lambda e: e.at):
        state = str(event.state)
        if since is not None and state not in BILLED_STATES:
            closed += max(event.at - since, timedelta(0))
            since = None
            minutes = _commenced(closed)
            if minutes > settled:
                out.append((event.at, minutes - settled))
                settled = minutes
        elif since is None and state == JobState.RUNNING:
            since = event.at
    return out


def settled_minutes(history: Sequence[_Event]) -> int:
    """Commenced minutes of the job's closed billed periods (an open one left out): its
    :func:`billed_minutes` once it left the running states."""
    return sum(minutes for _, minutes in settlements(history))


def billed_by_month(history: Sequence[_Event], now: datetime) -> dict[str, int]:
    """A job's billed minutes by month (``"YYYY-MM"``): each settlement in the month of its
    close, and what an open period adds so far in the month of ``now``. The values add up to
    :func:`billed_minutes` ``(history, now)``."""
    out: dict[str, int] = {}
    for at, minutes in settlements(history):
        out[month_of(at)] = out.get(month_of(at), 0) + minutes
    live = billed_minutes(history, now) - sum(out.values())
    if live > 0:
        out[month_of(now)] = out.get(month_of(now), 0) + live
    return out


def user_usage(jobs_minutes: int, notebooks_minutes: int) -> dict[str, int]:
    """A user's billed minutes: their jobs', their notebooks', and what they are billed in all
    (the two together), under the names the usage API answers."""
    return {
        "jobs_billed_minutes": jobs_minutes,
        "notebooks_billed_minutes": notebooks_minutes,
        "billed_minutes": jobs_minutes + notebooks_minutes,
    }
