"""Each user's recent GPU use, kept for the fair share (the rules: :mod:`gpulab.fairshare`).

One row per user (``fair_share_usage``): their GPU-seconds decayed as of a moment, and the
groups they were last seen in. The job supervisor, at most every ``ACCRUE_EVERY`` seconds,
adds what the GPU ledger's holders held since its last look (:meth:`RecentUsage.accrue`:
jobs and notebooks alike, a shared GPU's slot by its weight), writing only the holders'
rows; a row nobody adds to decays when it is read. So the cost of a look is the number of
users holding GPUs, and of a read the number of users, never the number of jobs.

Time the service was down is not counted: the first look after a start only sets the clock.

The readers that only show the fair share (the usage API, the admin's line: not the
scheduler) may take the rows read in the last :data:`SHOWN_MAX_AGE` seconds by this process
(``read(..., max_age=...)``): with a thousand users a read is a thousand rows to parse, for
a figure that moves by a half-life of days; an accrual in this process drops them at once.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import select

from ..db import Database, FairShareUsage
from ..fairshare import accrued, decayed
from ..lifecycle import utcnow

#: seconds between two looks of the supervisor (its passes are more frequent)
ACCRUE_EVERY = 15.0
#: the most groups kept per user (a hub's groups are few; the cap bounds a row)
MAX_GROUPS = 64


#: seconds the rows read to show the fair share may be reused by this process
SHOWN_MAX_AGE = 5.0
#: the rows read last, per database and instance, with when (see :meth:`RecentUsage.rows`)
_READ: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _groups(text: str) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [g for g in value if isinstance(g, str)] if isinstance(value, list) else []


class RecentUsage:
    """The ``fair_share_usage`` rows of one gpulab instance."""

    def __init__(self, db: Database, instance: str) -> None:
        self.db = db
        self.instance = instance

    def rows(self, max_age: float) -> list[tuple[str, float, datetime, list[str]]]:
        """(user, gpu_seconds, as_of, groups) of every row: read now, or (``max_age`` > 0)
        as this process read them at most ``max_age`` seconds ago."""
        mine = _READ.setdefault(self.db, {})
        hit = mine.get(self.instance)
        if max_age > 0 and hit is not None and time.monotonic() - hit[0] < max_age:
            return hit[1]
        with self.db.read() as s:
            rows = [
                (user, value, as_of, _groups(g))
                for user, value, as_of, g in s.execute(
                    select(
                        FairShareUsage.user,
                        FairShareUsage.gpu_seconds,
                        FairShareUsage.as_of,
                        FairShareUsage.groups,
                    ).where(FairShareUsage.instance == self.instance)
                )
            ]
        mine[self.instance] = (time.monotonic(), rows)
        return rows

    def accrue(
        self,
        held: Mapping[str, float],
        elapsed: float,
        now: datetime,
        half_life: float,
        groups: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """Add to each user in ``held`` (user -> GPUs held) what they held over the last
        ``elapsed`` seconds, decayed to ``now``; ``groups``: what is known now of some
        users' groups (kept for the next reads)."""
        groups = groups or {}
        users = sorted(set(held) | set(groups))
        if not users:
            return
        _READ.get(self.db, {}).pop(self.instance, None)
        with self.db.session() as s:
            rows = {
                r.user: r
                for r in s.scalars(
                    select(FairShareUsage).where(
                        FairShareUsage.instance == self.instance, FairShareUsage.user.in_(users)
                    )
                )
            }
            for user in users:
                row = rows.get(user)
                if row is None:
                    row = FairShareUsage(
                        instance=self.instance, user=user, gpu_seconds=0.0, as_of=now, groups="[]"
                    )
                    s.add(row)
                gpus = held.get(user, 0.0)
                if gpus > 0:
                    # the stored value decays to the start of the step (``elapsed`` before
                    # ``now``); accrued() decays it over the step and adds what was held
                    since = (now - row.as_of).total_seconds() - elapsed
                    base = decayed(row.gpu_seconds, max(0.0, since), half_life)
                    row.gpu_seconds = accrued(base, gpus, elapsed, half_life)
                    row.as_of = now
                if user in groups:
                    row.groups = json.dumps(sorted(set(groups[user]))[:MAX_GROUPS])

    def note_groups(self, user: str, groups: Iterable[str]) -> None:
        """Keep ``user``'s groups as they are now (a notebook's start: jobs carry theirs)."""
        self.accrue({}, 0.0, utcnow(), 0.0, {user: groups})

    def groups_of(self, user: str) -> list:
        """``user``'s groups as last seen ([] if never): one row, not everyone's."""
        with self.db.read() as s:
            raw = s.scalar(
                select(FairShareUsage.groups).where(
                    FairShareUsage.instance == self.instance, FairShareUsage.user == user
                )
            )
        return _groups(raw) if raw is not None else []

    def read(
        self, now: datetime, half_life: float, max_age: float = 0.0
    ) -> tuple[dict[str, float], dict[str, list]]:
        """Every user's usage decayed to ``now`` (GPU-seconds), and their groups; ``max_age``
        (seconds): rows this process read that recently will do (only to show them)."""
        rows = self.rows(max_age)
        usage = {
            user: decayed(value, (now - as_of).total_seconds(), half_life)
            for user, value, as_of, _g in rows
        }
        return usage, {user: groups for user, _v, _a, groups in rows}
