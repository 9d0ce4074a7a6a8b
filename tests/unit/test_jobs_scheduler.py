"""Placement decisions for training jobs (pure): order, quotas, backfill, preemption."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpulab.jobs.scheduler import (
    ActiveJob,
    Placement,
    QueuedJob,
    can_ever_fit,
    plan,
)
from gpulab.resources import Quota, beyond_gpus, quota_for

GPUS = ("0", "1", "2", "3")


def q(id, gpus=1, prio=50, t=0.0, owner="ann", groups=(), preemptible=False):
    return QueuedJob(id, owner, frozenset(groups), gpus, prio, t, preemptible)


def a(id, gpus=1, prio=50, started=0.0, owner="bob", over=False, preemptible=None, groups=()):
    return ActiveJob(
        id,
        owner,
        frozenset(groups),
        gpus,
        over if preemptible is None else preemptible,
        prio,
        started,
        over,
    )


def started(p):
    return {s.job_id: s.devices for s in p.start}


def all_devices(p):
    return [d for s in p.start for d in s.devices]


# --- quotas ----------------------------------------------------------------------------------


def test_quota_for_user_wins_then_most_generous_group_then_default():
    default = Quota(gpus=1, jobs=2)
    per_user = {"ann": Quota(gpus=0, jobs=1)}
    per_group = {"ml": Quota(gpus=4, jobs=3), "vision": Quota(gpus=2, jobs=None)}
    # the user's own quota wins even when a group is more generous
    assert quota_for("ann", {"ml"}, default, per_user, per_group) == Quota(0, 1)
    # most generous group, field by field (None = unlimited)
    assert quota_for("bob", {"ml", "vision"}, default, per_user, per_group) == Quota(4, None)
    assert quota_for("bob", ["vision"], default, per_user, per_group) == Quota(2, None)
    # groups without a quota are ignored
    assert quota_for("bob", {"other"}, default, per_user, per_group) == default
    assert quota_for("bob", (), default, per_user, per_group) == default


def test_quota_unlimited_gpus_in_a_group_beats_numbers():
    per_group = {"a": Quota(gpus=8, jobs=1), "b": Quota(gpus=None, jobs=0)}
    assert quota_for("x", {"a", "b"}, Quota(1, 1), {}, per_group) == Quota(None, 1)


@pytest.mark.parametrize(
    ("asked", "most", "where", "option", "expected"),
    [
        (4, 4, "this host", "", None),
        (0, 0, "this host", "", None),
        (0.5, 1, "this host", "gpus", None),
        (5, 4, "this host", "", "5 GPUs requested but this host has 4"),
        (1, 0, "this host", "", "1 GPUs requested but this host has 0"),
        (3, 2, "node n1", "", "3 GPUs requested but node n1 has 2"),
        (9, 0, "this host", "gpus", "gpus=9 requested but this host has 0 GPU(s)"),
        (5.0, 2, "this host", "gpus", "gpus=5 requested but this host has 2 GPU(s)"),
    ],
)
def test_beyond_gpus_is_the_one_can_it_ever_fit_rule(asked, most, where, option, expected):
    """Job specs, admission, the ledger and the notebook form all ask this one rule."""
    assert beyond_gpus(asked, most, where, option=option) == expected


def test_can_ever_fit():
    assert can_ever_fit(2, 4, Quota(gpus=2)) is None
    assert can_ever_fit(0, 0, Quota(gpus=0)) is None
    assert can_ever_fit(5, 4, Quota()) == "5 GPUs requested but this host has 4"
    assert "this host has 4" in can_ever_fit(5, 4, Quota(), preemptible=True)
    reason = can_ever_fit(3, 4, Quota(gpus=2))
    assert "quota allows 2" in reason and "preemptible" in reason
    assert can_ever_fit(3, 4, Quota(gpus=2), preemptible=True) is None
    assert "no running jobs" in can_ever_fit(0, 4, Quota(jobs=0))
    assert can_ever_fit(1, 4, Quota(jobs=0), preemptible=True) is None


# --- order, FIFO, backfill ---------------------------------------------------------------------


def test_priority_then_fifo_order():
    queue = [
        q("late-low", prio=10, t=1),
        q("late-high", prio=90, t=5),
        q("early-mid", prio=50, t=2),
        q("earlier-mid", prio=50, t=1),
    ]
    p = plan(queue, [], GPUS)
    assert [s.job_id for s in p.start] == ["late-high", "earlier-mid", "early-mid", "late-low"]
    assert started(p) == {
        "late-high": ("0",),
        "earlier-mid": ("1",),
        "early-mid": ("2",),
        "late-low": ("3",),
    }
    assert p.preempt == []


def test_fifo_within_a_priority_when_only_one_fits():
    p = plan([q("second", t=2), q("first", t=1)], [], ["7"])
    assert started(p) == {"first": ("7",)}


def test_backfill_smaller_lower_job_starts_when_the_higher_does_not_fit():
    queue = [q("big", gpus=4, prio=90), q("small", gpus=2, prio=10)]
    p = plan(queue, [], ["0", "1", "2"])
    assert started(p) == {"small": ("0", "1")}


def test_devices_follow_the_given_order_and_are_never_handed_out_twice():
    queue = [q("a", gpus=2, t=1), q("b", gpus=1, t=2), q("c", gpus=2, t=3), q("d", gpus=1, t=4)]
    p = plan(queue, [], ["3", "1", "1", "2", "0"])  # duplicate entries count once
    assert started(p) == {"a": ("3", "1"), "b": ("2",), "d": ("0",)}
    assert len(all_devices(p)) == len(set(all_devices(p)))


def test_zero_gpu_jobs_start_without_devices_even_when_none_are_free():
    p = plan([q("cpu", gpus=0), q("gpu", gpus=1)], [], [])
    assert p.start == [Placement("cpu", ())]


def test_nothing_to_do():
    assert plan([], [a("r1")], GPUS).start == []
    assert plan([], [], []).preempt == []


# --- quotas in the plan ------------------------------------------------------------------------


def test_in_quota_active_gpus_count_against_the_owner():
    active = [a("r1", gpus=2, owner="ann")]
    queue = [q("j1", gpus=1), q("j2", gpus=1, t=1)]
    p = plan(queue, active, GPUS, default_quota=Quota(gpus=3))
    assert started(p) == {"j1": ("0",)}  # 2 + 1 = 3; j2 would make 4


def test_over_quota_active_jobs_do_not_count():
    active = [a("borrowed", gpus=2, owner="ann", over=True)]
    p = plan([q("j1", gpus=2)], active, GPUS, default_quota=Quota(gpus=2))
    assert started(p) == {"j1": ("0", "1")}
    assert p.start[0].over_quota is False


def test_quota_is_per_user():
    active = [a("r1", gpus=1, owner="ann")]
    queue = [q("ann2", owner="ann"), q("bob1", owner="bob", t=1)]
    p = plan(queue, active, GPUS, default_quota=Quota(gpus=1))
    assert started(p) == {"bob1": ("0",)}


def test_quota_through_groups_and_user_override():
    queue = [
        q("ml1", gpus=2, owner="carl", groups={"ml"}),
        q("ml2", gpus=1, owner="carl", groups={"ml"}, t=1),
        q("dee1", gpus=1, owner="dee", groups={"ml"}, t=2),
    ]
    p = plan(
        queue,
        [],
        GPUS,
        default_quota=Quota(gpus=0),
        user_quotas={"dee": Quota(gpus=0)},
        group_quotas={"ml": Quota(gpus=2)},
    )
    assert started(p) == {"ml1": ("0", "1")}


def test_jobs_quota_counts_zero_gpu_jobs():
    active = [a("cpu-running", gpus=0, owner="ann")]
    queue = [q("cpu2", gpus=0), q("gpu1", gpus=1, t=1)]
    p = plan(queue, active, GPUS, default_quota=Quota(jobs=2))
    assert started(p) == {"cpu2": ()}  # ann now has 2 jobs: gpu1 waits


def test_started_jobs_count_within_the_same_plan():
    queue = [q(f"j{i}", t=i) for i in range(4)]
    p = plan(queue, [], GPUS, default_quota=Quota(gpus=2))
    assert list(started(p)) == ["j0", "j1"]


def test_non_preemptible_job_never_runs_over_quota():
    p = plan([q("j", gpus=2)], [], GPUS, default_quota=Quota(gpus=1))
    assert p.start == [] and p.preempt == []


def test_preemptible_job_over_quota_starts_on_free_gpus_marked_over_quota():
    queue = [q("in", gpus=1, t=1, preemptible=True), q("out", gpus=2, t=2, preemptible=True)]
    p = plan(queue, [], GPUS, default_quota=Quota(gpus=2))
    assert p.start == [
        Placement("in", ("0",), over_quota=False),
        Placement("out", ("1", "2"), over_quota=True),
    ]


def test_preemptible_over_the_jobs_quota_also_borrows():
    p = plan([q("j", gpus=1, preemptible=True)], [], GPUS, default_quota=Quota(jobs=0))
    assert p.start == [Placement("j", ("0",), over_quota=True)]


def test_in_quota_work_goes_before_over_quota_work_whatever_the_priority():
    queue = [
        q("borrower", gpus=2, prio=100, owner="ann", preemptible=True),
        q("owner-work", gpus=2, prio=1, owner="bob"),
    ]
    quotas = {"ann": Quota(gpus=0), "bob": Quota(gpus=2)}
    p = plan(queue, [], ["0", "1"], user_quotas=quotas)
    assert p.start == [Placement("owner-work", ("0", "1"))]
    # with GPUs to spare both run
    p = plan(queue, [], GPUS, user_quotas=quotas)
    assert p.start == [
        Placement("owner-work", ("0", "1")),
        Placement("borrower", ("2", "3"), over_quota=True),
    ]


def test_over_quota_starts_keep_queue_order():
    queue = [
        q("low", gpus=1, prio=10, preemptible=True),
        q("high", gpus=1, prio=90, t=5, preemptible=True),
    ]
    p = plan(queue, [], ["0"], default_quota=Quota(gpus=0))
    assert p.start == [Placement("high", ("0",), over_quota=True)]


# --- preemption --------------------------------------------------------------------------------


def test_in_quota_job_preempts_over_quota_borrowers_and_starts_later():
    active = [a("borrowed", gpus=2, owner="ann", over=True)]
    queue = [q("mine", gpus=2, owner="bob")]
    p = plan(queue, active, [], default_quota=Quota(gpus=2))
    assert p.preempt == ["borrowed"]
    assert p.start == []
    # next plan, once the victim is gone and its GPUs free
    p = plan(queue, [], ["0", "1"], default_quota=Quota(gpus=2))
    assert started(p) == {"mine": ("0", "1")}


def test_victims_lowest_priority_first_then_most_recently_started():
    active = [
        a("hi-old", prio=80, started=1, over=True),
        a("lo-old", prio=10, started=1, over=True),
        a("lo-new", prio=10, started=9, over=True),
        a("mid", prio=50, started=5, over=True),
    ]
    p = plan([q("w", gpus=2)], active, [], default_quota=Quota(gpus=4))
    assert p.preempt == ["lo-new", "lo-old"]
    p = plan([q("w", gpus=3)], active, [], default_quota=Quota(gpus=4))
    assert p.preempt == ["lo-new", "lo-old", "mid"]


def test_only_the_missing_gpus_are_taken_back_and_free_ones_are_held():
    active = [a("v1", gpus=1, prio=1, over=True), a("v2", gpus=1, prio=2, over=True)]
    queue = [q("big", gpus=3, prio=90)]
    p = plan(queue, active, ["0", "1"], default_quota=Quota(gpus=4))
    assert p.preempt == ["v1"]
    assert p.start == []


def test_lower_job_may_not_take_gpus_held_for_a_higher_one():
    active = [a("v1", gpus=1, prio=1, over=True)]
    queue = [q("big", gpus=3, prio=90), q("small", gpus=1, prio=10, owner="cat")]
    p = plan(queue, active, ["0", "1"], default_quota=Quota(gpus=4))
    assert p.preempt == ["v1"]
    assert p.start == []  # "small" may not take the free GPUs "big" is waiting for


def test_lower_in_quota_job_reclaims_what_is_left_for_itself():
    active = [a("v1", gpus=1, prio=1, over=True), a("v2", gpus=1, prio=2, over=True)]
    queue = [q("big", gpus=3, prio=90), q("small", gpus=1, prio=10, owner="cat")]
    p = plan(queue, active, ["0", "1"], default_quota=Quota(gpus=4))
    assert p.preempt == ["v1", "v2"]
    assert p.start == []


def test_zero_gpu_job_still_starts_while_gpus_are_held():
    active = [a("v", gpus=2, over=True)]
    queue = [q("big", gpus=2, prio=90), q("cpu", gpus=0, prio=10, owner="cat")]
    p = plan(queue, active, [], default_quota=Quota(gpus=4))
    assert p.preempt == ["v"]
    assert p.start == [Placement("cpu", ())]


def test_no_preemption_when_borrowed_gpus_would_not_be_enough_and_backfill_goes_on():
    active = [a("v", gpus=1, over=True), a("in-quota", gpus=2, owner="cat")]
    queue = [q("big", gpus=4, prio=90), q("small", gpus=1, prio=10)]
    p = plan(queue, active, ["3"], default_quota=Quota(gpus=4))
    assert p.preempt == []
    assert started(p) == {"small": ("3",)}


def test_in_quota_jobs_and_non_preemptible_ones_are_never_victims():
    active = [
        a("in-quota-preemptible", gpus=2, over=False, preemptible=True),
        a("in-quota", gpus=2, over=False),
    ]
    p = plan([q("w", gpus=1, owner="ann")], active, [], default_quota=Quota(gpus=4))
    assert p.preempt == [] and p.start == []


def test_preemptible_in_quota_job_may_preempt_too():
    active = [a("v", gpus=1, over=True)]
    p = plan([q("w", preemptible=True)], active, [], default_quota=Quota(gpus=1))
    assert p.preempt == ["v"]


def test_over_quota_waiting_job_does_not_preempt():
    active = [a("v", gpus=1, over=True)]
    p = plan([q("w", preemptible=True)], active, [], default_quota=Quota(gpus=0))
    assert p.preempt == [] and p.start == []


def test_a_victim_is_chosen_once_for_two_waiting_jobs():
    active = [a("v1", gpus=1, prio=1, over=True), a("v2", gpus=1, prio=2, over=True)]
    queue = [q("w1", t=1, owner="x"), q("w2", t=2, owner="y"), q("w3", t=3, owner="z")]
    p = plan(queue, active, [], default_quota=Quota(gpus=1))
    assert p.preempt == ["v1", "v2"]  # w3 finds nothing left to reclaim
    assert p.start == []


def test_waiting_job_keeps_its_quota_share_in_the_plan():
    active = [a("v", gpus=2, over=True)]
    queue = [q("big", gpus=2, prio=90), q("cpu", gpus=0, prio=10)]
    p = plan(queue, active, [], default_quota=Quota(gpus=2, jobs=1))
    assert p.preempt == ["v"]
    assert p.start == []  # ann's one job slot is promised to "big"


def test_victims_holding_no_gpus_are_not_preempted():
    active = [a("cpu-borrower", gpus=0, over=True), a("v", gpus=1, over=True)]
    p = plan([q("w")], active, [], default_quota=Quota(gpus=1))
    assert p.preempt == ["v"]


def test_free_gpus_stay_held_while_victims_are_in_their_grace_period():
    queue = [q("big", gpus=3, prio=90), q("small", gpus=1, prio=10, owner="cat")]
    quota = Quota(gpus=4)
    p = plan(queue, [a("v", gpus=2, over=True)], ["0"], default_quota=quota)
    assert p.preempt == ["v"] and p.start == []
    # next plan: "v" is checkpointing (releasing), its GPUs are not free yet
    releasing = replace(a("v", gpus=2, over=True), releasing=True)
    p = plan(queue, [releasing], ["0"], default_quota=quota)
    assert p.preempt == [] and p.start == []  # "small" still may not take GPU 0
    # once it is gone
    p = plan(queue, [], ["0", "1", "2"], default_quota=quota)
    assert started(p) == {"big": ("0", "1", "2")}


def test_releasing_gpus_are_promised_once_then_new_victims_are_chosen():
    releasing = ActiveJob("r", "bob", frozenset(), 1, True, 1, 0.0, True, releasing=True)
    active = [releasing, a("v", gpus=1, over=True)]
    queue = [q("w1", t=1, owner="x"), q("w2", t=2, owner="y")]
    p = plan(queue, active, [], default_quota=Quota(gpus=1))
    assert p.preempt == ["v"]  # w1 waits for r's GPU, w2 needs a victim of its own
    assert p.start == []


def test_releasing_jobs_do_not_count_against_quota_nor_become_victims():
    releasing = ActiveJob("r", "ann", frozenset(), 2, True, 1, 0.0, False, releasing=True)
    p = plan([q("w", gpus=2)], [releasing], ["0", "1"], default_quota=Quota(gpus=2))
    assert started(p) == {"w": ("0", "1")}
    releasing = ActiveJob("r", "bob", frozenset(), 2, True, 1, 0.0, True, releasing=True)
    p = plan([q("w", gpus=4)], [releasing], [], default_quota=Quota(gpus=4))
    assert p.preempt == []


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_never_double_allocate_or_exceed_quota(seed):
    rng = random.Random(seed)
    devices = [str(i) for i in range(8)]
    free = rng.sample(devices, rng.randint(0, 8))
    owners = ["ann", "bob", "cat"]
    queue = [
        q(
            f"q{i}",
            gpus=rng.randint(0, 3),
            prio=rng.choice([10, 50, 90]),
            t=rng.random(),
            owner=rng.choice(owners),
            preemptible=rng.random() < 0.4,
        )
        for i in range(12)
    ]
    active = [
        a(f"a{i}", gpus=rng.randint(0, 2), owner=rng.choice(owners), over=rng.random() < 0.5)
        for i in range(5)
    ]
    quota = Quota(gpus=3, jobs=3)
    p = plan(queue, active, free, default_quota=quota)
    used = all_devices(p)
    assert len(used) == len(set(used)) and set(used) <= set(free)
    by_id = {j.id: j for j in queue}
    for s in p.start:
        assert len(s.devices) == by_id[s.job_id].gpus
        assert not s.over_quota or by_id[s.job_id].preemptible
    for owner in owners:
        in_quota = [
            by_id[s.job_id] for s in p.start if by_id[s.job_id].owner == owner and not s.over_quota
        ]
        if in_quota:  # what started in quota keeps the owner within quota
            held = [j for j in active if j.owner == owner and not j.over_quota]
            assert sum(j.gpus for j in held + in_quota) <= quota.gpus
            assert len(held) + len(in_quota) <= quota.jobs
    assert set(p.preempt) <= {j.id for j in active if j.over_quota and j.gpus}
    if p.preempt:  # a plan that takes GPUs back lends none
        assert not any(s.over_quota and s.devices for s in p.start)


# --- node shape (a cluster's nodes; distributed jobs' ranks) -------------------------------


def node(key: str) -> str:
    return key.rpartition("/")[0]


def test_a_gang_that_fits_in_count_but_not_in_shape_waits_and_holds_nothing():
    # four nodes with one GPU free each: 4 GPUs, but no node has 2 for a rank
    free = ["n1/0", "n2/0", "n3/0", "n4/0"]
    gang = replace(q("gang", gpus=4, t=0), workers=2)
    p = plan([gang, q("small", gpus=1, t=1)], [], free, node_of=node)
    # the gang does not start, and the job behind it takes a GPU (backfill), nothing preempted
    assert started(p) == {"small": ("n1/0",)} and p.preempt == []
    # one host counted by GPUs alone would have started it on four nodes' devices
    assert "gang" in started(plan([gang], [], free))


def test_a_single_worker_job_needs_its_gpus_on_one_node():
    free = ["n1/0", "n2/0", "n2/1"]
    p = plan([q("two", gpus=2), q("three", gpus=3, t=1)], [], free, node_of=node)
    assert started(p) == {"two": ("n2/0", "n2/1")}


def test_a_gang_is_placed_rank_by_rank_on_nodes_that_fit():
    free = ["n1/0", "n1/1", "n2/0", "n3/0", "n3/1"]
    gang = replace(q("gang", gpus=4), workers=2)
    # pack: the fullest nodes that fit; every rank's two GPUs on one node
    devices = started(plan([gang], [], free, node_of=node))["gang"]
    assert sorted({node(d) for d in devices}) == ["n1", "n3"] and len(devices) == 4
    # the devices set aside are gone for the next job in the same plan: it gets the one left
    p = plan([gang, q("next", gpus=1, t=1)], [], free, node_of=node)
    assert started(p)["next"] == ("n2/0",)
    assert len(set(all_devices(p))) == len(all_devices(p)) == 5


def test_spread_puts_ranks_on_the_emptiest_nodes():
    free = ["a/0", "a/1", "b/0", "b/1"]
    gang = replace(q("gang", gpus=2), workers=2)
    packed = started(plan([gang], [], free, node_of=node))["gang"]
    spread = started(plan([gang], [], free, node_of=node, spread=True))["gang"]
    assert {node(d) for d in packed} == {"a"}  # both ranks on one node, the other kept whole
    assert {node(d) for d in spread} == {"a", "b"}


def test_over_quota_gangs_need_their_shape_too():
    free = ["n1/0", "n2/0"]
    gang = replace(q("gang", gpus=2, preemptible=True), workers=1)
    p = plan([gang], [], free, default_quota=Quota(gpus=0), node_of=node)
    assert p.start == []
    p = plan([gang], [], ["n1/0", "n1/1"], default_quota=Quota(gpus=0), node_of=node)
    assert p.start == [Placement("gang", ("n1/0", "n1/1"), over_quota=True)]


def lent(id, devices, started=0.0):
    """An over-quota preemptible job of bob's holding ``devices``."""
    return replace(a(id, gpus=len(devices), over=True, started=started), devices=tuple(devices))


