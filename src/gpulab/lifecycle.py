"""Workload states, their allowed transitions and timestamped history (pure, no I/O).

The state names are those of the domain (see DOMAIN.md): users of cloud AI notebook and
training products know them, so they are kept verbatim.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime


class NotebookState(enum.StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SYNC_FAILED = "SYNC_FAILED"
    DELETING = "DELETING"
    DELETED = "DELETED"


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"
    INITIALIZING = "INITIALIZING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    INTERRUPTING = "INTERRUPTING"
    TIMEOUT = "TIMEOUT"
    FINALIZING = "FINALIZING"
    DONE = "DONE"
    INTERRUPTED = "INTERRUPTED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SYNC_FAILED = "SYNC_FAILED"


N = NotebookState
_ENDED = {N.STOPPED, N.FAILED, N.ERROR, N.SYNC_FAILED}

NOTEBOOK_TRANSITIONS: dict[NotebookState | None, frozenset[NotebookState]] = {
    None: frozenset({N.STARTING, N.DELETING}),
    N.STARTING: frozenset({N.RUNNING, N.STOPPING, N.FAILED, N.ERROR}),
    N.RUNNING: frozenset({N.STOPPING, N.FAILED, N.ERROR}),
    N.STOPPING: frozenset({N.STOPPED, N.SYNC_FAILED, N.FAILED, N.ERROR}),
    # an ended notebook can start again (same workspace) or be deleted;
    # SYNC_FAILED may also retry its push through STOPPING
    N.STOPPED: frozenset({N.STARTING, N.DELETING}),
    # a failed notebook's work is still pushed when the hub cleans it up; that push can fail
    N.FAILED: frozenset({N.STARTING, N.STOPPING, N.SYNC_FAILED, N.DELETING}),
    N.ERROR: frozenset({N.STARTING, N.STOPPING, N.SYNC_FAILED, N.DELETING}),
    N.SYNC_FAILED: frozenset({N.STARTING, N.STOPPING, N.DELETING}),
    N.DELETING: frozenset({N.DELETED, N.ERROR}),
    # a named server created again under a deleted name starts a new life
    N.DELETED: frozenset({N.STARTING}),
}

NOTEBOOK_ACTIVE = frozenset({N.STARTING, N.RUNNING, N.STOPPING})
NOTEBOOK_ENDED = frozenset(_ENDED | {N.DELETED})

J = JobState
JOB_TRANSITIONS: dict[JobState | None, frozenset[JobState]] = {
    None: frozenset({J.QUEUED}),
    J.QUEUED: frozenset({J.INITIALIZING, J.INTERRUPTED, J.ERROR, J.FAILED}),
    # before its command runs a job can be interrupted straight away (nothing to push), or
    # queued again (a service restart, a preemption); from PENDING on it may have run, so it
    # ends through FINALIZING (its output pushed)
    J.INITIALIZING: frozenset(
        {J.PENDING, J.FAILED, J.ERROR, J.INTERRUPTING, J.INTERRUPTED, J.QUEUED}
    ),
    J.PENDING: frozenset(
        {J.RUNNING, J.FAILED, J.ERROR, J.INTERRUPTING, J.INTERRUPTED, J.QUEUED, J.FINALIZING}
    ),
    J.RUNNING: frozenset(
        {J.RESTARTING, J.INTERRUPTING, J.TIMEOUT, J.FINALIZING, J.FAILED, J.ERROR}
    ),
    J.RESTARTING: frozenset({J.RUNNING, J.FAILED, J.ERROR, J.INTERRUPTING, J.FINALIZING}),
    J.INTERRUPTING: frozenset({J.FINALIZING, J.INTERRUPTED, J.QUEUED, J.ERROR}),
    J.TIMEOUT: frozenset({J.INTERRUPTING, J.FINALIZING, J.RESTARTING, J.ERROR}),
    J.FINALIZING: frozenset({J.DONE, J.FAILED, J.INTERRUPTED, J.SYNC_FAILED, J.ERROR}),
    J.DONE: frozenset({J.QUEUED}),
    J.INTERRUPTED: frozenset({J.QUEUED}),
    J.FAILED: frozenset({J.QUEUED}),
    J.ERROR: frozenset({J.QUEUED}),
    J.SYNC_FAILED: frozenset({J.FINALIZING}),
}

JOB_QUOTA_STATES = frozenset({J.QUEUED, J.INITIALIZING, J.PENDING, J.RUNNING})

#: seconds a workload's node must stay down or drained (the engine says the workload is lost)
#: before the workload counts as lost, reason NODE_LOST: a job is given up there, a notebook
#: becomes ERROR (a manager's heartbeat hiccup is not a lost node)
LOST_AFTER = 6.0


class InvalidTransition(ValueError):
    """A state change that the lifecycle does not allow (HTTP 409 at the API)."""

    def __init__(self, kind: str, old: enum.Enum | None, new: enum.Enum):
        self.old, self.new = old, new
        was = old.value if old else "new"
        super().__init__(f"a {kind} cannot go from {was} to {new.value}")


def check_notebook_transition(old: NotebookState | None, new: NotebookState) -> None:
    if new not in NOTEBOOK_TRANSITIONS[old]:
        raise InvalidTransition("notebook", old, new)


def check_job_transition(old: JobState | None, new: JobState) -> None:
    if new not in JOB_TRANSITIONS[old]:
        raise InvalidTransition("job", old, new)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class HistoryEvent:
    """One transition: when, to which state, and why."""

    state: str
    at: datetime = field(default_factory=utcnow)
    reason: str = ""
    message: str = ""
    exit_code: int | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["at"] = self.at.isoformat().replace("+00:00", "Z")
        return d
