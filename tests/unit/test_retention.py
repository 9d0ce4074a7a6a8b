"""Retention of ended jobs (gpulab.jobs.retention and the service's sweep) on a SQLite
database with a clock of the test's own: which jobs go and when (rules as data), never one
that is not ended nor a SYNC_FAILED one, their events and saved logs with them, a 404
afterwards, billing unchanged, and the sweep's bounded batches (one batch's time printed,
not asserted: docs/jobs.md#retention)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpulab.db import Database, Job, JobEvent
from gpulab.jobs import records as records_module
from gpulab.jobs import usage as usage_module
from gpulab.jobs.records import JobRecords
from gpulab.jobs.retention import delete_expired
from gpulab.jobs.spec import JobSpec, job_spec_schema
from gpulab.lifecycle import JobState
from gpulab.service.tasks import retention as task
from tests.conftest import run_async
from tests.support.jobspecs import CATALOG, FLAVORS, LIMITS, parse, refused

J = JobState
DAY = 86400.0
RUN = [J.INITIALIZING, J.PENDING, J.RUNNING, J.FINALIZING]


class Lab:
    def __init__(self, tmp_path, monkeypatch):
        self.at = datetime(2026, 11, 1, tzinfo=UTC)
        monkeypatch.setattr(records_module, "utcnow", lambda: self.at)
        monkeypatch.setattr(usage_module, "utcnow", lambda: self.at)
        self.records = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "lab")
        self.logs = tmp_path / "logs"
        self.logs.mkdir()

    def job(self, path: list[JobState], own: float | None = None, owner: str = "ann") -> str:
        spec = {"command": ["x"], "resources": {"gpus": 1}, "auto_delete_after": own}
        job_id = self.records.create(owner, spec, None)["id"]
        state = J.QUEUED
        for new in path:
            self.at += timedelta(seconds=90)
            self.records.transition(job_id, new, expect=state)
            state = new
        (self.logs / f"{job_id}.log").write_text("output\n")
        return job_id

    def saved_logs(self, job_id: str) -> list:
        return [self.logs / f"{job_id}.log"]

    def sweep(self, default: float | None, batch: int = 100) -> list[str]:
        return delete_expired(
            self.records, self.saved_logs, default=default, batch=batch, now=self.at
        )

    def kept(self, *ids: str) -> list[bool]:
        return [self.records.get(i) is not None for i in ids]


def test_which_ended_jobs_go_and_when(tmp_path, monkeypatch):
    lab = Lab(tmp_path, monkeypatch)
    done = lab.job(RUN + [J.DONE])
    failed = lab.job([J.INITIALIZING, J.FAILED])
    interrupted = lab.job([J.INTERRUPTED])
    error = lab.job([J.ERROR])
    sync_failed = lab.job(RUN + [J.SYNC_FAILED])  # its output waits for a push
    running = lab.job([J.INITIALIZING, J.PENDING, J.RUNNING], owner="bob")  # bills on
    queued = lab.job([])
    long = lab.job(RUN + [J.DONE], own=30 * DAY)  # its own: longer than the site's
    resumed = lab.job([J.INTERRUPTED, J.QUEUED], own=60)  # ended, then queued again
    short = lab.job(RUN + [J.DONE], own=60)  # its own: a minute, ended just now
    every = [done, failed, interrupted, error, sync_failed, running, queued, short, long, resumed]
    usage = lab.records.usage("ann")

    assert lab.sweep(default=None) == []  # a minute has not passed since short ended
    lab.at += timedelta(seconds=60)
    assert lab.sweep(default=None) == [short]  # the site keeps the others forever
    lab.at += timedelta(days=8)
    gone = lab.sweep(default=7 * DAY)
    assert set(gone) == {done, failed, interrupted, error}
    lab.at += timedelta(days=365)
    assert set(lab.sweep(default=7 * DAY)) == {long}
    assert lab.kept(*every) == [
        False, False, False, False, True, True, True, False, False, True
    ]  # fmt: skip
    for job_id in gone + [short, long]:
        assert not lab.saved_logs(job_id)[0].exists()  # its saved log went with it
    for job_id in (sync_failed, running, queued, resumed):
        assert lab.saved_logs(job_id)[0].exists()
    assert usage["jobs_billed_minutes"] == 8  # 4 runs of 90 s: 2 minutes each
    assert lab.records.usage("ann")["jobs_billed_minutes"] == usage["jobs_billed_minutes"]


def test_a_job_resumed_after_its_end_is_not_deleted_and_a_new_end_counts_again(
    tmp_path, monkeypatch
):
    lab = Lab(tmp_path, monkeypatch)
    job_id = lab.job(RUN + [J.DONE], own=3600)
    lab.at += timedelta(seconds=3000)
    lab.records.transition(job_id, J.QUEUED, expect=J.DONE)  # resumed before its hour
    lab.at += timedelta(days=30)
    assert lab.sweep(default=DAY) == []  # not ended: never, whatever its age
    lab.records.transition(job_id, J.INTERRUPTED, expect=J.QUEUED)
    lab.at += timedelta(seconds=3599)
    assert lab.sweep(default=None) == []
    lab.at += timedelta(seconds=1)
    assert lab.sweep(default=None) == [job_id] and lab.records.get(job_id) is None


def test_an_array_goes_whole_once_every_task_may_go_and_never_a_task_alone(tmp_path, monkeypatch):
    lab = Lab(tmp_path, monkeypatch)
    spec = {"command": ["x"], "resources": {"gpus": 1}, "completions": 2, "parallelism": 2}

    def array(own=None, first=J.DONE, second=J.DONE) -> tuple[str, list[str]]:
        tasks = [{**spec, "task": {"index": i}} for i in range(2)]
        array = lab.records.create("ann", {**spec, "auto_delete_after": own}, "a", tasks=tasks)
        ids = [t["id"] for t in lab.records.get(array["id"])["tasks"]]
        for task_id, end in zip(ids, (first, second), strict=True):
            state = J.QUEUED
            for new in [*RUN, end]:
                lab.at += timedelta(seconds=90)
                lab.records.transition(task_id, new, expect=state)
                state = new
            (lab.logs / f"{task_id}.log").write_text("output\n")
        return array["id"], ids

    done, done_tasks = array()
    # FAILED (its first task's end), its second task's output waiting for a push
    pushing, pushing_tasks = array(first=J.FAILED, second=J.SYNC_FAILED)
    own, own_tasks = array(own=60)
    assert lab.records.get(done)["state"] == "DONE"
    assert lab.records.get(own)["state"] == "DONE"
    assert lab.records.get(pushing)["state"] == "FAILED"
    lab.at += timedelta(seconds=60)
    assert set(lab.sweep(default=None)) == {own, *own_tasks}  # its own minute, tasks with it
    lab.at += timedelta(days=8)
    assert set(lab.sweep(default=7 * DAY)) == {done, *done_tasks}
    assert not any(lab.saved_logs(t)[0].exists() for t in done_tasks)
    # the array whose task waits for a push stays whole, its FAILED task too
    assert lab.kept(pushing, *pushing_tasks) == [True, True, True]
    # arrays kept so, however many, never hold the line: the job due behind them goes
    held = [array(first=J.FAILED, second=J.SYNC_FAILED)[0] for _ in range(3)]
    behind = lab.job(RUN + [J.DONE])
    lab.at += timedelta(days=8)
    assert lab.sweep(default=7 * DAY, batch=2) == [behind]
    assert lab.kept(pushing, *held) == [True] * 4


def seed(lab: Lab, n: int) -> list[str]:
    """``n`` DONE jobs of 7 users, each with the 6 events of a run, in one transaction (the
    records' own transitions would cost a transaction each)."""
    ids = [f"jseed{i:05d}" for i in range(n)]
    with lab.records.db.session() as s:
        for i, job_id in enumerate(ids):
            job = Job(
                id=job_id,
                instance="lab",
                owner=f"u{i % 7}",
                name=job_id,
                spec={"command": ["x"]},
                state=J.DONE.value,
                submitted=lab.at,
                updated=lab.at,
            )
            for state in [J.QUEUED, *RUN, J.DONE]:
                job.events.append(JobEvent(at=lab.at, state=state.value))
            s.add(job)
    return ids


def test_the_sweep_goes_in_bounded_batches_until_none_is_left(tmp_path, monkeypatch):
    lab = Lab(tmp_path, monkeypatch)
    ids = seed(lab, 230)  # ended now
    live = lab.job([J.INITIALIZING, J.PENDING, J.RUNNING])
    lab.at += timedelta(days=2)
    calls = []
    real = task.delete_expired

    def counted(*a, **kw):
        start = time.perf_counter()
        out = real(*a, **kw, now=lab.at)
        calls.append((len(out), (time.perf_counter() - start) * 1000))
        return out

    monkeypatch.setattr(task, "delete_expired", counted)
    monkeypatch.setattr(task, "BATCH_PAUSE", 0)
    settings = SimpleNamespace(job_retention=DAY, job_retention_batch=100)
    sup = SimpleNamespace(records=lab.records, saved_logs=lab.saved_logs)
    assert run_async(task.sweep(settings, sup)) == 230
    assert [n for n, _ in calls] == [100, 100, 30]
    assert not any(lab.kept(*ids)) and lab.kept(live) == [True]
    # what a batch holds the write lock for (6 events a job, SQLite on this disk): a bench
    # note, not a test of speed
    print(f"retention: one batch of 100 jobs (600 events) in {calls[0][1]:.1f} ms")


@pytest.mark.parametrize(
    ("value", "wanted"),
    [("7d", 7 * DAY), (3600, 3600.0), ("1h30m", 5400.0), (None, None), ("", None)],
)
def test_auto_delete_after_is_a_duration(value, wanted):
    spec = parse({"command": ["x"], "auto_delete_after": value})
    assert spec.auto_delete_after == wanted
    assert JobSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("value", "words", "site_max"),
    [
        ("30s", "at least 1m", None),
        (59, "at least 1m", None),
        ("never", "duration such as", None),
        (True, "duration such as", None),
        (-5, "longer than zero", None),
        ("3651d", "at most 3650d", None),
        ("31d", "at most 30d", 30 * DAY),
    ],
)
def test_a_bad_auto_delete_after_is_refused_naming_the_field(value, words, site_max):
    refused(
        {"command": ["x"], "auto_delete_after": value},
        "auto_delete_after",
        words,
        max_retention=site_max,
    )


