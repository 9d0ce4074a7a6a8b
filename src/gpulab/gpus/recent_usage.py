"""Each user's recent GPU use, kept for the fair share (the rules: :mod:`gpulab.fairshare`).

One row per user (``fair_share_usage``): their GPU-seconds decayed as of a moment, and the
groups they were last seen in. The job supervisor, at most every ``ACCRUE_EVERY`` seconds,
adds what the GPU ledger's holders held since its last look (:meth:`RecentUsage.accrue`:
jobs and notebooks alike, a shared GPU's slot by its weight), writing only the holders'
rows; a row nobody adds to decays when it is read. So the cost of a look is the number of
users holding GPUs, and of a read the number of users, never the number of jobs.

Time the service was down is not counted: the first look after a start only sets the clock.
"""

from __future__ import annotations

import json
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

    def read(self, now: datetime, half_life: float) -> tuple[dict[str, float], dict[str, list]]:
        """Every user's usage decayed to ``now`` (GPU-seconds), and their groups."""
        with self.db.read() as s:
            rows = s.execute(
                select(
                    FairShareUsage.user,
                    FairShareUsage.gpu_seconds,
                    FairShareUsage.as_of,
                    FairShareUsage.groups,
                ).where(FairShareUsage.instance == self.instance)
            ).all()
        usage = {
            user: decayed(value, (now - as_of).total_seconds(), half_life)
            for user, value, as_of, _g in rows
        }
        return usage, {user: _groups(g) for user, _v, _a, g in rows}
