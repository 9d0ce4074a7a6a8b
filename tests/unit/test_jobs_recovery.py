"""Recovery decisions (pure): every (state, request, outcome, container) a database and an
engine can hold after a crash, and what the supervisor does with it."""

from __future__ import annotations

import itertools

import pytest

from gpulab.jobs.records import REQUESTS
from gpulab.jobs.recovery import (
    OUTCOMES,
    RECOVERABLE,
    Container,
    Step,
    classify,
    decide,
    path,
)
from gpulab.lifecycle import JOB_TRANSITIONS, JobState
from gpulab.runtime.base import WorkloadState
from gpulab.runtime.objects import docker_epoch

J = JobState
# what a database can hold in ``request``: the requests, and what databases written before
# the ``outcome`` column kept there (a FINALIZING job's outcome), and garbage
PERSISTED_REQUESTS = sorted(REQUESTS | {s.value for s in JobState} | {"bogus"})
PERSISTED_OUTCOMES = sorted({""} | {s.value for s in JobState} | {"bogus"})
REASONS = ["", "TIMEOUT", "PREEMPTED", "USER_INTERRUPT", "SCHEDULED", "EXITED", "NODE_LOST"]

ALL = list(
    itertools.product(
        sorted(RECOVERABLE), PERSISTED_REQUESTS, PERSISTED_OUTCOMES, list(Container), REASONS
    )
)


def _allowed(src: JobState, dst: JobState) -> bool:
    return dst in JOB_TRANSITIONS[src]


def test_the_enumeration_covers_every_active_state():
    # QUEUED is the scheduler's (no task, nothing held); every other unfinished state is here
    unfinished = {s for s in JobState if s not in OUTCOMES | {J.SYNC_FAILED, J.QUEUED}}
    assert unfinished == set(RECOVERABLE)
    assert len(ALL) > 10_000


@pytest.mark.parametrize("state", sorted(RECOVERABLE))
def test_every_persisted_combination_has_a_step_the_lifecycle_allows(state):
    for _, request, outcome, found, reason in (c for c in ALL if c[0] is state):
        d = decide(state, request, outcome, found, reason)
        where = (state, request, outcome, found, reason, d)
        if d.step is Step.FINALIZE:
            assert d.outcome in OUTCOMES, where
            steps = path(state, d.outcome, d.push)
            chain = [state, *steps]
            assert all(_allowed(a, b) for a, b in itertools.pairwise(chain)), where
        elif d.step is Step.REQUEUE:
            assert _allowed(state, J.QUEUED), where
        elif d.step is Step.FINISH_PREEMPT:
            assert state is J.INTERRUPTING and _allowed(state, J.QUEUED), where
        elif d.step is Step.FINISH_LOST:
            assert state is J.INTERRUPTING and reason == "NODE_LOST", where
            assert _allowed(state, J.QUEUED), where
        elif d.step is Step.START:
            assert state is J.RESTARTING and _allowed(state, J.RUNNING), where
        else:
            assert d.step is Step.ATTACH, where
            assert state is J.RUNNING or _allowed(state, J.RUNNING), where


def test_a_command_that_started_is_never_queued_again():
    """No job runs twice: once its container started in this life, recovery never re-queues
    it (the watch reads its exit code, or it is finalized)."""
    for state, request, outcome, found, reason in ALL:
        d = decide(state, request, outcome, found, reason)
        if found in (Container.RUNNING, Container.ENDED) and state is not J.INITIALIZING:
            assert d.step is not Step.REQUEUE, (state, request, found, d)


def test_output_is_pushed_whenever_the_command_may_have_written_it():
    """Nothing written is lost: a job past PENDING whose container started ends through a
    push (FINALIZING), or is watched / re-queued through a preemption's push. Not a job
    whose node was lost: its copy of the volumes went with the node, nothing is left to push."""
    for state, request, outcome, found, reason in ALL:
        d = decide(state, request, outcome, found, reason)
        lost_node = state is J.INTERRUPTING and reason == "NODE_LOST"
        if d.step is Step.FINALIZE and state not in (J.INITIALIZING, J.PENDING) and not lost_node:
            assert d.push, (state, request, found, d)
            assert path(state, d.outcome, d.push)[0] in (J.FINALIZING, d.outcome)
            if state is not J.FINALIZING:
                assert path(state, d.outcome, d.push)[0] is J.FINALIZING


def test_a_finalizing_job_ends_in_its_recorded_outcome():
    for outcome in OUTCOMES:
        d = decide(J.FINALIZING, "", outcome.value, Container.ENDED)
        assert (d.step, d.outcome) == (Step.FINALIZE, outcome)
    # databases written before the outcome column kept it in request
    assert decide(J.FINALIZING, "DONE", "", Container.ABSENT).outcome is J.DONE
    # the bug of the review: an interrupt written over a FINALIZING job's request
    assert decide(J.FINALIZING, "interrupt", "", Container.ENDED).outcome is J.ERROR
    assert decide(J.FINALIZING, "interrupt", "DONE", Container.ENDED).outcome is J.DONE


