"""The queue as its users see it: queued jobs and notebooks waiting for GPUs in one line, the
fair share's standings now (read from each user's recent usage:
:mod:`gpulab.gpus.recent_usage`, the rules: :mod:`gpulab.fairshare`), and each entry's place
in the order the scheduler considers them (:func:`.scheduler.queue_order`)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from ..fairshare import SOLO, FairShare, Standing, accounts, fair_share
from ..gpus.placement import Want
from ..gpus.recent_usage import SHOWN_MAX_AGE, RecentUsage
from ..gpus.waits import GpuWaits
from ..lifecycle import JobState, utcnow
from .scheduler import QueuedJob, queue_order

#: the most of a user's entries listed with their place (the total is always given)
MAX_PLACES = 100
#: the most entries the admin's view of the line lists (the total is always given)
MAX_LINE = 200
#: the prefix of a waiting notebook's id in the line (no job id has a colon)
NOTEBOOK = "notebook:"
#: the priority a waiting notebook is planned with (jobs' default)
NOTEBOOK_PRIORITY = 50


def fair_share_now(
    settings,
    recent: RecentUsage,
    waiting: Iterable[tuple[str, Iterable[str]]],
    max_age: float = 0.0,
) -> FairShare:
    """The fair share now: every user's recent usage, their groups, and the owners (with
    their groups) of the work that waits; ``max_age`` (only where it is shown, never to
    schedule by): the fair share this process computed that many seconds ago for the same
    waiting owners will do (with a thousand users it is a thousand standings to compute)."""
    waiting = [(u, tuple(sorted(gs))) for u, gs in waiting]
    if max_age > 0:
        # computed at most max_age seconds ago for the same waiting owners: not "from the
        # same usage rows", which the scheduler's pass reads again (and a held GPU accrues
        # to) every half second, so that on a busy platform nothing was ever reused
        key = tuple(sorted(set(waiting)))
        mine = _SHOWN.setdefault(recent.db, {})
        hit = mine.get(recent.instance)
        if hit is not None and hit[1] == key and time.monotonic() - hit[0] < max_age:
            return hit[2]
    usage, groups_of = recent.read(utcnow(), settings.fair_share_half_life, max_age)
    fs = fair_share(
        usage,
        groups_of,
        waiting,
        settings.fair_share_user_weights,
        settings.fair_share_group_weights,
    )
    if max_age > 0:
        mine[recent.instance] = (time.monotonic(), key, fs)
    return fs


#: the fair share last shown, per database and instance: (when, waiting owners, FairShare)
_SHOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ts(iso: str | None) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else 0.0


def want_of(spec: Mapping) -> Want:
    """The GPU model and node pool a stored job spec (or a notebook's queue row) asks for."""
    return Want(spec.get("gpu_model") or "", spec.get("node_pool") or "")


def waiting_notebooks(rows: Iterable[dict], fs: FairShare | None = None) -> list[QueuedJob]:
    """The waiting notebooks' rows (:meth:`GpuWaits.waiting`) as entries of the line."""
    return [
        QueuedJob(
            NOTEBOOK + w["workload"],
            w["owner"],
            frozenset(w["groups"]),
            w["gpus"],
            NOTEBOOK_PRIORITY,
            w["since"].timestamp(),
            standing=fs.of(w["owner"], w["groups"]) if fs else (1.0, 1.0),
            kind="notebook",
            want=want_of(w),
        )
        for w in rows
    ]


def queued_jobs(jobs: Iterable[dict], fs: FairShare | None = None) -> list[QueuedJob]:
    """The QUEUED ones of ``jobs`` (records' dicts) as entries of the line."""
    return [
        QueuedJob(
            j["id"],
            j["owner"],
            frozenset(j["groups"]),
            int(j["spec"]["resources"]["gpus"]) * int(j["spec"].get("workers") or 1),
            int(j["spec"].get("priority", 50)),
            _ts(j["submitted"]),
            standing=fs.of(j["owner"], j["groups"]) if fs else (1.0, 1.0),
            index=j.get("task_index") or 0,
            want=want_of(j["spec"]),
        )
        for j in jobs
        if j["state"] == JobState.QUEUED.value
    ]


def _line(settings, records) -> tuple[list[QueuedJob], FairShare, dict[str, dict]]:
    """Every waiting entry in order, the fair share they were ordered by, and the notebooks'
    rows by workload."""
    recent = RecentUsage(records.db, records.instance)
    jobs = [j for j in records.active_and_queued() if j["state"] == JobState.QUEUED.value]
    rows = GpuWaits(records.db, records.instance).waiting()
    fs = fair_share_now(
        settings,
        recent,
        [(j["owner"], j["groups"]) for j in jobs] + [(w["owner"], w["groups"]) for w in rows],
        SHOWN_MAX_AGE,  # shown, never scheduled by: rows a few seconds old will do
    )
    line = sorted(queued_jobs(jobs, fs) + waiting_notebooks(rows, fs), key=queue_order)
    return line, fs, {w["workload"]: w for w in rows}


def _standing(s: Standing | None) -> dict:
    return (s or Standing(0.0, 0.0, 0.0, 1.0)).to_json()


def _place(entry: QueuedJob, place: int) -> dict:
    if entry.kind == "notebook":
        server = entry.id.removeprefix(NOTEBOOK).split("/", 3)[-1]
        return {"notebook": server, "place": place}
    return {"id": entry.id, "place": place}


def share_of(settings, records, user: str) -> dict:
    """``user``'s place in the fair share, as the usage API and page show it: their recent
    GPU-hours (decayed), their part of everyone's and their entitled share, their factor,
    the same for the group that judges them (the most-used of theirs; none when they are in
    no group), and the place in line of each of their queued jobs and of their notebooks
    waiting for GPUs (no other user is named)."""
    line, fs, _rows = _line(settings, records)
    mine = [e for e in line if e.owner == user]
    if mine:
        groups = sorted(mine[-1].groups)
    else:
        groups = RecentUsage(records.db, records.instance).groups_of(user)
    judged_by = min(
        accounts(user, groups),
        key=lambda g: fs.groups[g].factor if g in fs.groups else 1.0,
    )
    places = [_place(e, i + 1) for i, e in enumerate(line) if e.owner == user]
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


def admin_line(settings, records) -> dict:
    """The line as the admin page shows it: every queued job and waiting notebook in the
    order the scheduler considers them (the first :data:`MAX_LINE`), with its owner, GPUs,
    priority, since when it waits, its owner's fair-share factor and, for a notebook, what
    its spawn was last told; ``total`` counts them all."""
    line, fs, rows = _line(settings, records)
    out = []
    for place, e in enumerate(line[:MAX_LINE], start=1):
        row = {
            "place": place,
            "kind": e.kind,
            "owner": e.owner,
            "gpus": e.gpus,
            "priority": e.priority,
            "since": datetime.fromtimestamp(e.submitted, UTC).isoformat().replace("+00:00", "Z"),
            "factor": round(e.standing[1], 4),
            "group_factor": round(e.standing[0], 4),
        }
        if e.kind == "notebook":
            w = rows[e.id.removeprefix(NOTEBOOK)]
            row["server"] = e.id.removeprefix(NOTEBOOK).split("/", 3)[-1]
            row["message"] = w["message"]
        else:
            row["id"] = e.id
        out.append(row)
    return {"rows": out, "total": len(line)}
