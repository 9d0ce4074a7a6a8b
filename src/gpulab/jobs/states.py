"""The families of job states that the records, the scheduler and the pages share, and the
one parse of a job list's state filter (the API's and the jobs page's)."""

from __future__ import annotations

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
