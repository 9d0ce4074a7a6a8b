"""The admin page's and lists' reads as the record layer answers them (gpulab.jobs.records,
gpulab.notebooks.records), on a real SQLite file: each count equals a Python scan of the same
rows, and each cursor walks every row once, in order (issue #32: pages that read counts and
pages, never every row)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from sqlalchemy import select

from gpulab.db import Database, Job
from gpulab.jobs import overview
from gpulab.jobs.actions import list_jobs
from gpulab.jobs.records import JobRecords, job_cursor, parse_job_cursor
from gpulab.jobs.states import ACTIVE
from gpulab.lifecycle import JobState, NotebookState, utcnow
from gpulab.notebooks.records import NotebookRecords

J, N = JobState, NotebookState
SPEC = {"image": "img", "command": ["true"], "resources": {"gpus": 1}, "workers": 1}
PATHS = [
    [],
    [J.INITIALIZING],
    [J.INITIALIZING, J.PENDING, J.RUNNING],
    [J.INITIALIZING, J.PENDING, J.RUNNING, J.FINALIZING, J.DONE],
    [J.INITIALIZING, J.PENDING, J.RUNNING, J.FAILED],
]
USERS = ["ann", "bob", "cy", "dan", "eve", "fay", "gus"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> tuple[JobRecords, NotebookRecords]:
    """One platform for the module's tests (they only read it)."""
    rng = random.Random(32)
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('admin-reads') / 'g.sqlite'}")
    jobs, notebooks = JobRecords(db, "t"), NotebookRecords(db, "t")
    other = JobRecords(db, "other")  # another instance's rows are never counted
    other.create("ann", dict(SPEC), None)
    for i in range(40):
        owner = rng.choice(USERS[:-1])  # gus has notebooks only
        groups = (f"g{i}",)
        if i % 9 == 0:  # an array: one row to its owner, its tasks run (and are counted)
            tasks = [{**SPEC, "task": {"index": k, "parameters": {}}} for k in range(3)]
            jobs.create(owner, dict(SPEC), None, groups=groups, tasks=tasks)
            continue
        job_id = jobs.create(owner, dict(SPEC), None, groups=groups)["id"]
        before = J.QUEUED
        for state in rng.choice(PATHS):
            jobs.transition(job_id, state, expect=before)
            before = state
    for user, server, states in [
        ("gus", "", [N.STARTING, N.RUNNING]),
        ("gus", "b", [N.STARTING, N.RUNNING, N.STOPPING, N.STOPPED]),
        ("ann", "", [N.STARTING]),
        ("cy", "x", [N.STARTING, N.RUNNING]),
        ("cy", "y", [N.STARTING]),
    ]:
        for state in states:
            notebooks.transition(user, server, state)
    return jobs, notebooks


def scan(jobs: JobRecords) -> list[Job]:
    with jobs.db.read() as s:
        return list(s.scalars(select(Job).where(Job.instance == "t")))


def test_each_users_counts_equal_a_scan_of_their_jobs(seeded):
    jobs, _ = seeded
    rows = scan(jobs)
    got = jobs.owner_rows(USERS)
    active = {s.value for s in ACTIVE}
    for user in USERS:
        mine = [j for j in rows if j.owner == user and j.kind != "array"]  # what runs
        if not mine:
            assert user not in got
            continue
        newest = max((j for j in rows if j.owner == user), key=lambda j: (j.submitted, j.id))
        assert got[user] == {
            "jobs": len(mine),
            "jobs_active": sum(j.state in active for j in mine),
            "jobs_queued": sum(j.state == "QUEUED" for j in mine),
            "groups": newest.groups.split(","),
        }, user
    assert jobs.owner_rows([]) == {}


def test_everyones_counts_and_total_equal_a_scan(seeded):
    jobs, _ = seeded
    rows = [j for j in scan(jobs) if j.kind != "task"]  # an array once, as its owner sees it
    assert jobs.counts(None) == dict(Counter(j.state for j in rows))
    assert jobs.total() == len(rows) == sum(jobs.counts(None).values())
    newest, total = jobs.page(None, None, None, 5, 0, True, with_total=False)
    assert total is None
    order = sorted(rows, key=lambda j: (j.submitted, j.id), reverse=True)
    assert [j["id"] for j in newest] == [j.id for j in order[:5]]
    some = [rows[0].id, rows[1].id, "jnone"]
    assert jobs.existing(some) == {rows[0].id, rows[1].id}


def test_the_owners_cursor_walks_every_owner_once(seeded):
    jobs, notebooks = seeded
    owners = sorted({j.owner for j in scan(jobs)})
    for size in (1, 2, 4, 100):
        walked, after = [], ""
        while True:
            page = jobs.owners_after(after, size)
            assert len(page) <= size
            if not page:
                break
            walked += page
            after = page[-1]
        assert walked == owners, size
    assert notebooks.users_after("", 10) == ["ann", "cy", "gus"]
    assert notebooks.users_after("ann", 1) == ["cy"]


def test_a_pages_billed_minutes_equal_each_users_own(seeded):
    jobs, notebooks = seeded
    got = jobs.usage_of_owners(USERS)
    assert got == {u: jobs.usage(u)["jobs_billed_minutes"] for u in USERS}
    assert sum(got.values()) > 0  # some ran: the check is not of zeros
    nb = notebooks.billed_minutes_of(USERS)
    assert nb == {u: notebooks.billed_minutes(u) for u in USERS}
    assert nb["gus"] >= 2  # two notebooks that ran, a commenced minute each


