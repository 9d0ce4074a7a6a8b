"""Billing totals kept per user per month (gpulab.jobs.usage) against a scan of the records.

Many jobs of several users are driven through random walks of the lifecycle (restarts,
re-queues after a preemption, time-outs, resumes of ended jobs) on a clock that crosses two
month boundaries, through the records' own compare-and-set transitions. Then, to the minute:
each user's monthly totals (and GPU-minutes) equal what a scan of every job's history gives
(:func:`gpulab.billing.billed_by_month`), their all-time usage equals the sum of every job's
:func:`~gpulab.billing.billed_minutes`, and deleting the ended jobs' records changes neither.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from gpulab import billing
from gpulab.db import Database, Job, JobEvent
from gpulab.jobs import overview
from gpulab.jobs import records as records_module
from gpulab.jobs import usage as usage_module
from gpulab.jobs.records import JobRecords
from gpulab.jobs.refusals import Invalid
from gpulab.jobs.states import ENDED
from gpulab.lifecycle import JOB_TRANSITIONS, JobState

J = JobState
USERS = ("ann", "bob", "cy", "dee")
#: the next states a walk prefers (towards running and ending), where the lifecycle allows
FORWARD = {
    J.QUEUED: [J.INITIALIZING] * 6 + [J.INTERRUPTED],
    J.INITIALIZING: [J.PENDING] * 6 + [J.QUEUED, J.FAILED],
    J.PENDING: [J.RUNNING] * 8 + [J.QUEUED, J.ERROR],
    J.RUNNING: [J.FINALIZING] * 3 + [J.RESTARTING, J.INTERRUPTING, J.TIMEOUT, J.FAILED],
    J.RESTARTING: [J.RUNNING] * 3 + [J.FAILED, J.INTERRUPTING],
    J.INTERRUPTING: [J.QUEUED, J.QUEUED, J.FINALIZING, J.INTERRUPTED],
    J.TIMEOUT: [J.INTERRUPTING, J.FINALIZING, J.RESTARTING],
    J.FINALIZING: [J.DONE] * 4 + [J.SYNC_FAILED, J.FAILED],
    J.SYNC_FAILED: [J.FINALIZING],
    J.DONE: [J.QUEUED],
    J.FAILED: [J.QUEUED],
    J.INTERRUPTED: [J.QUEUED],
    J.ERROR: [J.QUEUED],
}


class Clock:
    def __init__(self, at: datetime):
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def scan(db: Database, now: datetime) -> tuple[dict, dict, dict]:
    """From the records alone: (user, month) -> minutes and GPU-minutes, user -> minutes."""
    with db.read() as s:
        jobs = {j.id: (j.owner, j.spec) for j in s.scalars(select(Job))}
        history = defaultdict(list)
        for e in s.scalars(select(JobEvent).order_by(JobEvent.id)):
            if e.kind == "transition":
                history[e.job_id].append(e)
    months: dict = defaultdict(int)
    gpu_months: dict = defaultdict(int)
    total: dict = defaultdict(int)
    for job_id, (owner, spec) in jobs.items():
        for month, minutes in billing.billed_by_month(history[job_id], now).items():
            months[owner, month] += minutes
            gpu_months[owner, month] += minutes * usage_module.gpus_of(spec)
        total[owner] += billing.billed_minutes(history[job_id], now)
    return dict(months), dict(gpu_months), dict(total)


def kept(records: JobRecords, months: set[str]) -> tuple[dict, dict, dict]:
    by_month, gpu_by_month = {}, {}
    for month in months:
        for row in records.month_usage(month):
            if row["jobs_billed_minutes"]:
                by_month[row["user"], month] = row["jobs_billed_minutes"]
            if row["jobs_billed_gpu_minutes"]:
                gpu_by_month[row["user"], month] = row["jobs_billed_gpu_minutes"]
    total = {u: records.usage(u)["jobs_billed_minutes"] for u in USERS}
    return by_month, gpu_by_month, {u: m for u, m in total.items() if m}


def test_kept_totals_equal_a_scan_of_the_records_and_survive_their_deletion(tmp_path, monkeypatch):
    rng = random.Random(30)
    clock = Clock(datetime(2026, 1, 31, 22, 0, tzinfo=UTC))
    monkeypatch.setattr(records_module, "utcnow", clock)
    monkeypatch.setattr(usage_module, "utcnow", clock)
    db = Database(f"sqlite:///{tmp_path / 'g.sqlite'}")
    records = JobRecords(db, "lab")
    jobs = []
    for n in range(40):
        gpus, workers = rng.choice([(0, 1), (1, 1), (2, 1), (1, 2), (2, 4)])
        spec = {"command": ["x"], "resources": {"gpus": gpus}, "workers": workers}
        jobs.append(records.create(USERS[n % len(USERS)], spec, None)["id"])
    state = dict.fromkeys(jobs, J.QUEUED)
    for _ in range(500):
        job_id = rng.choice(jobs)
        new = rng.choice(FORWARD[state[job_id]])
        assert new in JOB_TRANSITIONS[state[job_id]]
        records.transition(job_id, new, expect=state[job_id])
        state[job_id] = new
        # mostly seconds apart (partial minutes), sometimes hours or days (month ends)
        kind = rng.random()
        if kind < 0.85:
            step = rng.uniform(1, 59)
        elif kind < 0.95:
            step = rng.uniform(60, 600)
        else:
            step = rng.uniform(0.5 * 86400, 3 * 86400)
        clock.at += timedelta(seconds=step)
    assert {J.RUNNING, J.DONE} <= set(state.values())  # live and ended jobs both
    now = clock.at
    months, gpu_months, total = scan(db, now)
    assert {"2026-01", "2026-02", "2026-03"} <= {m for _, m in months}  # month boundaries
    assert kept(records, {m for _, m in months}) == (months, gpu_months, total)

    ended = [job_id for job_id, st in state.items() if st in ENDED]
    for job_id in ended:  # every ended job's record goes (retention's work)
        records.delete(job_id)
    assert ended and all(records.get(job_id) is None for job_id in ended)
    assert kept(records, {m for _, m in months}) == (months, gpu_months, total)


def test_a_preempted_job_across_midnight_settles_each_part_in_its_month(tmp_path, monkeypatch):
    """The rule in one history: a period's commenced minutes settle when it closes, in the
    month of the close; the job's total is per commenced minute of its whole life."""
    clock = Clock(datetime(2026, 10, 31, 23, 59, 0, tzinfo=UTC))
    monkeypatch.setattr(records_module, "utcnow", clock)
    monkeypatch.setattr(usage_module, "utcnow", clock)
    records = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "lab")
    job_id = records.create("ann", {"command": ["x"], "resources": {"gpus": 1}}, None)["id"]
    walk = [
        (J.INITIALIZING, 1),
        (J.PENDING, 1),
        (J.RUNNING, 20),  # 23:59:02 -> 23:59:22: 20 s
        (J.INTERRUPTING, 10),
        (J.QUEUED, 40),  # closes at 23:59:32: 30 s, 1 minute settled in October
        (J.INITIALIZING, 0),
        (J.PENDING, 0),
        (J.RUNNING, 45),  # 00:00:12 -> 00:00:57: 45 s more, 75 s in all: 2 minutes
        (J.FINALIZING, 0),
    ]
    for new, seconds in walk:
        old = J(records.get(job_id)["state"])
        records.transition(job_id, new, expect=old)
        clock.at += timedelta(seconds=seconds)
    assert records.month_usage("2026-10") == [
        {"user": "ann", "jobs_billed_minutes": 1, "jobs_billed_gpu_minutes": 1}
    ]
    assert records.month_usage("2026-11")[0]["jobs_billed_minutes"] == 1
    assert records.usage("ann")["jobs_billed_minutes"] == 2 == records.get(job_id)["billed_minutes"]


def test_the_report_s_month_is_checked_and_defaults_to_this_month(tmp_path, monkeypatch):
    clock = Clock(datetime(2026, 11, 27, 3, 0, tzinfo=UTC))
    monkeypatch.setattr(overview, "utcnow", clock)
    records = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "lab")
    assert overview.month_usage(records, None, None) == {"month": "2026-11", "users": []}
    for bad in ("2026-13", "2026-1", "11/2026", "2026-11-01", "0000-01", "2026-00"):
        with pytest.raises(Invalid) as e:
            overview.month_usage(records, bad, None)
        assert e.value.field == "month" and "YYYY-MM" in e.value.message