def test_an_interrupt_in_its_grace_period_is_finished_not_turned_into_error():
    """The review's restart during an interrupt's grace period: INTERRUPTING with the
    container still running ends INTERRUPTED (finalize stops it first), never ERROR."""
    for request in ("", "interrupt"):
        d = decide(J.INTERRUPTING, request, "", Container.RUNNING, "USER_INTERRUPT")
        assert (d.step, d.outcome, d.reason) == (Step.FINALIZE, J.INTERRUPTED, "USER_INTERRUPT")
    d = decide(J.INTERRUPTING, "", "", Container.RUNNING, "TIMEOUT")
    assert (d.outcome, d.reason) == (J.INTERRUPTED, "TIMEOUT")
    assert decide(J.INTERRUPTING, "preempt", "", Container.RUNNING).step is Step.FINISH_PREEMPT
    # a preemption asked just as the job timed out: it ends, it is not queued again
    d = decide(J.INTERRUPTING, "preempt", "", Container.RUNNING, "TIMEOUT")
    assert (d.step, d.outcome, d.reason) == (Step.FINALIZE, J.INTERRUPTED, "TIMEOUT")
    # an interrupt that replaced a preemption is the user's
    d = decide(J.INTERRUPTING, "interrupt", "", Container.ABSENT, "PREEMPTED")
    assert (d.outcome, d.reason) == (J.INTERRUPTED, "USER_INTERRUPT")


def test_before_the_command_runs_a_job_is_queued_again_or_interrupted():
    for state in (J.INITIALIZING, J.PENDING):
        for found in (Container.ABSENT, Container.STALE):
            assert decide(state, "", "", found).step is Step.REQUEUE
            d = decide(state, "interrupt", "", found)
            assert (d.step, d.outcome, d.push) == (Step.FINALIZE, J.INTERRUPTED, False)
    assert decide(J.PENDING, "", "", Container.RUNNING).step is Step.ATTACH
    assert decide(J.PENDING, "", "", Container.ENDED).step is Step.ATTACH


def test_a_lost_container_ends_in_error_with_a_push():
    for state in (J.RUNNING, J.RESTARTING):
        d = decide(state, "", "", Container.ABSENT)
        assert (d.step, d.outcome, d.reason, d.push) == (
            Step.FINALIZE,
            J.ERROR,
            "CONTAINER_LOST",
            True,
        )
    # a restart cut short before the container started again: start it
    assert decide(J.RESTARTING, "", "", Container.STALE).step is Step.START
    # it did start (and maybe ended again): the watch counts that run, none is added
    assert decide(J.RESTARTING, "", "", Container.ENDED).step is Step.ATTACH
    assert decide(J.RESTARTING, "", "", Container.RUNNING).step is Step.ATTACH


def _info(running: bool, started: str) -> WorkloadState:
    # through the Docker backend's own reading of its RFC 3339 times
    return WorkloadState(running=running, started_at=docker_epoch(started))


def test_classify_tells_this_life_from_an_earlier_one():
    began = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    assert classify(None, began) is Container.ABSENT
    assert classify(_info(True, "2000-01-01T00:00:00Z"), began) is Container.RUNNING
    assert classify(_info(False, "0001-01-01T00:00:00Z"), began) is Container.STALE
    assert classify(_info(False, "2027-01-15T07:59:00.123456789Z"), began) is Container.STALE
    assert classify(_info(False, "2027-01-15T08:00:05.5Z"), began) is Container.ENDED
    # a run that ended within a second before this life began is still an earlier one's
    assert classify(_info(False, "2027-01-15T07:59:59.5Z"), began) is Container.STALE
    assert classify(WorkloadState(running=False), began) is Container.STALE


def test_a_lost_nodes_removal_cut_short_is_finished_and_queued_again():
    # lost() records INTERRUPTING (NODE_LOST) before it removes the workers: a crash in the
    # middle is carried on as a re-queue whatever is left of the gang, never as ERROR
    for found in Container:
        for request in ("", "preempt"):
            d = decide(J.INTERRUPTING, request, "", found, "NODE_LOST")
            assert d.step is Step.FINISH_LOST, (found, request, d)
        # the owner's interrupt wins, with nothing to push (the node's copy is gone)
        d = decide(J.INTERRUPTING, "interrupt", "", found, "NODE_LOST")
        assert (d.step, d.outcome, d.push) == (Step.FINALIZE, J.INTERRUPTED, False)