def test_no_preemption_for_a_gang_the_freed_gpus_would_not_shape():
    # A0 and B0 held by notebooks, A1 lent to bob's over-quota job: 3 free, the gang needs 4,
    # and even with A1 back no two nodes have two free: bob's job is left alone
    gang = replace(q("gang", gpus=4), workers=2)
    p = plan([gang], [lent("bobs", ["A/1"])], ["B/1", "C/0", "C/1"], node_of=node)
    assert p.preempt == [] and p.start == []
    # counted by GPUs alone it would have been preempted, for nothing
    assert plan([gang], [lent("bobs", ["A/1"])], ["B/1", "C/0", "C/1"]).preempt == ["bobs"]


def test_preemption_gives_a_gang_its_shape():
    gang = replace(q("gang", gpus=4), workers=2)
    # short in count: bob's two GPUs on B make the second rank's node
    p = plan([gang], [lent("bobs", ["B/0", "B/1"])], ["C/0", "C/1"], node_of=node)
    assert p.preempt == ["bobs"] and p.start == []
    # enough in count, not in shape: bob's A0 completes node A
    p = plan(
        [gang, q("small", gpus=1, t=1)],
        [lent("bobs", ["A/0"])],
        ["A/1", "B/1", "C/0", "C/1"],
        node_of=node,
    )
    assert p.preempt == ["bobs"]
    assert p.start == []  # the free GPUs are held for the gang, not given to the job behind it