def test_the_schema_says_the_sites_longest_retention():
    schema = job_spec_schema(
        catalog=CATALOG,
        flavors=FLAVORS,
        limits=LIMITS,
        allowed_images=(),
        host_gpus=4,
        quota_gpus=None,
        quota_jobs=None,
        max_timeout=DAY,
        max_retention=30 * DAY,
    )
    number = schema["properties"]["auto_delete_after"]["oneOf"][0]
    assert (number["minimum"], number["maximum"]) == (60, 30 * DAY)


def test_a_job_changed_between_the_pick_and_the_deletion_is_kept(tmp_path, monkeypatch):
    """The pick is a read without the write lock: the deletion re-reads each job with the
    same conditions, its row locked, and deletes only those still due (a compare-and-set)."""
    lab = Lab(tmp_path, monkeypatch)
    resumed = lab.job([J.INTERRUPTED])
    pushing = lab.job(RUN + [J.DONE])
    kept_due = lab.job(RUN + [J.DONE])
    spec = {"command": ["x"], "resources": {"gpus": 1}, "completions": 2, "parallelism": 2}
    tasks = [{**spec, "task": {"index": i}} for i in range(2)]
    array = lab.records.create("ann", spec, "a", tasks=tasks)["id"]
    task_ids = [t["id"] for t in lab.records.get(array)["tasks"]]
    for task_id in task_ids:
        state = J.QUEUED
        for new in [*RUN, J.DONE]:
            lab.at += timedelta(seconds=90)
            lab.records.transition(task_id, new, expect=state)
            state = new
    lab.at += timedelta(days=2)
    real = lab.records._due

    def meanwhile(*a, **kw):
        picked = real(*a, **kw)
        assert {resumed, pushing, kept_due, array} <= set(picked)
        lab.records.transition(resumed, J.QUEUED, expect=J.INTERRUPTED)  # its owner resumes
        with lab.records.db.session() as s:  # another writer: not retained any more
            for job_id in (pushing, task_ids[1]):
                s.get(Job, job_id).state = J.SYNC_FAILED.value
        return picked

    monkeypatch.setattr(lab.records, "_due", meanwhile)
    assert lab.sweep(default=DAY) == [kept_due]
    assert lab.kept(resumed, pushing, kept_due, array, *task_ids) == [
        True, True, False, True, True, True
    ]  # fmt: skip


