"""The job list's state filter (gpulab.jobs.states.parse_state_filter), the one parse of the
API's and the jobs page's ``?state=``, and the one read of a page of a job list that both call
(gpulab.jobs.actions.list_jobs), on records that record what they were asked: values in,
values out."""

from __future__ import annotations

import pytest

from gpulab.bounds import DEFAULT_PAGE, MAX_PAGE, page_window
from gpulab.errors import FieldError
from gpulab.jobs.actions import JobList, list_jobs
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


class _Records:
    """Job records that answer one page and remember what they were asked."""

    def __init__(self, total: int = 3):
        self.total, self.asked = total, []

    def page(self, owner, states, labels, limit, offset, newest_first=False, cursor=None):
        self.asked.append((owner, states, labels, limit, offset, newest_first))
        return [{"id": "j1"}], self.total


def test_a_job_list_is_read_as_the_reader_asked():
    records = _Records()
    found = list_jobs(
        records,
        "ann",
        states=" done ,queued,DONE",
        labels=["team=a", "stage=x=y", "team=b"],
        limit="10",
        offset="20",
        newest_first=True,
    )
    assert found == JobList(["DONE", "QUEUED"], [{"id": "j1"}], 3, 10, 20)
    # one more than the page is read: whether there is a next page
    assert records.asked == [
        ("ann", {"DONE", "QUEUED"}, {"team": "b", "stage": "x=y"}, 11, 20, True)
    ]
    # nothing asked: every state, no label, the first default page, oldest first
    assert list_jobs(records, None) == JobList([], [{"id": "j1"}], 3, DEFAULT_PAGE, 0)
    assert records.asked[-1] == (None, None, None, DEFAULT_PAGE + 1, 0, False)


@pytest.mark.parametrize(
    "query, field, message",
    [
        # the first argument at fault is named: the state, then the labels, then the window
        ({"states": "zzz", "labels": ["x"], "limit": "0"}, "state", "unknown state ZZZ"),
        ({"labels": ["team=a", "x"], "limit": "0"}, "label", "label filters are key=value"),
        ({"limit": "0", "offset": "x"}, "limit", "limit must be a whole number of at least 1"),
        (
            {"limit": "501"},
            "limit",
            f"limit must be a whole number of at least 1 and at most {MAX_PAGE}",
        ),
        ({"limit": "²"}, "limit", "limit must be a whole number"),
        ({"offset": "-1"}, "offset", "offset must be a whole number of at least 0"),
        ({"offset": "1000000000"}, "offset", "offset must be a whole number of at least 0"),
        ({"cursor": "not-one"}, "cursor", "cursor is not one this service gave"),
        ({"cursor": "x" * 129}, "cursor", "cursor is not one this service gave"),
    ],
)
def test_a_job_list_query_is_refused_naming_the_first_argument_at_fault(query, field, message):
    records = _Records()
    with pytest.raises(Invalid) as e:
        list_jobs(records, "ann", **query)
    assert e.value.status == 400 and e.value.field == field
    assert e.value.message.startswith(message)
    assert records.asked == []  # refused before any read


def test_the_page_window_of_every_list():
    assert page_window(None, None) == (DEFAULT_PAGE, 0)
    assert page_window("1", "999999999") == (1, 999_999_999)
    assert page_window(str(MAX_PAGE), "0") == (MAX_PAGE, 0)
    for limit, offset, field in (("", "0", "limit"), (" 5", "0", "limit"), ("5", "", "offset")):
        with pytest.raises(FieldError) as e:
            page_window(limit, offset)
        assert e.value.field == field
