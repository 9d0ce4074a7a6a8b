"""Notebooks that wait for GPUs, in the queue they share with jobs.

A notebook spawn that finds too few GPUs free (and may wait: ``notebook_gpu_wait``, or its
flavor's ``gpu_wait``) adds a row here and polls it. The job supervisor plans the rows with the
queued jobs (one order: priority, fair share, then since when), writes each row's place in
line, and when a notebook's turn comes books its GPUs in the ledger and marks the row
``granted``; the spawn sees that, removes the row and goes on with the GPUs it holds.

Who frees what, whatever happens first:
- the supervisor books, then marks: a row already gone (the spawn gave up: its wait limit,
  its server stopped) marks nothing, and the supervisor releases what it booked;
- the spawn that gives up removes its row, then releases whatever its workload holds (booked
  by a grant it did not see).
So GPUs booked for a notebook that no longer waits are always released, and a GPU is never
booked twice: every booking is the ledger's one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update

from ..db import Database, GpuWait
from ..lifecycle import utcnow

#: the most groups kept per row (a hub's groups are few; the cap bounds a row)
MAX_GROUPS = 64


def _row(r: GpuWait) -> dict:
    try:
        groups = [g for g in json.loads(r.groups or "[]") if isinstance(g, str)]
    except ValueError:
        groups = []
    return {
        "workload": r.workload,
        "owner": r.owner,
        "groups": groups,
        "gpus": r.gpus,
        "since": r.since,
        "until": r.until,
        "granted": bool(r.granted),
        "place": r.place,
        "message": r.message,
        "gpu_model": r.gpu_model or "",
        "node_pool": r.node_pool or "",
    }


class GpuWaits:
    """The ``gpu_waits`` rows of one gpulab instance."""

    def __init__(self, db: Database, instance: str) -> None:
        self.db = db
        self.instance = instance

    def _mine(self, workload: str):
        return (GpuWait.instance == self.instance, GpuWait.workload == workload)

    def add(
        self,
        workload: str,
        owner: str,
        groups: Iterable[str],
        gpus: int,
        until: datetime,
        gpu_model: str = "",
        node_pool: str = "",
    ) -> dict:
        """Start waiting (again: a row left by an earlier spawn is replaced), for ``gpus``
        GPUs of ``gpu_model`` in ``node_pool`` ("" for any)."""
        with self.db.session() as s:
            s.execute(delete(GpuWait).where(*self._mine(workload)))
            row = GpuWait(
                instance=self.instance,
                workload=workload,
                owner=owner,
                groups=json.dumps(sorted(set(groups))[:MAX_GROUPS]),
                gpus=int(gpus),
                since=utcnow(),
                until=until,
                granted=0,
                place=0,
                message="",
                gpu_model=gpu_model,
                node_pool=node_pool,
            )
            s.add(row)
            s.flush()
            return _row(row)

    def get(self, workload: str) -> dict | None:
        with self.db.read() as s:
            r = s.scalars(select(GpuWait).where(*self._mine(workload))).first()
            return _row(r) if r is not None else None

    def remove(self, workload: str) -> bool:
        """Stop waiting; False when there was no row."""
        with self.db.session() as s:
            return s.execute(delete(GpuWait).where(*self._mine(workload))).rowcount > 0

    def waiting(self) -> list[dict]:
        """The rows not granted yet whose wait limit has not passed, oldest first."""
        with self.db.read() as s:
            rows = s.scalars(
                select(GpuWait)
                .where(
                    GpuWait.instance == self.instance,
                    GpuWait.granted == 0,
                    GpuWait.until > utcnow(),
                )
                .order_by(GpuWait.since, GpuWait.workload)
            )
            return [_row(r) for r in rows]

    def anyone_waiting(self) -> bool:
        """Whether a notebook waits in line now (a new spawn then joins the line behind it)."""
        return bool(self.waiting())

    def expire(self, slack: float = 60.0) -> int:
        """Remove the rows whose wait limit passed more than ``slack`` seconds ago: their spawn
        gave up without removing its row (the hub was killed while it waited). Returns how
        many."""
        cutoff = utcnow() - timedelta(seconds=slack)
        with self.db.session() as s:
            done = s.execute(
                delete(GpuWait).where(GpuWait.instance == self.instance, GpuWait.until < cutoff)
            )
            return done.rowcount

    def grant(self, workload: str, booked_for: Mapping | None = None) -> bool:
        """Mark a row granted (its GPUs are booked); False when it is gone or was already
        granted: then the caller releases what it booked. ``booked_for``: the row as read
        when the GPUs were booked; a row that asks for something else now (the server's next
        spawn, for another count, model or pool) is not granted what was booked for it."""
        asked = ()
        if booked_for is not None:
            asked = (
                GpuWait.gpus == booked_for["gpus"],
                GpuWait.gpu_model == (booked_for.get("gpu_model") or ""),
                GpuWait.node_pool == (booked_for.get("node_pool") or ""),
            )
        with self.db.session() as s:
            done = s.execute(
                update(GpuWait)
                .where(*self._mine(workload), GpuWait.granted == 0, *asked)
                .values(granted=1, message="GPUs booked: starting")
            )
            return done.rowcount > 0

    def note(self, said: Mapping[str, tuple[int, str]]) -> None:
        """Write each waiting row's place in line and message (workload -> (place, text))."""
        if not said:
            return
        with self.db.session() as s:
            for workload, (place, message) in said.items():
                s.execute(
                    update(GpuWait)
                    .where(*self._mine(workload), GpuWait.granted == 0)
                    .values(place=place, message=message[:500])
                )
