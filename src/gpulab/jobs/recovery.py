"""What to do with an active job whose supervisor is new (a restart) or lost track (a fault).

Pure: from what the database says (state, request, pending outcome, reason) and what the
engine says about the job's container, :func:`decide` returns one step. The supervisor runs
it after a restart and after any fault inside a job's task, so the same few lines decide in
both cases; ``tests/unit/test_jobs_recovery.py`` enumerates every combination that can be
persisted and checks each decision against the lifecycle table and the invariants (nothing
runs twice, nothing ends while its container may still run, no output is dropped).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ..lifecycle import JOB_TRANSITIONS, JobState
from ..runtime.base import WorkloadState

J = JobState

#: states a job can be found in with a task that must carry it on (QUEUED is the scheduler's)
RECOVERABLE = frozenset(
    {J.INITIALIZING, J.PENDING, J.RUNNING, J.RESTARTING, J.INTERRUPTING, J.TIMEOUT, J.FINALIZING}
)
#: what a FINALIZING job may end in once its output is pushed
OUTCOMES = frozenset({J.DONE, J.FAILED, J.INTERRUPTED, J.ERROR})


class Container(enum.StrEnum):
    """The job's container as the engine reports it, relative to the job's current life."""

    RUNNING = "running"
    ENDED = "ended"  # started in this life (after the job entered its state), now exited
    STALE = "stale"  # created but never started, or left by an earlier life of the job
    ABSENT = "absent"


class Step(enum.StrEnum):
    ATTACH = "attach"  # (PENDING/RESTARTING: record RUNNING, then) watch it: exit, time-out...
    START = "start"  # a restart was cut short: start the container again, then watch
    REQUEUE = "requeue"  # nothing of its command ran in this life: back to the queue
    FINISH_PREEMPT = "finish-preempt"  # stop, push, remove, release, back to the queue
    # its node was lost (INTERRUPTING, NODE_LOST): remove every worker, release, back to the
    # queue (no push: the node's copy of the volumes went with it)
    FINISH_LOST = "finish-lost"
    FINALIZE = "finalize"  # (stop,) release, push unless told not to, end in ``outcome``


@dataclass(frozen=True)
class Decision:
    step: Step
    outcome: JobState | None = None
    reason: str = ""
    message: str = ""
    push: bool = True


def classify(found: WorkloadState | None, life_began: float) -> Container:
    """Turn what the engine says (None: no such workload) into :class:`Container`.

    ``life_began``: when the job entered its current state (epoch seconds). A workload
    started before that belongs to an earlier life (a resumed job's old container, kept for
    the retention delay) and says nothing about this one."""
    if found is None:
        return Container.ABSENT
    if found.running:
        return Container.RUNNING
    # the state is written before the workload is (re)started, so a start of this life is
    # later. On a cluster the start time is the node's clock: nodes are expected to keep
    # time with NTP (a skew of more than a job state's lifetime would read as an earlier life)
    if found.started_at is None or found.started_at < life_began:
        return Container.STALE
    return Container.ENDED


def _pending_outcome(outcome: str, request: str) -> JobState:
    """The outcome a FINALIZING job had decided on; databases written before the ``outcome``
    column kept it in ``request``. Anything unreadable ends as ERROR (its push still runs)."""
    for value in (outcome, request):
        try:
            state = JobState(value)
        except ValueError:
            continue
        if state in OUTCOMES:
            return state
    return J.ERROR


def decide(
    state: JobState, request: str, outcome: str, container: Container, reason: str = ""
) -> Decision:
    """The next step for a job found in ``state`` with ``request`` pending."""
    interrupt = request == "interrupt"
    lost = Decision(
        Step.FINALIZE, J.ERROR, "CONTAINER_LOST", "the job's container disappeared", push=True
    )
    before_start = Decision(
        Step.FINALIZE, J.INTERRUPTED, "USER_INTERRUPT", "interrupted before it started", False
    )
    if state is J.FINALIZING:
        return Decision(Step.FINALIZE, _pending_outcome(outcome, request), reason or "FINALIZED")
    if state is J.INITIALIZING:
        # its container is created in PENDING: any found now is an earlier life's
        return before_start if interrupt else Decision(Step.REQUEUE)
    if state is J.PENDING:
        if container in (Container.RUNNING, Container.ENDED):
            return Decision(Step.ATTACH)  # it started: never run it again
        return before_start if interrupt else Decision(Step.REQUEUE)
    if state is J.INTERRUPTING:
        if reason == "NODE_LOST":  # a lost node's removal cut short: finish it, re-queue
            if interrupt:
                return Decision(
                    Step.FINALIZE, J.INTERRUPTED, "USER_INTERRUPT", "interrupted", push=False
                )
            return Decision(Step.FINISH_LOST)
        if request == "preempt" and reason != "TIMEOUT":  # a timed-out job is not re-queued
            return Decision(Step.FINISH_PREEMPT)
        why = reason if reason in ("TIMEOUT", "PREEMPTED") else "USER_INTERRUPT"
        if why == "PREEMPTED":  # an interrupt replaced the preemption: the user's word wins
            why = "USER_INTERRUPT"
        message = "time-out reached" if why == "TIMEOUT" else "interrupted by its owner"
        return Decision(Step.FINALIZE, J.INTERRUPTED, why, message)
    if state is J.TIMEOUT:
        return Decision(Step.FINALIZE, J.INTERRUPTED, "TIMEOUT", "time-out reached")
    if container is Container.ABSENT:
        return lost
    if state is J.RESTARTING:
        if container in (Container.RUNNING, Container.ENDED):
            # the restart happened (and may have ended again): the watch reads its exit code
            # and counts retries; starting it here would run it once more than asked
            return Decision(Step.ATTACH)
        if interrupt:
            return Decision(Step.FINALIZE, J.INTERRUPTED, "USER_INTERRUPT", "interrupted")
        return Decision(Step.START)
    # RUNNING: the watch reads the exit code, the request and the time-out itself
    return Decision(Step.ATTACH)


def path(state: JobState, outcome: JobState, push: bool) -> list[JobState]:
    """The states a job goes through from ``state`` to ``outcome``: through FINALIZING when
    its output is to be pushed and the lifecycle allows it, straight there otherwise."""
    if state is J.FINALIZING:
        return [outcome]
    if push and J.FINALIZING in JOB_TRANSITIONS[state]:
        return [J.FINALIZING, outcome]
    if outcome in JOB_TRANSITIONS[state]:
        return [outcome]
    return [J.FINALIZING, outcome]


def combine(found: Sequence[Container]) -> Container:
    """One view of a gang's containers for :func:`decide`.

    A rank missing means the gang is not whole (ABSENT: a start cut short, or lost). A gang
    is RUNNING or ENDED (in this life) only when every rank is one of those; a mix with a
    rank left from an earlier life (a whole-gang restart cut short) is STALE, so that the
    restart is finished (only the ranks not running are started again)."""
    if not found:
        return Container.ABSENT
    if any(c is Container.ABSENT for c in found):
        return Container.ABSENT
    if any(c is Container.STALE for c in found):
        return Container.STALE
    if any(c is Container.RUNNING for c in found):
        return Container.RUNNING
    return Container.ENDED
