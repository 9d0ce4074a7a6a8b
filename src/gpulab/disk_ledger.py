"""The disk ledger: bytes each Docker volume of a user's workloads holds on a node, checked
against the user's disk quota (:mod:`gpulab.disk_quota`) in the same transaction as the
booking, so that two workloads of one user starting at once cannot both take what is left.

On SQLite every writing transaction holds the database's write lock (BEGIN IMMEDIATE); on
PostgreSQL a booking takes a transaction-scoped advisory lock on (instance, owner) first
(:meth:`gpulab.db.Database.serialize`), as the GPU ledger does for its quota. A volume's row
is replaced by its next booking (a notebook started again pulls its volume again: the
volume's new size, not twice it) and removed with the volume.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy import delete, func, select

from .db import Database, DiskBooking
from .disk_quota import DiskCheck, check_booking
from .lifecycle import utcnow

log = logging.getLogger(__name__)


class DiskQuotaExceeded(RuntimeError):
    """A booking that does not fit its owner's quota; ``check`` says by how much."""

    def __init__(self, check: DiskCheck, quota: int, size: int | None):
        self.check, self.quota, self.size = check, quota, size
        super().__init__(f"needs {size} bytes, {check.left} of {quota} left")


class DiskLedger:
    def __init__(self, db: Database, instance: str):
        self.db = db
        self.instance = instance

    def book(
        self,
        owner: str,
        workload: str,
        volume: str,
        node: str,
        nbytes: int,
        quota: int | None,
        *,
        kind: str = "pull",
        up_to: bool = False,
        least: int = 1,
    ) -> DiskCheck:
        """Book ``nbytes`` for ``volume`` on ``node`` (replacing what it held), if the owner's
        other bookings leave room under ``quota``; ``up_to``: as much of ``nbytes`` as is left
        (at least ``least``). Raises DiskQuotaExceeded, booking nothing, when it does not
        fit; returns the check (``granted``: the bytes booked)."""
        with self.db.session() as s:
            self.db.serialize(s, "gpulab-disk", self.instance, owner)
            held = s.scalar(
                select(func.coalesce(func.sum(DiskBooking.bytes), 0)).where(
                    DiskBooking.instance == self.instance,
                    DiskBooking.owner == owner,
                    ~((DiskBooking.volume == volume) & (DiskBooking.node == node)),
                )
            )
            check = check_booking(nbytes, int(held or 0), quota, up_to=up_to, least=least)
            if not check.allowed:
                raise DiskQuotaExceeded(check, quota or 0, nbytes if not up_to else None)
            row = s.scalar(
                select(DiskBooking).where(
                    DiskBooking.instance == self.instance,
                    DiskBooking.volume == volume,
                    DiskBooking.node == node,
                )
            )
            if row is None:
                row = DiskBooking(instance=self.instance, volume=volume, node=node)
                s.add(row)
            row.owner, row.workload, row.kind = owner, workload, kind
            row.bytes, row.since = check.granted, utcnow()
            return check

    def settle(self, volume: str, node: str, nbytes: int) -> None:
        """A clone is done: its booking becomes what it really took (never more than it
        had booked: the clone was capped at that)."""
        with self.db.session() as s:
            row = s.scalar(
                select(DiskBooking).where(
                    DiskBooking.instance == self.instance,
                    DiskBooking.volume == volume,
                    DiskBooking.node == node,
                )
            )
            if row is not None:
                row.bytes = max(0, min(int(nbytes), row.bytes))

    def release(self, volume: str, node: str = "") -> None:
        """The volume is gone (or was never filled) on ``node``."""
        with self.db.session() as s:
            s.execute(
                delete(DiskBooking).where(
                    DiskBooking.instance == self.instance,
                    DiskBooking.volume == volume,
                    DiskBooking.node == node,
                )
            )

    def release_workload(self, workload: str) -> int:
        """Every volume of ``workload`` is gone: its bookings go; returns how many."""
        with self.db.session() as s:
            result = s.execute(
                delete(DiskBooking).where(
                    DiskBooking.instance == self.instance, DiskBooking.workload == workload
                )
            )
            return result.rowcount or 0

    def held(self, owner: str) -> int:
        with self.db.read() as s:
            total = s.scalar(
                select(func.coalesce(func.sum(DiskBooking.bytes), 0)).where(
                    DiskBooking.instance == self.instance, DiskBooking.owner == owner
                )
            )
            return int(total or 0)

    def bookings(self, owner: str | None = None) -> list[dict]:
        with self.db.read() as s:
            q = select(DiskBooking).where(DiskBooking.instance == self.instance)
            if owner is not None:
                q = q.where(DiskBooking.owner == owner)
            return [
                {
                    "owner": r.owner,
                    "workload": r.workload,
                    "volume": r.volume,
                    "node": r.node,
                    "kind": r.kind,
                    "bytes": r.bytes,
                    "since": r.since.isoformat().replace("+00:00", "Z"),
                }
                for r in s.scalars(q.order_by(DiskBooking.id))
            ]

    def workloads(self, prefix: str = "") -> set[str]:
        """The workloads (whose id starts with ``prefix``) that hold bookings."""
        with self.db.read() as s:
            ids = s.scalars(
                select(DiskBooking.workload).where(DiskBooking.instance == self.instance)
            )
            return {w for w in ids if w.startswith(prefix)}

    def release_all_but(self, keep: Iterable[str], prefix: str) -> list[str]:
        """Release the bookings of the workloads whose id starts with ``prefix`` and that are
        not in ``keep`` (their volumes are gone: a record deleted, a removal cut short)."""
        keep = set(keep)
        gone = sorted(self.workloads(prefix) - keep)
        for w in gone:
            log.warning("releasing the disk bookings of %s (its volumes are gone)", w)
            self.release_workload(w)
        return gone
