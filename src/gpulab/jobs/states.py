"""The families of job states that the records, the scheduler and the pages share, and the
one parse of a job list's state filter (the API's and the jobs page's)."""

from __future__ import annotations

from collections.abc import Iterable

from ..lifecycle import JobState
from .refusals import Invalid

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

#: white space around the names of a state filter: ASCII only, as the OpenAPI document's
#: pattern says ("\xa0" is white space to str.strip(), not to the pattern)
_SPACE = " \t\n\v\f\r"


def parse_state_filter(text: str) -> list[str]:
    """The states a job list is filtered on (the API's and the jobs page's ``?state=``):
    names separated by commas, in any ASCII case, around ASCII white space; blank: no filter
    (``[]``). In the order given, each once; Invalid (``field`` "state") naming an unknown one
    ("ſ".upper() is "S": a name is upper-cased only if it is ASCII)."""
    if not text.strip(_SPACE):
        return []
    names = [s.strip(_SPACE) for s in text.split(",")]
    names = [s.upper() if s.isascii() else s for s in names]
    unknown = set(names) - {s.value for s in JobState}
    if unknown:
        raise Invalid(
            f"unknown state {sorted(unknown)[0]}; states are: "
            + ", ".join(s.value for s in JobState),
            field="state",
        )
    return list(dict.fromkeys(names))


def array_state(
    tasks: Iterable[tuple[int, str, int | None]], stopping: bool
) -> tuple[JobState, str, str, int | None]:
    """A job array's state, derived from its tasks' (index, state, exit code) and whether its
    owner asked it to stop: (state, reason, message, exit code).

    While any task is unfinished: INTERRUPTING once asked to stop; QUEUED while no task has
    started or ended; RUNNING otherwise (some run, or wait their turn after others ended).
    Once every task ended: INTERRUPTED if asked to stop; else FAILED if any task failed (exit
    code: the first failed task's), ERROR if any ended in a platform error, SYNC_FAILED if
    any push failed, INTERRUPTED if any was interrupted (or preempted for good), and DONE
    (exit code 0) when all are DONE."""
    rows = sorted(tasks)
    counts: dict[str, int] = {}
    for _, state, _ in rows:
        counts[state] = counts.get(state, 0) + 1
    n = len(rows)
    ended = {s.value for s in ENDED}
    unfinished = sum(c for s, c in counts.items() if s not in ended)
    summary = ", ".join(
        f"{c} {s}" for s, c in sorted(counts.items(), key=lambda sc: _ORDER.get(sc[0], 99))
    )
    if unfinished:
        if stopping:
            return JobState.INTERRUPTING, "USER_INTERRUPT", f"stopping its tasks: {summary}", None
        if counts.get(JobState.QUEUED.value, 0) == n:
            return JobState.QUEUED, "SUBMITTED", f"{n} tasks queued", None
        return JobState.RUNNING, "TASKS", f"{n} tasks: {summary}", None
    if stopping:
        return JobState.INTERRUPTED, "USER_INTERRUPT", f"stopped by its owner: {summary}", None
    for state, reason in (
        (JobState.FAILED, "TASK_FAILED"),
        (JobState.ERROR, "TASK_ERROR"),
        (JobState.SYNC_FAILED, "TASK_SYNC_FAILED"),
        (JobState.INTERRUPTED, "TASK_INTERRUPTED"),
    ):
        hit = [(i, code) for i, s, code in rows if s == state.value]
        if hit:
            first, code = hit[0]
            what = f"task {first} {state.value}"
            if len(hit) > 1:
                what = f"{len(hit)} tasks {state.value}, the first task {first}"
            return state, reason, f"{what}; {summary}", code if state is JobState.FAILED else None
    return JobState.DONE, "TASKS_DONE", f"all {n} tasks DONE", 0


#: the order in which an array's counts are said (the life of a job)
_ORDER = {s.value: i for i, s in enumerate(JobState)}
