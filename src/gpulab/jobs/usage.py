"""Billed minutes of a user's jobs, from kept totals (the rules of what is billed are
:mod:`gpulab.billing`'s).

Each time one of a job's billed periods closes, :func:`settle` adds the minutes its bill grew
by to its owner's total for that month (:class:`~gpulab.db.BilledMonth`), in the transaction
that records the close; the job keeps how many it settled (``Job.settled_minutes``). A
user's usage (:func:`owner_usage`) and a month's report (:func:`month_report`) read those
totals plus what live jobs' open periods add so far (only live jobs' histories are read): the
same cost with 100 or 100,000 ended jobs, and unchanged when records are deleted (retention,
a user's delete). ``tests/unit/test_billing_totals.py`` checks, on many jobs across month
boundaries, that they equal a scan of the records to the minute.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select

from ..billing import billed_minutes, month_of, settled_minutes
from ..db import BilledMonth, Database, Job, JobEvent
from ..lifecycle import JobState, utcnow
from .gang import spec_workers
from .states import ENDED

_ENDED_VALUES = [e.value for e in ENDED]
#: the states of live jobs, named (an IN on the state index; a NOT IN reads every row)
_LIVE_VALUES = [s.value for s in JobState if s not in ENDED]


def gpus_of(spec: dict | None) -> int:
    """Every worker's GPUs of a job's stored spec together (what a GPU-minute counts)."""
    try:
        gpus = int(((spec or {}).get("resources") or {}).get("gpus") or 0)
    except (TypeError, ValueError):
        gpus = 0
    return gpus * spec_workers(spec)


def settle(db: Database, s, job: Job, now: datetime) -> None:
    """Add what ``job``'s bill grew by since it last settled (its closed periods' commenced
    minutes, :func:`gpulab.billing.settled_minutes`) to its owner's total for ``now``'s
    month, in the caller's transaction ``s``, which holds the job's row and has appended the
    event that closed a period. Serialized per owner (PostgreSQL: an advisory lock; SQLite's
    writers hold the database lock), so that two jobs of one owner closing at once add both."""
    # the event just appended has no kind until it is flushed (the column's default)
    settled = settled_minutes([e for e in job.events if (e.kind or "transition") == "transition"])
    grown = settled - (job.settled_minutes or 0)
    if grown <= 0:
        return
    job.settled_minutes = settled
    month = month_of(now)
    db.serialize(s, "gpulab-billing", job.instance, job.owner)
    row = s.scalar(
        select(BilledMonth).where(
            BilledMonth.instance == job.instance,
            BilledMonth.owner == job.owner,
            BilledMonth.month == month,
        )
    )
    if row is None:
        row = BilledMonth(
            instance=job.instance, owner=job.owner, month=month, minutes=0, gpu_minutes=0
        )
        s.add(row)
    row.minutes += grown
    row.gpu_minutes += grown * gpus_of(job.spec)


def unsettled(conn, jobs: Sequence, now: datetime) -> dict[str, int]:
    """Minutes live jobs (rows of id and settled_minutes) add to their settled ones so far:
    their open period's (one query of their transitions)."""
    if not jobs:
        return {}
    per_job: dict[str, list] = {row.id: [] for row in jobs}
    for row in conn.execute(
        select(JobEvent.job_id, JobEvent.state, JobEvent.at)
        .where(JobEvent.job_id.in_(list(per_job)), JobEvent.kind == "transition")
        .order_by(JobEvent.job_id, JobEvent.id)
    ):
        per_job[row.job_id].append(row)
    return {
        row.id: max(billed_minutes(per_job[row.id], now) - (row.settled_minutes or 0), 0)
        for row in jobs
    }


def owner_usage(db: Database, instance: str, owner: str) -> dict:
    """Billed minutes of the owner's jobs (in ``instance``), all time: their kept totals plus
    their live jobs' open periods; ``jobs``: how many job records they have now."""
    now = utcnow()
    # what ran: an array's tasks are billed, the array itself never (its events are not)
    mine = (Job.instance == instance, Job.owner == owner, Job.kind != "array")
    with db.read() as s:
        conn = s.connection()  # plain rows: no ORM work per row
        kept = conn.execute(
            select(func.coalesce(func.sum(BilledMonth.minutes), 0)).where(
                BilledMonth.instance == instance, BilledMonth.owner == owner
            )
        ).scalar_one()
        count = conn.execute(
            select(func.count()).select_from(Job).where(*mine, Job.state.in_(_ENDED_VALUES))
        ).scalar_one()
        live = conn.execute(
            select(Job.id, Job.settled_minutes).where(*mine, Job.state.in_(_LIVE_VALUES))
        ).all()
        live_total = sum(unsettled(conn, live, now).values())
    return {
        "user": owner,
        "jobs_billed_minutes": int(kept) + live_total,
        "jobs": count + len(live),
    }


