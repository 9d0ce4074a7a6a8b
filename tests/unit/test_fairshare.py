"""Fair share over time (gpulab.fairshare) as data, the scheduler's use of it, and a simulation
of many users over many days on the real planner."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from gpulab.fairshare import SOLO, accounts, accrued, decayed, fair_share, standings
from gpulab.jobs.scheduler import ActiveJob, QueuedJob, plan, queue_order
from gpulab.resources import Quota

DAY = 86400.0
HOUR = 3600.0


def test_decay_halves_usage_every_half_life():
    assert decayed(100.0, DAY, DAY) == pytest.approx(50.0)
    assert decayed(100.0, 3 * DAY, DAY) == pytest.approx(12.5)
    assert decayed(100.0, DAY, 0) == 100.0  # no decay configured
    assert decayed(100.0, 0, DAY) == 100.0


def test_accrual_is_the_exact_integral_whatever_the_step():
    # 2 GPUs held for a day, in one step or in 1440 one-minute steps: the same number
    one = accrued(0.0, 2, DAY, DAY)
    many = 0.0
    for _ in range(1440):
        many = accrued(many, 2, 60, DAY)
    assert one == pytest.approx(many, rel=1e-9)
    # the integral of 2 * 2^(-t/H) over a day: 2H/ln2 * (1 - 1/2)
    assert one == pytest.approx(2 * DAY / math.log(2) * 0.5)
    # without decay, plain GPU-seconds
    assert accrued(10.0, 2, 30, 0) == 70.0
    # a short step is close to the GPU-seconds held
    assert accrued(0.0, 1, 60, DAY) == pytest.approx(60, rel=1e-3)


def test_factor_is_one_unused_a_half_at_its_share_and_less_beyond():
    s = standings({"ann": 0.0, "bob": 300.0, "cy": 100.0}, among=["dee"])
    assert s["ann"].factor == 1.0 and s["dee"].factor == 1.0
    # four subjects of equal weight: a share of 1/4 each; bob used 3/4 of everything
    assert s["bob"].share == pytest.approx(0.25)
    assert s["bob"].used == pytest.approx(0.75)
    assert s["bob"].factor == pytest.approx(2**-3)
    assert s["cy"].factor == pytest.approx(0.5)  # exactly its share
    # weights: bob entitled to 3 of 6 shares uses 3/4 of everything: above its share, less so
    w = standings({"ann": 0.0, "bob": 300.0, "cy": 100.0}, {"bob": 3.0}, among=["dee"])
    assert w["bob"].share == pytest.approx(0.5)
    assert w["bob"].factor == pytest.approx(2**-1.5)
    assert standings({}) == {}


def test_groups_sum_their_members_and_a_job_is_judged_by_its_heaviest_group():
    fs = fair_share(
        {"ann": 100.0, "bob": 300.0, "cy": 0.0},
        {"ann": ["ml"], "bob": ["ml", "vision"], "cy": []},
        waiting=[("dee", ["nlp"]), ("cy", [])],
    )
    assert fs.groups["ml"].usage == 400.0
    assert fs.groups["vision"].usage == 300.0
    assert fs.groups["nlp"].usage == 0.0
    assert fs.groups[SOLO + "cy"].usage == 0.0
    # bob is judged by ml (the heavier of his groups), not by vision
    assert fs.of("bob", ["ml", "vision"])[0] == fs.groups["ml"].factor
    # joining a fresh group gains nothing: the heaviest counts
    assert fs.of("bob", ["ml", "nlp"])[0] == fs.groups["ml"].factor
    assert fs.of("dee", ["nlp"]) == (1.0, 1.0)
    assert fs.of("nobody", []) == (1.0, 1.0)
    assert accounts("cy", []) == (SOLO + "cy",)
    assert accounts("ann", ["b", "a", "a"]) == ("a", "b")


def test_a_user_in_no_group_takes_their_own_weight_as_their_groups():
    fs = fair_share({"ann": 100.0, "bob": 100.0}, {}, user_weights={"ann": 3.0})
    assert fs.groups[SOLO + "ann"].share == pytest.approx(0.75)
    assert fs.of("ann", [])[0] > fs.of("bob", [])[0]


def q(job_id, owner, standing=(1.0, 1.0), priority=50, submitted=0.0, gpus=1, **kw):
    return QueuedJob(job_id, owner, frozenset(), gpus, priority, submitted, standing=standing, **kw)


def test_fair_share_orders_jobs_of_equal_priority_and_priority_still_wins():
    heavy = (0.2, 0.1)
    light = (0.9, 0.8)
    jobs = [
        q("h1", "hal", heavy, submitted=1),
        q("l1", "lia", light, submitted=5),
        q("h2", "hal", heavy, submitted=2, priority=80),
        q("h3", "hal", heavy, submitted=3),
    ]
    order = [j.id for j in sorted(jobs, key=queue_order)]
    assert order == ["h2", "l1", "h1", "h3"]  # priority, then share, then FIFO per owner
    p = plan(jobs, [], ["0", "1"], default_quota=Quota())
    assert [s.job_id for s in p.start] == ["h2", "l1"]


def test_the_group_factor_comes_before_the_users_own():
    # vic is a light user of a heavy group; lia a heavier user of a light group
    jobs = [q("v", "vic", (0.2, 0.9), submitted=1), q("l", "lia", (0.7, 0.4), submitted=2)]
    assert [j.id for j in sorted(jobs, key=queue_order)] == ["l", "v"]


def test_the_heaviest_users_borrowed_gpus_are_preempted_first():
    def a(job_id, owner, standing, started):
        return ActiveJob(
            job_id,
            owner,
            frozenset(),
            1,
            True,
            50,
            started,
            over_quota=True,
            standing=standing,
            devices=(job_id,),
        )

    active = [
        a("0", "lia", (0.9, 0.9), 10),  # light, started last: FIFO alone would pick it
        a("1", "hal", (0.1, 0.1), 1),
        a("2", "mo", (0.5, 0.5), 2),
    ]
    waiting = [q("w", "wen", submitted=20)]
    p = plan(waiting, active, [], default_quota=Quota(gpus=1))
    assert p.preempt == ["1"]
    p2 = plan([q("w", "wen", gpus=2)], active, [], default_quota=Quota(gpus=2))
    assert p2.preempt == ["1", "2"]


# --- a simulation: many users, many days, on the real planner --------------------------------


@dataclass
class Job:
    id: str
    owner: str
    submitted: float
    length: float
    started: float | None = None


@dataclass
class World:
    gpus: int
    half_life: float
    fair: bool
    usage: dict[str, float] = field(default_factory=dict)
    queued: list[Job] = field(default_factory=list)
    running: dict[str, tuple[Job, str]] = field(default_factory=dict)  # id -> job, device
    done: list[Job] = field(default_factory=list)
    busy_seconds: float = 0.0
    idle_while_waiting: float = 0.0


def simulate(fair: bool, days: int = 14, seed: int = 7) -> World:
    """Eight GPUs; one heavy user keeps 16 four-hour jobs queued at all times, a medium user
    submits a burst of eight two-hour jobs every day at 09:00, and six light users submit a
    one- to three-hour job at random moments, four a day each. Every 10 minutes, like the
    supervisor: accrue what ran, plan with the fair share (or without it), start, end."""
    rng = random.Random(seed)
    world = World(gpus=8, half_life=DAY, fair=fair)
    light = [f"light{i}" for i in range(6)]
    arrivals: list[Job] = []
    n = 0
    for day in range(days):
        for u in light:
            for _ in range(4):
                n += 1
                t = day * DAY + rng.uniform(0, DAY)
                arrivals.append(Job(f"j{n}", u, t, rng.choice([1, 2, 3]) * HOUR))
        for _ in range(8):
            n += 1
            arrivals.append(Job(f"j{n}", "medium", day * DAY + 9 * HOUR, 2 * HOUR))
    arrivals.sort(key=lambda j: j.submitted)
    step = 600.0
    now = 0.0
    while now < days * DAY:
        while arrivals and arrivals[0].submitted <= now:
            world.queued.append(arrivals.pop(0))
        while sum(j.owner == "heavy" for j in world.queued) < 16:
            n += 1
            world.queued.append(Job(f"j{n}", "heavy", now, 4 * HOUR))
        # end what finished
        for job_id, (job, _d) in list(world.running.items()):
            if job.started + job.length <= now:
                del world.running[job_id]
                world.done.append(job)
        fs = fair_share(world.usage, {}, waiting=[(j.owner, ()) for j in world.queued])
        free = [
            str(d)
            for d in range(world.gpus)
            if str(d) not in {d for _, d in world.running.values()}
        ]
        queued = [
            QueuedJob(
                j.id,
                j.owner,
                frozenset(),
                1,
                50,
                j.submitted,
                standing=fs.of(j.owner, ()) if fair else (1.0, 1.0),
            )
            for j in world.queued
        ]
        p = plan(queued, [], free, default_quota=Quota())
        by_id = {j.id: j for j in world.queued}
        for placement in p.start:
            job = by_id[placement.job_id]
            job.started = now
            world.queued.remove(job)
            world.running[job.id] = (job, placement.devices[0])
        if world.queued and len(world.running) < world.gpus:
            world.idle_while_waiting += step * (world.gpus - len(world.running))
        # accrue the step's usage
        held: dict[str, int] = {}
        for job, _d in world.running.values():
            held[job.owner] = held.get(job.owner, 0) + 1
        for u in set(world.usage) | set(held):
            world.usage[u] = accrued(world.usage.get(u, 0.0), held.get(u, 0), step, DAY)
        world.busy_seconds += step * len(world.running)
        now += step
    return world


def waits(world: World, who) -> list[float]:
    started = [j for j in world.done + [j for j, _ in world.running.values()] if who(j.owner)]
    return [(j.started - j.submitted) / HOUR for j in started]


def gpu_hours(world: World, who) -> float:
    return sum(j.length for j in world.done if who(j.owner)) / HOUR


def test_simulation_no_user_starves_and_heavy_users_yield_to_light_ones():
    fair = simulate(fair=True)
    fifo = simulate(fair=False)
    is_light = lambda u: u.startswith("light")  # noqa: E731
    is_heavy = lambda u: u == "heavy"  # noqa: E731
    is_medium = lambda u: u == "medium"  # noqa: E731
    # the planner keeps every GPU busy while anything waits, with fair share or without
    assert fair.idle_while_waiting == 0 and fifo.idle_while_waiting == 0
    # light users: with fair share a light job waits at most for one GPU to come free (the
    # longest job runs 4 h); first come, first served it waits behind the heavy backlog
    light_fair, light_fifo = waits(fair, is_light), waits(fifo, is_light)
    assert max(light_fair) <= 4.0
    assert statistics.median(light_fair) < 1.0
    assert statistics.median(light_fifo) > 5 * max(statistics.median(light_fair), 0.2)
    # the heavy user yields but never starves: they hold GPUs every day of the run, take
    # what the others leave, and each of their jobs starts in bounded time
    for day in range(14):
        started = [
            j for j in fair.done if is_heavy(j.owner) and day * DAY <= j.started < (day + 1) * DAY
        ]
        assert started, f"the heavy user started nothing on day {day}"
    assert gpu_hours(fair, is_heavy) > gpu_hours(fair, is_light) / 6  # more than any one light user
    assert max(waits(fair, is_heavy)) < 3 * 24
    # the medium user's daily burst also goes before the heavy backlog
    assert statistics.median(waits(fair, is_medium)) < statistics.median(waits(fifo, is_medium))
    # over the last week, each light user's usage is well below the heavy user's, and the
    # heavy user's fair-share factor is the lowest
    fs = fair_share(fair.usage, {})
    heavy_factor = fs.users["heavy"].factor
    assert all(heavy_factor < s.factor for u, s in fs.users.items() if u != "heavy")


def test_the_quota_counts_queued_jobs_but_not_those_running_beyond_it(tmp_path):
    """JobRecords.create with the quota's job count: QUEUED, INITIALIZING, PENDING and
    RUNNING count (the job concept); ended jobs and jobs running beyond the quota do not."""
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords, QuotaFull
    from gpulab.lifecycle import JobState as J

    jobs = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t")
    spec = {"priority": 50, "resources": {"gpus": 1}}
    a = jobs.create("ann", spec, None, (), quota_jobs=2)["id"]
    jobs.create("ann", spec, None, (), quota_jobs=2)
    with pytest.raises(QuotaFull, match="your quota allows 2 jobs queued or running at once"):
        jobs.create("ann", spec, None, (), quota_jobs=2)
    jobs.create("bob", spec, None, (), quota_jobs=2)  # per owner
    jobs.transition(a, J.INITIALIZING, expect=J.QUEUED, over_quota=1)  # borrowed GPUs
    jobs.create("ann", spec, None, (), quota_jobs=2)
    with pytest.raises(QuotaFull):
        jobs.create("ann", spec, None, (), quota_jobs=2)
    jobs.transition(a, J.FAILED, expect=J.INITIALIZING)
    with pytest.raises(QuotaFull):  # a was not counted anyway
        jobs.create("ann", spec, None, (), quota_jobs=2)
    assert jobs.create("ann", spec, None, (), quota_jobs=None)  # no quota on jobs


def test_the_kept_usage_after_many_looks_is_the_exact_decayed_integral(tmp_path):
    """RecentUsage.accrue, called at every look of the supervisor, keeps what one accrual
    over the whole time gives (the closed form): the stored value is decayed once, not once
    more at every look (it was, and heavy users looked half as heavy)."""
    from datetime import timedelta

    from gpulab.db import Database
    from gpulab.gpus.recent_usage import RecentUsage
    from gpulab.lifecycle import utcnow

    recent = RecentUsage(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t")
    start = utcnow()
    step, looks = 3600.0, 24 * 28  # every hour for 4 weeks
    for i in range(1, looks + 1):
        recent.accrue({"hal": 1.0}, step, start + timedelta(seconds=i * step), 7 * DAY)
    end = start + timedelta(seconds=looks * step)
    got = recent.read(end, 7 * DAY)[0]["hal"]
    exact = 7 * DAY / math.log(2) * (1 - 2 ** (-looks * step / (7 * DAY)))  # 1 GPU, 4 weeks
    assert got == pytest.approx(exact, rel=1e-6)
    assert got / HOUR == pytest.approx(227.2, abs=0.1)
    # a week without GPUs halves it, read or written
    later = end + timedelta(days=7)
    assert recent.read(later, 7 * DAY)[0]["hal"] == pytest.approx(exact / 2, rel=1e-6)
    recent.accrue({"hal": 1.0}, 60, later, 7 * DAY)  # one more minute held
    assert recent.read(later, 7 * DAY)[0]["hal"] == pytest.approx(exact / 2 + 60, rel=1e-3)


def test_users_whose_use_has_decayed_away_do_not_thin_the_shares():
    usage = {"ann": 3600.0, "bob": 3600.0, **{f"old{i}": 0.001 for i in range(1000)}}
    fs = fair_share(usage, {}, waiting=[("cy", [])])
    assert set(fs.users) == {"ann", "bob", "cy"}
    assert fs.users["ann"].share == pytest.approx(1 / 3)
    assert fs.users["ann"].factor == pytest.approx(2**-1.5)  # half of the use, a third share


def test_a_job_queued_again_counts_like_a_new_one(tmp_path):
    """Resuming goes through the same count as a submission (transition's ``counts``): queue
    two, interrupt them, submit two more, and the first two cannot be resumed past the quota."""
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords, QueueFull, QuotaFull
    from gpulab.lifecycle import JobState as J

    jobs = JobRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t")
    spec = {"priority": 50, "resources": {"gpus": 1}}
    first = [jobs.create("ann", spec, None, (), quota_jobs=2)["id"] for _ in range(2)]
    for job_id in first:
        jobs.transition(job_id, J.INTERRUPTED, expect=J.QUEUED)
    [jobs.create("ann", spec, None, (), quota_jobs=2) for _ in range(2)]
    resume = {"reason": "RESUMED", "expect": J.INTERRUPTED}
    with pytest.raises(QuotaFull):
        jobs.transition(first[0], J.QUEUED, counts=("ann", None, 2), **resume)
    with pytest.raises(QueueFull):
        jobs.transition(first[0], J.QUEUED, counts=("ann", 2, None), **resume)
    assert jobs.get(first[0])["state"] == "INTERRUPTED"  # refused: nothing changed
    assert jobs.transition(first[0], J.QUEUED, counts=("ann", 5, 3), **resume)["state"] == "QUEUED"


def test_the_shown_fair_share_is_reused_for_its_age_while_the_scheduler_reads_anew(
    tmp_path, monkeypatch
):
    """The fair share shown (GET usage, the admin's line) is computed at most every
    ``max_age`` seconds for the same waiting owners, even while the scheduler's pass reads
    the usage rows again and a held GPU accrues to them; the scheduler's own (max_age 0) is
    computed anew each time."""
    from datetime import timedelta

    from gpulab.db import Database
    from gpulab.gpus.recent_usage import RecentUsage
    from gpulab.jobs import queue
    from gpulab.lifecycle import utcnow
    from gpulab.settings import GpulabSettings

    s = GpulabSettings(gpu_devices=[{"id": "0"}], discover_gpus=False)
    recent = RecentUsage(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t")
    now = utcnow()
    recent.accrue({"ann": 1}, 60, now, s.fair_share_half_life)
    clock = [1000.0]
    monkeypatch.setattr(queue.time, "monotonic", lambda: clock[0])
    waiting = [("ann", ()), ("bob", ())]
    shown = queue.fair_share_now(s, recent, waiting, 5.0)
    recent.accrue({"ann": 1}, 60, now + timedelta(seconds=60), s.fair_share_half_life)
    recent.rows(0)  # the scheduler's pass: the rows read again
    clock[0] += 4
    assert queue.fair_share_now(s, recent, waiting, 5.0) is shown  # reused
    assert queue.fair_share_now(s, recent, waiting, 0.0) is not shown  # the scheduler's
    assert queue.fair_share_now(s, recent, waiting[:1], 5.0) is not shown  # others wait
    clock[0] += 6
    assert queue.fair_share_now(s, recent, waiting[:1], 5.0) is not shown  # too old now
