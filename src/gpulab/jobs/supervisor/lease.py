"""One supervisor per database: a lease row that its holder renews and others take over only
once it has expired.

Two gpulab services started by mistake on the same database (a second hub, a copy of the
service left running) would otherwise both schedule and supervise the same jobs: start one
twice, release GPUs the other still uses. With the lease, the second one waits in standby
(its API still answers: requests are written to the database, the holder acts on them) and
takes over when the holder has not renewed for ``ttl`` seconds (it died, or lost the
database).

The check-and-take is one transaction serialized on the lease's name (SQLite's write lock,
PostgreSQL's advisory lock), so two candidates can never both win.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select

from ...db import Database, Lease
from ...lifecycle import utcnow


def default_holder() -> str:
    """host:pid:random: unique per process, readable in an operator's query."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass
class LeaseState:
    held: bool
    holder: str
    term: int
    expires_in: float


class SupervisorLease:
    def __init__(self, db: Database, name: str, ttl: float, holder: str | None = None):
        if ttl <= 0:
            raise ValueError("a lease's ttl must be positive")
        self.db, self.name, self.ttl = db, name, ttl
        self.holder = holder or default_holder()
        self.term = 0  # the term this process holds, 0 when it holds none

    def acquire(self) -> LeaseState:
        """Take or renew the lease if it is free, expired or ours; say who holds it."""
        now = utcnow()
        with self.db.session() as s:
            self.db.serialize(s, "gpulab-lease", self.name)
            row = s.scalar(select(Lease).where(Lease.name == self.name))
            if row is None:
                row = Lease(name=self.name, holder=self.holder, expires=now, term=1)
                s.add(row)
            elif row.holder != self.holder and row.expires > now:
                self.term = 0
                return LeaseState(False, row.holder, row.term, (row.expires - now).total_seconds())
            elif row.holder != self.holder:
                row.holder, row.term = self.holder, row.term + 1  # taken over after expiry
            elif self.term and row.term != self.term:
                # ours by name, but someone held it in between: we lost it once already
                row.term += 1
            row.expires = now + timedelta(seconds=self.ttl)
            s.flush()
            self.term = row.term
            return LeaseState(True, self.holder, row.term, self.ttl)

    def release(self) -> None:
        """Give the lease up at a clean shutdown, so a successor need not wait for the ttl."""
        with self.db.session() as s:
            self.db.serialize(s, "gpulab-lease", self.name)
            row = s.scalar(select(Lease).where(Lease.name == self.name))
            if row is not None and row.holder == self.holder:
                row.expires = utcnow()
        self.term = 0

    def current(self) -> LeaseState | None:
        with self.db.session() as s:
            row = s.scalar(select(Lease).where(Lease.name == self.name))
            if row is None:
                return None
            left = (row.expires - utcnow()).total_seconds()
            return LeaseState(row.holder == self.holder and left > 0, row.holder, row.term, left)
