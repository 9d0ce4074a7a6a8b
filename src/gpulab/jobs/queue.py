"""The queue as its users see it: the fair share's standings now (read from each user's recent
usage: :mod:`gpulab.gpus.recent_usage`, the rules: :mod:`gpulab.fairshare`) and each queued
job's place in the order the scheduler considers them (:func:`.scheduler.queue_order`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..fairshare import SOLO, FairShare, Standing, accounts, fair_share
from ..gpus.recent_usage import RecentUsage
from ..lifecycle import JobState, utcnow
from .scheduler import QueuedJob, queue_order

#: the most of a user's queued jobs listed with their place (the total is always given)
MAX_PLACES = 100


def fair_share_now(
    settings, recent: RecentUsage, waiting: Iterable[tuple[str, Iterable[str]]]
) -> FairShare:
    """The fair share now: every user's recent usage, their groups, and the owners (with
    their groups) of the work that waits."""
    usage, groups_of = recent.read(utcnow(), settings.fair_share_half_life)
    return fair_share(
        usage,
        groups_of,
        waiting,
        settings.fair_share_user_weights,
        settings.fair_share_group_weights,
    )


def _ts(iso: str | None) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else 0.0


def in_line(jobs: Iterable[dict], fs: FairShare) -> list[QueuedJob]:
    """The QUEUED ones of ``jobs`` (records' dicts), in the order the scheduler considers
    them."""
    queued = [
        QueuedJob(
            j["id"],
            j["owner"],
            frozenset(j["groups"]),
            0,
            int(j["spec"].get("priority", 50)),
            _ts(j["submitted"]),
            standing=fs.of(j["owner"], j["groups"]),
        )
        for j in jobs
        if j["state"] == JobState.QUEUED.value
    ]
    return sorted(queued, key=queue_order)


def _standing(s: Standing | None) -> dict:
    return (s or Standing(0.0, 0.0, 0.0, 1.0)).to_json()


def share_of(settings, records, user: str) -> dict:
    """``user``'s place in the fair share, as the usage API and page show it: their recent
    GPU-hours (decayed), their part of everyone's and their entitled share, their factor,
    the same for the group that judges them (the most-used of theirs; none when they are in
    no group), and each of their queued jobs' place in line (no other user is named)."""
    recent = RecentUsage(records.db, records.instance)
    jobs = records.active_and_queued()
    queued = [j for j in jobs if j["state"] == JobState.QUEUED.value]
    fs = fair_share_now(settings, recent, [(j["owner"], j["groups"]) for j in queued])
    _usage, groups_of = recent.read(utcnow(), settings.fair_share_half_life)
    mine = [j for j in queued if j["owner"] == user]
    groups = mine[-1]["groups"] if mine else groups_of.get(user, [])
    judged_by = min(
        accounts(user, groups),
        key=lambda g: fs.groups[g].factor if g in fs.groups else 1.0,
    )
    line = in_line(queued, fs)
    places = [{"id": j.id, "place": i + 1} for i, j in enumerate(line) if j.owner == user]
    return {
        **_standing(fs.users.get(user)),
        "group": None
        if judged_by.startswith(SOLO)
        else {"name": judged_by, **_standing(fs.groups.get(judged_by))},
        "half_life_hours": round(settings.fair_share_half_life / 3600, 2),
        "queued": places[:MAX_PLACES],
        "queued_mine": len(places),
        "queued_total": len(line),
    }