@pytest.mark.parametrize("seed", range(30))
def test_random_cluster_plans_give_each_rank_one_node_and_never_double_allocate(seed):
    rng = random.Random(seed)
    devices = [f"n{i // 2}/{i % 2}" for i in range(8)]  # four nodes of two GPUs
    rng.shuffle(devices)
    free = devices[: rng.randint(0, 8)]
    held = [d for d in devices if d not in free]
    queue = []
    for i in range(10):
        workers = rng.choice([1, 1, 2, 3])
        each = rng.randint(0, 2)
        queue.append(
            replace(
                q(f"q{i}", gpus=each * workers, t=rng.random(), owner=rng.choice(["ann", "cat"])),
                workers=workers,
                preemptible=rng.random() < 0.4,
            )
        )
    active = []
    for i in range(3):  # bob's over-quota jobs on some of the held devices
        mine, held = held[: rng.randint(0, 2)], held[2:]
        active.append(lent(f"a{i}", mine, started=i))
    p = plan(queue, active, free, default_quota=Quota(gpus=4, jobs=3), node_of=node)
    used = all_devices(p)
    assert len(used) == len(set(used)) and set(used) <= set(free)
    by_id = {j.id: j for j in queue}
    for s in p.start:
        job = by_id[s.job_id]
        assert len(s.devices) == job.gpus
        if job.gpus:  # every node's share holds whole ranks
            each = job.gpus // job.workers
            per_node: dict[str, int] = {}
            for d in s.devices:
                per_node[node(d)] = per_node.get(node(d), 0) + 1
            assert all(n % each == 0 for n in per_node.values()), (job, s.devices)
    assert set(p.preempt) <= {j.id for j in active if j.gpus}