def test_a_months_report_of_a_page_of_users_is_theirs_of_everyones(seeded):
    jobs, _ = seeded
    month = utcnow().strftime("%Y-%m")
    everyone = jobs.month_usage(month)
    page = ["bob", "cy"]
    assert jobs.month_usage(month, None, page) == [r for r in everyone if r["user"] in page]
    assert everyone  # some ran this month


def test_the_notebooks_cursor_walks_every_notebook_once(seeded):
    _, notebooks = seeded
    every = [(n["user"], n["server"]) for n in notebooks.list(None)]
    for size in (1, 2, 3, 10):
        walked, after = [], None
        while True:
            page = notebooks.page_after(after, size)
            if not page:
                break
            walked += [(n["user"], n["server"]) for n in page]
            after = walked[-1]
        assert walked == every, size
    rows = notebooks.list(None)
    assert notebooks.user_rows(["gus", "cy", "ann", "bob"]) == {
        u: {
            "notebooks": sum(n["user"] == u for n in rows),
            "notebooks_running": sum(n["user"] == u and n["state"] == "RUNNING" for n in rows),
        }
        for u in ("gus", "cy", "ann")
    }


def test_the_months_report_pages_walk_every_user_once(seeded):
    jobs, _ = seeded
    month = utcnow().strftime("%Y-%m")
    everyone = overview.month_usage(jobs, month, None)["users"]
    assert len(everyone) >= 3
    for size in (1, 2, 100):
        walked, after = [], None
        while True:
            page = overview.month_usage(jobs, month, None, after, size)
            assert len(page["users"]) <= size
            walked += page["users"]
            after = page["next_after"]
            if after is None:
                break
            assert after == walked[-1]["user"]
        assert walked == everyone, size


def test_a_job_lists_cursor_walks_every_job_once_in_order(seeded):
    """GET /api/jobs and the jobs page: each next page after the last job of the one
    before, newest or oldest first, filtered or not; the total is of every match."""
    jobs, _ = seeded
    rows = [j for j in scan(jobs) if j.kind != "task"]
    for owner, states, newest in ((None, "", True), ("ann", "", False), (None, "QUEUED", False)):
        mine = [j for j in rows if owner in (None, j.owner) and states in ("", j.state)]
        mine.sort(key=lambda j: (j.submitted, j.id), reverse=newest)
        for size in ("1", "3", "500"):
            walked, cursor = [], None
            while True:
                page = list_jobs(
                    jobs, owner, states=states, limit=size, newest_first=newest, cursor=cursor
                )
                assert page.total == len(mine)
                walked += [j["id"] for j in page.jobs]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert walked == [j.id for j in mine], (owner, states, newest, size)
    # labels filter the same walk (every seeded job has none: a label nobody has)
    assert list_jobs(jobs, None, labels=["team=x"]).jobs == []
    labelled = list_jobs(
        jobs, None, labels=["team=x"], cursor=job_cursor(list_jobs(jobs, None).jobs[0])
    )
    assert labelled.jobs == [] and labelled.total == 0
    assert (
        parse_job_cursor(job_cursor({"submitted": "2026-11-27T10:00:00.5Z", "id": "j1"}))[1] == "j1"
    )


def test_a_cursor_walks_jobs_submitted_at_the_same_instant_once_each(tmp_path):
    """Ties on the submission time are broken by the id, newest and oldest first, whatever
    the page size; a job deleted between two pages does not break the walk."""
    from sqlalchemy import update

    db = Database(f"sqlite:///{tmp_path / 'g.sqlite'}")
    jobs = JobRecords(db, "t")
    ids = [jobs.create("ann", dict(SPEC), None)["id"] for _ in range(7)]
    same = utcnow()
    with db.session() as s:
        s.execute(update(Job).where(Job.id.in_(ids[:5])).values(submitted=same))
    order = sorted((j.submitted, j.id) for j in scan(jobs))
    for newest in (True, False):
        wanted = [i for _, i in (reversed(order) if newest else order)]
        for size in ("1", "2", "3"):
            walked, cursor = [], None
            while True:
                page = list_jobs(jobs, "ann", limit=size, newest_first=newest, cursor=cursor)
                walked += [j["id"] for j in page.jobs]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert walked == wanted, (newest, size)
    # a job deleted between pages: the rest are walked all the same
    first = list_jobs(jobs, "ann", limit="2", newest_first=True)
    jobs.transition(first.jobs[-1]["id"], JobState.INITIALIZING, expect=JobState.QUEUED)
    jobs.transition(first.jobs[-1]["id"], JobState.FAILED, expect=JobState.INITIALIZING)
    jobs.delete(first.jobs[-1]["id"])
    rest = list_jobs(jobs, "ann", limit="10", newest_first=True, cursor=first.next_cursor)
    assert [j["id"] for j in first.jobs[:1] + rest.jobs] == [
        i for _, i in reversed(order) if i != first.jobs[-1]["id"]
    ]


def test_a_cursor_is_refused_unless_this_service_could_have_given_it():
    """A cursor names a job's id as the service makes them and a time in UTC: one naming a
    NUL (a 500 on PostgreSQL) or any other id is refused; another time zone is read as the
    instant it names."""
    import base64

    def made(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    for bad in ("2026-11-27T10:00:00Z|\x00", "2026-11-27T10:00:00Z|J1", "2026-11-27T10:00:00|j1"):
        with pytest.raises(ValueError, match="not one this service gave"):
            parse_job_cursor(made(bad))
    at, job_id = parse_job_cursor(made("2026-11-27T15:00:00+05:00|j1"))
    assert (at.isoformat(), job_id) == ("2026-11-27T10:00:00+00:00", "j1")