def test_the_pick_walks_an_index_to_its_batch_and_takes_the_oldest_due_first(tmp_path, monkeypatch):
    """Each rule's pick is a walk of one index that stops at the batch (SQLite's plan: no
    scan of the ended jobs, no sort of them), and the two rules' picks merge oldest due first."""
    lab = Lab(tmp_path, monkeypatch)
    first = lab.job(RUN + [J.DONE])  # the site's rule: due a day after its end
    lab.at += timedelta(hours=1)
    own = lab.job(RUN + [J.DONE], own=60)  # its own: due a minute after its end
    lab.at += timedelta(hours=1)
    last = lab.job(RUN + [J.DONE])
    lab.at += timedelta(days=2)
    plans, rereads = [], []
    engine = lab.records.db.engine
    from sqlalchemy import event

    @event.listens_for(engine, "before_cursor_execute")
    def explain(conn, cursor, statement, parameters, context, executemany):
        if not statement.lstrip().upper().startswith("SELECT JOBS.ID, JOBS."):
            return
        plan = " ".join(
            r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        )
        (plans if "LIMIT" in statement else rereads).append(plan)

    with lab.records.db.read() as s:
        assert lab.records._due(s, lab.at, DAY, 2) == [first, own]
    assert len(plans) == 2, plans
    assert "INDEX ix_jobs_delete_at" in plans[0] and "ix_jobs_instance_updated" in plans[1]
    assert not any("TEMP B-TREE" in p or "SCAN" in p for p in plans), plans
    assert lab.sweep(default=DAY, batch=2) == [first, own] and lab.kept(last) == [True]
    seed(lab, 150)  # a batch of 100 to re-read (SQLite's planner changes its mind past a few)
    lab.at += timedelta(days=2)
    assert len(lab.sweep(default=DAY, batch=100)) == 100
    event.remove(engine, "before_cursor_execute", explain)
    # the deletion re-reads the picked jobs by their primary key, nothing else
    assert rereads and all(
        p == "SEARCH jobs USING INDEX sqlite_autoindex_jobs_1 (id=?)" for p in rereads
    ), rereads