def test_a_waiting_notebook_is_planned_in_line_and_needs_gpu_quota_not_a_job():
    """A notebook waiting for GPUs (kind "notebook") takes its place in the same line as
    jobs; it needs its owner's GPU quota but is not one of their jobs, and in-quota it may
    have borrowed GPUs taken back (preemption) like an in-quota job."""
    nb = QueuedJob("notebook:t/notebook/ann/", "ann", frozenset(), 1, 50, 5.0, kind="notebook")
    job = QueuedJob("j1", "ann", frozenset(), 1, 50, 1.0)
    # ann's quota: 2 GPUs, 1 job: the job and the notebook both start (the notebook is no job)
    p = plan([nb, job], [], ["0", "1"], default_quota=Quota(gpus=2, jobs=1))
    assert [s.job_id for s in p.start] == ["j1", nb.id]
    # the job was submitted first: with one GPU free, it goes first
    p = plan([nb, job], [], ["0"], default_quota=Quota(gpus=2, jobs=1))
    assert [s.job_id for s in p.start] == ["j1"]
    # GPU quota: one GPU left to ann, held by her job: the notebook waits
    p = plan([nb], [], ["1"], default_quota=Quota(gpus=1), held_outside={"ann": 1})
    assert p.start == []
    # a borrowed GPU is taken back for an in-quota notebook
    borrower = ActiveJob(
        "b1", "bob", frozenset(), 1, True, 50, 0.0, over_quota=True, devices=("0",)
    )
    p = plan([nb], [borrower], [], default_quota=Quota(gpus=1))
    assert p.preempt == ["b1"] and p.start == []