def owners_billed(db: Database, instance: str, owners: list[str]) -> dict[str, int]:
    """Each of ``owners``' billed job minutes, all time, as :func:`owner_usage` counts them
    (kept totals plus live jobs' open periods), for a page of users at once: one grouped
    query of the totals, one of their live jobs, one of those jobs' transitions."""
    if not owners:
        return {}
    now = utcnow()
    out = dict.fromkeys(owners, 0)
    with db.read() as s:
        conn = s.connection()
        for owner, minutes in conn.execute(
            select(BilledMonth.owner, func.sum(BilledMonth.minutes))
            .where(BilledMonth.instance == instance, BilledMonth.owner.in_(owners))
            .group_by(BilledMonth.owner)
        ):
            out[owner] += int(minutes or 0)
        live = conn.execute(
            select(Job.id, Job.owner, Job.settled_minutes).where(
                Job.instance == instance,
                Job.owner.in_(owners),
                Job.kind != "array",
                Job.state.in_(_LIVE_VALUES),
            )
        ).all()
        more = unsettled(conn, live, now)
        for job in live:
            out[job.owner] += more[job.id]
    return out


def month_report(
    db: Database,
    instance: str,
    month: str,
    owner: str | None = None,
    owners: Sequence[str] | None = None,
    after: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Every user's (or ``owner``'s, or only ``owners``': a page of users) billed job
    minutes and GPU-minutes in ``month`` (``"YYYY-MM"``, UTC), by user: the kept totals, and
    for the current month what live jobs' open periods add so far (settled in a later month
    if they close after it). ``after`` and ``limit``: only the first ``limit`` users by name
    after ``after`` (a page: the totals' (instance, owner, month) index walked that far)."""
    now = utcnow()
    out: dict[str, dict] = {}

    def row(user: str) -> dict:
        return out.setdefault(
            user, {"user": user, "jobs_billed_minutes": 0, "jobs_billed_gpu_minutes": 0}
        )

    with db.read() as s:
        conn = s.connection()
        where = [BilledMonth.instance == instance, BilledMonth.month == month]
        if owner is not None:
            where.append(BilledMonth.owner == owner)
        if owners is not None:
            where.append(BilledMonth.owner.in_(list(owners)))
        if after is not None:
            where.append(BilledMonth.owner > after)
        kept = select(BilledMonth.owner, BilledMonth.minutes, BilledMonth.gpu_minutes).where(*where)
        if limit is not None:
            kept = kept.order_by(BilledMonth.owner).limit(limit)
        for user, minutes, gpu_minutes in conn.execute(kept):
            r = row(user)
            r["jobs_billed_minutes"] += int(minutes)
            r["jobs_billed_gpu_minutes"] += int(gpu_minutes)
        if month == month_of(now):
            mine = [Job.instance == instance, Job.state.in_(_LIVE_VALUES)]
            if owner is not None:
                mine.append(Job.owner == owner)
            if owners is not None:
                mine.append(Job.owner.in_(list(owners)))
            if after is not None:
                mine.append(Job.owner > after)
            live = conn.execute(
                select(Job.id, Job.owner, Job.spec, Job.settled_minutes).where(*mine)
            ).all()
            more = unsettled(conn, live, now)
            for job in live:
                if more[job.id]:
                    r = row(job.owner)
                    r["jobs_billed_minutes"] += more[job.id]
                    r["jobs_billed_gpu_minutes"] += more[job.id] * gpus_of(job.spec)
    # a page: the kept totals gave the first ``limit`` names with a row; a live job's owner
    # without one sorts among them or after (then it is on a later page)
    return [out[user] for user in sorted(out)][:limit]


def bills_of(s, jobs, now: datetime) -> dict[str, int]:
    """Billed minutes of (id, state, updated) jobs: ended ones from the per-process cache
    where they are in it, the others from one query of their transitions."""
    ended = set(_ENDED_VALUES)
    out: dict[str, int] = {}
    todo = []
    for job_id, state, updated in jobs:
        cached = _BILLS.get((job_id, updated)) if state in ended else None
        if cached is None:
            todo.append((job_id, state in ended, updated))
        else:
            out[job_id] = cached
    if not todo:
        return out
    per_job: dict[str, list] = {job_id: [] for job_id, _, _ in todo}
    for row in s.execute(
        select(JobEvent.job_id, JobEvent.state, JobEvent.at)
        .where(JobEvent.job_id.in_(list(per_job)), JobEvent.kind == "transition")
        .order_by(JobEvent.job_id, JobEvent.id)
    ):
        per_job[row.job_id].append(row)
    for job_id, is_ended, updated in todo:
        out[job_id] = minutes = billed_minutes(per_job[job_id], now)
        if is_ended:
            if len(_BILLS) >= _BILLS_MAX:
                _BILLS.clear()
            _BILLS[(job_id, updated)] = minutes
    return out


#: bills of ended jobs by (job id, updated): they cannot change while ``updated`` does not
_BILLS: dict[tuple[str, object], int] = {}
_BILLS_MAX = 200_000
