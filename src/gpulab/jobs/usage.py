"""Billed minutes of a user's jobs, read from the job records with caches that keep the
usage page and API cheap for users with many ended jobs (the rules of what is billed are
:mod:`gpulab.billing`'s)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from ..billing import billed_minutes
from ..db import Database, Job, JobEvent
from ..lifecycle import utcnow
from .states import ENDED


def owner_usage(db: Database, instance: str, owner: str) -> dict:
    """Billed minutes of the owner's jobs (in ``instance``).

    An ended job's bill cannot change until the job changes again, so the sum over the
    owner's ended jobs is kept per (owner, how many, latest change): any job that ends,
    is resumed or is deleted changes that key (writes are serialized and stamped with the
    time they commit; a clock stepped back could reuse a key, for a stale sum until the
    next job ends). Only unfinished jobs' histories are read on every call (a user with 200
    ended jobs costs two small queries, not 1,000 event rows: bench/bench_api.py)."""
    now = utcnow()
    ended = [e.value for e in ENDED]
    mine = (Job.instance == instance, Job.owner == owner)
    with db.read() as s:
        conn = s.connection()  # plain rows: no ORM work per row
        count, latest = conn.execute(
            select(func.count(), func.max(Job.updated)).where(*mine, Job.state.in_(ended))
        ).one()
        ended_total = _USAGE.get((instance, owner, count, latest))
        if ended_total is None:
            rows = conn.execute(
                select(Job.id, Job.state, Job.updated).where(*mine, Job.state.in_(ended))
            ).all()
            ended_total = sum(bills_of(conn, rows, now).values())
            if len(_USAGE) >= _BILLS_MAX:
                _USAGE.clear()
            # keyed by what was summed (a job may have ended between the two queries)
            latest = max((r.updated for r in rows), default=None)
            _USAGE[(instance, owner, len(rows), latest)] = ended_total
        live = conn.execute(
            select(Job.id, Job.state, Job.updated).where(*mine, Job.state.not_in(ended))
        ).all()
        live_total = sum(bills_of(conn, live, now).values())
    return {
        "user": owner,
        "jobs_billed_minutes": ended_total + live_total,
        "jobs": count + len(live),
    }


def bills_of(s, jobs, now: datetime) -> dict[str, int]:
    """Billed minutes of (id, state, updated) jobs: ended ones from the per-process cache
    where they are in it, the others from one query of their transitions."""
    ended = {e.value for e in ENDED}
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
#: the sum of an owner's ended jobs' bills by (instance, owner, how many, latest change)
_USAGE: dict[tuple, int] = {}
