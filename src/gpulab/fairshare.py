"""Fair share over time: whose queued work goes first among jobs of equal priority, and whose
borrowed GPUs are taken back first (pure: numbers in, numbers out).

Usage. A user's usage is the GPU-seconds their workloads held (jobs and notebooks alike: what
the GPU ledger booked, a fraction of a shared GPU by its weight), each second decayed by its
age with a half-life ``H``: a GPU-hour used ``H`` ago counts half, ``2H`` ago a quarter. So one
number per user, kept up to date by adding what was held since the last look
(:func:`accrued`), tells recent use from old use without keeping a history (Slurm's
``PriorityDecayHalfLife``).

Groups. A user counts towards each of their groups (the groups the hub gives them); a group's
usage is the sum of its members'. A user in no group is a group of their own. A job is judged
by the most-used of its owner's groups, so joining a fresh group gains nothing.

Factor. Among the users (or groups) that used GPUs recently or wait for them now, each has a
share of the platform (``weights``, 1 each unless the admin says otherwise, normalised) and a
part of the recent usage (its usage over everyone's). Its fair-share factor is Slurm's
classic ``F = 2 ** (-used / share)``: 1 for no recent use, 0.5 for exactly its share, towards
0 the more it used beyond it.

Order (``jobs.scheduler``). Among queued jobs of equal priority, the group with the higher
factor goes first, then within it the user with the higher factor, then the oldest
submission; among over-quota jobs of equal priority, the heaviest group's and user's are
preempted first. A heavy user therefore yields to light ones without being starved by them:
while they wait their usage decays and the others' grows with every GPU-second they hold, so
their factor rises above the others' in bounded time (``tests/unit/test_fairshare.py``
simulates many users over many days, with one-GPU jobs; a wide request behind a stream of
narrow ones can wait longer: backfill, ``jobs.scheduler``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the key of a user's own group, when they are in none (never a hub group's name: "/" is
#: not allowed in those)
SOLO = "user/"
#: GPU-seconds below which a user who does not wait now is left out of the standings: their
#: use has decayed away, and counting everyone ever seen would spread the shares thin
FORGOTTEN = 1.0


def decayed(value: float, elapsed: float, half_life: float) -> float:
    """``value`` GPU-seconds after ``elapsed`` more seconds of decay (no decay when
    ``half_life`` is 0 or less)."""
    if half_life <= 0 or elapsed <= 0:
        return value
    return value * 2.0 ** (-elapsed / half_life)


def accrued(value: float, gpus: float, elapsed: float, half_life: float) -> float:
    """``value`` decayed over ``elapsed`` seconds during which ``gpus`` GPUs were held, plus
    those GPU-seconds, each decayed by its own age (the integral, exact for any step)."""
    if elapsed <= 0:
        return value
    if half_life <= 0:
        return value + gpus * elapsed
    held = gpus * half_life / math.log(2) * (1.0 - 2.0 ** (-elapsed / half_life))
    return decayed(value, elapsed, half_life) + held


def accounts(user: str, groups: Iterable[str]) -> tuple[str, ...]:
    """The groups a user's usage counts towards: their groups, or a group of their own."""
    gs = tuple(sorted(set(groups)))
    return gs or (SOLO + user,)


@dataclass(frozen=True)
class Standing:
    """One user's or group's place in the fair share."""

    #: decayed GPU-seconds now
    usage: float
    #: its part of everyone's recent usage (0 to 1)
    used: float
    #: its entitled part of the platform (0 to 1)
    share: float
    #: ``2 ** (-used / share)``: 1 unused, 0.5 at its share, less beyond it
    factor: float

    def to_json(self) -> dict:
        return {
            "gpu_hours": round(self.usage / 3600, 3),
            "used": round(self.used, 4),
            "share": round(self.share, 4),
            "factor": round(self.factor, 4),
        }


def standings(
    usage: Mapping[str, float],
    weights: Mapping[str, float] | None = None,
    among: Iterable[str] = (),
) -> dict[str, Standing]:
    """Each subject's standing, for the subjects in ``usage`` and ``among`` (those waiting now,
    with or without usage). ``weights``: a subject's share of the platform before
    normalising (1 when not given; 0 or less counts as a tiny share)."""
    weights = weights or {}
    subjects = sorted(set(usage) | set(among))
    if not subjects:
        return {}
    w = {s: max(float(weights.get(s, 1.0)), 1e-6) for s in subjects}
    total_w = sum(w.values())
    total_u = sum(max(0.0, usage.get(s, 0.0)) for s in subjects)
    out = {}
    for s in subjects:
        u = max(0.0, usage.get(s, 0.0))
        used = u / total_u if total_u > 0 else 0.0
        share = w[s] / total_w
        out[s] = Standing(u, used, share, 2.0 ** (-used / share))
    return out


@dataclass(frozen=True)
class FairShare:
    """The standings of users and groups at one moment: what the scheduler orders by."""

    users: Mapping[str, Standing]
    groups: Mapping[str, Standing]

    def of(self, user: str, groups: Iterable[str]) -> tuple[float, float]:
        """(group factor, user factor) of a job of ``user`` in ``groups``: the most-used of
        their groups, then the user; (1, 1) for anyone not seen."""
        gs = [self.groups[g].factor for g in accounts(user, groups) if g in self.groups]
        user_factor = self.users[user].factor if user in self.users else 1.0
        return (min(gs) if gs else 1.0, user_factor)


def fair_share(
    usage: Mapping[str, float],
    groups_of: Mapping[str, Iterable[str]],
    waiting: Iterable[tuple[str, Iterable[str]]] = (),
    user_weights: Mapping[str, float] | None = None,
    group_weights: Mapping[str, float] | None = None,
) -> FairShare:
    """The fair share from each user's decayed usage (``usage``), their groups
    (``groups_of``), and the owners of waiting work with their groups (``waiting``).
    ``group_weights`` names hub groups; a user's own group takes the user's weight."""
    waiting = [(u, tuple(gs)) for u, gs in waiting]
    waiters = {u for u, _ in waiting}
    usage = {u: v for u, v in usage.items() if v >= FORGOTTEN or u in waiters}
    members = {u: accounts(u, groups_of.get(u, ())) for u in usage}
    for u, gs in waiting:
        members.setdefault(u, accounts(u, gs))
    group_usage: dict[str, float] = {}
    for u, accs in members.items():
        for g in accs:
            group_usage[g] = group_usage.get(g, 0.0) + max(0.0, usage.get(u, 0.0))
    gw = dict(group_weights or {})
    for u, accs in members.items():
        if accs == (SOLO + u,) and user_weights and u in user_weights:
            gw[SOLO + u] = user_weights[u]
    return FairShare(
        users=standings(usage, user_weights, among=[u for u, _ in waiting]),
        groups=standings(group_usage, gw, among=[g for _u, gs in members.items() for g in gs]),
    )
