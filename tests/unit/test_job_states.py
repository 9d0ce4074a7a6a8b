"""The job list's state filter (gpulab.jobs.states.parse_state_filter), the one parse of the
API's and the jobs page's ``?state=``: values in, values out."""

from __future__ import annotations

import pytest

from gpulab.jobs.refusals import Invalid
from gpulab.jobs.states import parse_state_filter
from gpulab.lifecycle import JobState

ALL = ", ".join(s.value for s in JobState)


@pytest.mark.parametrize(
    "text, states",
    [
        ("", []),
        (" \t\n", []),  # blank: no filter
        ("DONE", ["DONE"]),
        ("done,Running", ["DONE", "RUNNING"]),  # any case, in the order given
        (" queued ,\tpending\r\n", ["QUEUED", "PENDING"]),  # around ASCII white space
        ("FAILED,failed,DONE", ["FAILED", "DONE"]),  # each once
    ],
)
def test_names_in_any_case_around_white_space(text, states):
    assert parse_state_filter(text) == states


@pytest.mark.parametrize(
    "text, named",
    [
        ("SLEEPY", "SLEEPY"),
        ("DONE,zzz,aaa", "AAA"),  # the first unknown one in order of names
        ("DONE,,RUNNING", ""),  # an empty name between commas
        ("DONE,", ""),
        ("\xa0DONE", "\xa0DONE"),  # not ASCII white space (nor the document's pattern's)
        ("ſucceeded", "ſucceeded"),  # "ſ".upper() is "S": a non-ASCII name stays as it is
    ],
)
def test_an_unknown_name_is_refused_with_every_state(text, named):
    with pytest.raises(Invalid) as e:
        parse_state_filter(text)
    assert e.value.status == 400 and e.value.field == "state"
    assert e.value.message == f"unknown state {named}; states are: {ALL}"
