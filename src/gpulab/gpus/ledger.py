"""The GPU ledger: which workload holds which device, shared by every gpulab process.

A device is handed out by inserting a row under a uniqueness constraint on (device, share), so
two processes can never both hold it. The ledger survives restarts and is reconciled with the
engine's labelled containers at start-up.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from ..db import Database, GpuAllocation, Job
from ..lifecycle import utcnow
from .inventory import GpuDevice

log = logging.getLogger(__name__)
RESERVE_ATTEMPTS = 50


class NoGpuAvailable(RuntimeError):
    def __init__(self, asked: int, total: int, in_use: int):
        self.asked, self.total, self.in_use = asked, total, in_use
        free = total - in_use
        if asked > total:
            msg = f"{asked} GPUs requested but this host has {total}"
        else:
            msg = (
                f"no GPU free for this request: {asked} requested, "
                f"{in_use} of {total} in use, {free} free; try again later or ask for fewer"
            )
        super().__init__(msg)


class GpuQuotaExceeded(NoGpuAvailable):
    """The owner's GPUs (notebooks and in-quota jobs together) would exceed their quota."""

    def __init__(self, asked: int, held: int, quota: int):
        self.asked, self.held, self.quota = asked, held, quota
        RuntimeError.__init__(
            self,
            f"{asked} GPU(s) requested but you already hold {held} of your quota of {quota} "
            "(notebooks and jobs together): stop a notebook or wait for a job to end",
        )


class GpuLedger:
    def __init__(self, db: Database, instance: str, devices: Sequence[GpuDevice]):
        self.db = db
        self.instance = instance
        self.devices = list(devices)

    def reserve(
        self, workload: str, owner: str, kind: str, count: int, quota: int | None = None
    ) -> list[str]:
        """Give ``count`` free devices to ``workload`` (the ones it holds if it has some).

        ``quota``: the most GPUs ``owner`` may hold in quota, notebooks and jobs together
        (None: no limit). GPUs lent to the owner's over-quota (preemptible) jobs do not count.
        The count and the insert are one transaction, serialized per owner, so that two
        reservations at once cannot overshoot it (GpuQuotaExceeded).
        """
        if count <= 0:
            return []
        for attempt in range(RESERVE_ATTEMPTS):
            try:
                with self.db.session() as s:
                    if quota is not None:
                        self.db.serialize(s, "gpulab-gpus", self.instance, owner)
                    held = s.execute(
                        select(
                            GpuAllocation.device, GpuAllocation.workload, GpuAllocation.owner
                        ).where(GpuAllocation.instance == self.instance)
                    ).all()
                    mine = [d for d, w, _ in held if w == workload]
                    if mine:
                        return sorted(mine)
                    if quota is not None:
                        lent = self._lent_workloads(s, owner)
                        in_quota = sum(1 for _, w, o in held if o == owner and w not in lent)
                        if in_quota + count > quota:
                            raise GpuQuotaExceeded(count, in_quota, quota)
                    busy = {d for d, _, _ in held}
                    free = [d.id for d in self.devices if d.id not in busy]
                    if len(free) < count:
                        raise NoGpuAvailable(count, len(self.devices), len(busy))
                    chosen = free[:count]
                    for dev in chosen:
                        s.add(
                            GpuAllocation(
                                instance=self.instance,
                                device=dev,
                                share=0,
                                workload=workload,
                                kind=kind,
                                owner=owner,
                            )
                        )
                return chosen
            except IntegrityError:
                # another process took one of them between our read and write (PostgreSQL:
                # the unique constraint decides): look again, after a short random pause
                log.info("GPU reservation for %s raced another; retrying", workload)
                time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
        raise RuntimeError(f"GPU reservation for {workload} kept racing; try again")

    def _lent_workloads(self, s, owner: str) -> set[str]:
        """Workloads of ``owner``'s jobs that run over quota on lent GPUs."""
        from ..runtime.objects import job_workload_id

        ids = s.scalars(
            select(Job.id).where(
                Job.instance == self.instance, Job.owner == owner, Job.over_quota == 1
            )
        )
        return {job_workload_id(self.instance, i) for i in ids}

    def release(self, workload: str) -> list[str]:
        with self.db.session() as s:
            rows = s.scalars(
                select(GpuAllocation.device).where(
                    GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                )
            ).all()
            s.execute(
                delete(GpuAllocation).where(
                    GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                )
            )
            return list(rows)

    def held_by(self, workload: str) -> list[str]:
        with self.db.read() as s:
            return sorted(
                s.scalars(
                    select(GpuAllocation.device).where(
                        GpuAllocation.instance == self.instance, GpuAllocation.workload == workload
                    )
                )
            )

    def allocations(self) -> list[dict]:
        with self.db.read() as s:
            rows = s.scalars(
                select(GpuAllocation).where(GpuAllocation.instance == self.instance)
            ).all()
            return [
                {
                    "device": r.device,
                    "share": r.share,
                    "workload": r.workload,
                    "kind": r.kind,
                    "owner": r.owner,
                    "since": r.since.isoformat().replace("+00:00", "Z"),
                }
                for r in rows
            ]

    def free_count(self) -> int:
        with self.db.read() as s:
            busy = set(
                s.scalars(
                    select(GpuAllocation.device).where(GpuAllocation.instance == self.instance)
                )
            )
        return sum(1 for d in self.devices if d.id not in busy)

    def reconcile(self, live_workloads: Iterable[str], kind: str, grace: float = 60.0) -> list[str]:
        """Release what ``kind`` workloads hold that have no container any more.

        Reservations younger than ``grace`` seconds are left alone: their container may not be
        created yet.
        """
        live = set(live_workloads)
        cutoff = utcnow() - timedelta(seconds=grace)
        with self.db.session() as s:
            stale = s.scalars(
                select(GpuAllocation).where(
                    GpuAllocation.instance == self.instance,
                    GpuAllocation.kind == kind,
                    GpuAllocation.since < cutoff,
                )
            ).all()
            gone = [a for a in stale if a.workload not in live]
            for a in gone:
                log.warning("releasing GPU %s held by vanished %s", a.device, a.workload)
                s.delete(a)
            return sorted({a.workload for a in gone})
