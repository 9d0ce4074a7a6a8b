"""Admission of a job submission (gpulab.jobs.actions.admission_refusal), as data: a parsed
spec and what it is checked against in, the refusal (its kind, field and message) out."""

from __future__ import annotations

import pytest

from gpulab.jobs.actions import (
    Conflict,
    Invalid,
    JobRefused,
    NotAllowed,
    NotFound,
    admission_refusal,
    highest_priority,
)
from gpulab.jobs.spec import MAX_PRIORITY, JobSpec
from gpulab.resources import Quota, Resources, parse_memory
from gpulab.settings import GpulabSettings


def spec(gpus=1, workers=1, priority=50, preemptible=False) -> JobSpec:
    return JobSpec(
        name=None,
        image="img",
        command=("true",),
        resources=Resources(1.0, parse_memory("1G"), gpus),
        workers=workers,
        priority=priority,
        preemptible=preemptible,
    )


def no_gang_refusal(per_worker: int, workers: int) -> str | None:
    return None


def two_nodes_of_two(per_worker: int, workers: int) -> str | None:
    """The ledger's answer on a cluster of two nodes with two GPUs each."""
    slots = 2 * (2 // per_worker)
    if workers <= 1 or workers <= slots:
        return None
    return (
        f"{workers} workers of {per_worker} GPU(s) each requested but the cluster's 2 node(s) "
        f"can hold at most {slots} such workers at once: ask for fewer workers or fewer GPUs each"
    )


def admit(job: JobSpec, **over) -> JobRefused | None:
    rules = {
        "quota": Quota(),
        "max_workers": 8,
        "max_priority": 100,
        "host_gpus": 4,
        "gpu_home": "this host",
        "gang_refusal": no_gang_refusal,
        **over,
    }
    return admission_refusal(job, **rules)


# (spec, what it is checked against, (kind, field, message) or None for admitted)
CASES = [
    pytest.param(spec(), {}, None, id="plain"),
    pytest.param(
        spec(priority=101),
        {},
        (
            NotAllowed,
            "priority",
            "priority 101 is above 100, the highest a user may ask for (higher ones need "
            "the custom:gpulab:admin scope)",
        ),
        id="priority-above-the-users-highest",
    ),
    pytest.param(spec(priority=1000), {"max_priority": None}, None, id="admin-any-priority"),
    pytest.param(
        spec(priority=101, workers=9),
        {},
        (NotAllowed, "priority", None),
        id="priority-checked-before-workers",
    ),
    pytest.param(
        spec(workers=9),
        {},
        (
            Invalid,
            "workers",
            "9 workers requested but one user's jobs may have at most 8 together",
        ),
        id="workers-over-the-cap",
    ),
    pytest.param(
        spec(gpus=5),
        {},
        (Invalid, "resources.gpus", "5 GPUs requested but this host has 4"),
        id="more-gpus-than-the-host",
    ),
    pytest.param(
        spec(gpus=3),
        {"host_gpus": 2, "gpu_home": "a workload runs on one node and the biggest (n1)"},
        (
            Invalid,
            "resources.gpus",
            "3 GPUs requested but a workload runs on one node and the biggest (n1) has 2",
        ),
        id="more-gpus-than-the-biggest-node",
    ),
    pytest.param(
        spec(gpus=3),
        {"quota": Quota(gpus=2)},
        (
            Invalid,
            "resources.gpus",
            "3 GPUs requested but your quota allows 2; submit it as preemptible to use idle "
            "GPUs beyond your quota",
        ),
        id="over-the-gpu-quota",
    ),
    pytest.param(
        spec(gpus=3, preemptible=True), {"quota": Quota(gpus=2)}, None, id="preemptible-beyond"
    ),
    pytest.param(
        spec(gpus=1),
        {"quota": Quota(jobs=0)},
        (
            Invalid,
            "resources.gpus",
            "your quota allows no running jobs; submit it as preemptible to use idle GPUs",
        ),
        id="no-running-jobs-allowed",
    ),
    pytest.param(
        spec(gpus=2, workers=2),
        {"host_gpus": 2, "gang_refusal": two_nodes_of_two},
        None,
        id="gang-over-nodes-larger-than-one-node",
    ),
    pytest.param(
        spec(gpus=2, workers=3),
        {"host_gpus": 2, "gang_refusal": two_nodes_of_two},
        (
            Invalid,
            "workers",
            "3 workers of 2 GPU(s) each requested but the cluster's 2 node(s) can hold at "
            "most 2 such workers at once: ask for fewer workers or fewer GPUs each",
        ),
        id="gang-shape-never-fits",
    ),
    pytest.param(
        spec(gpus=2, workers=2),
        {"quota": Quota(gpus=3)},
        (
            Invalid,
            "workers",
            "2 workers of 2 GPU(s) each: 4 GPUs requested but your quota allows 3; submit it "
            "as preemptible to use idle GPUs beyond your quota",
        ),
        id="gang-sum-over-the-quota",
    ),
    pytest.param(
        spec(gpus=2, workers=2, preemptible=True),
        {"quota": Quota(gpus=3)},
        None,
        id="preemptible-gang-beyond-the-quota",
    ),
]


@pytest.mark.parametrize(("job", "against", "expected"), CASES)
def test_admission(job, against, expected):
    refused = admit(job, **against)
    if expected is None:
        assert refused is None
        return
    kind, field, message = expected
    assert type(refused) is kind
    assert refused.field == field
    if message is not None:
        assert refused.message == message
        assert str(refused) == message


@pytest.mark.parametrize(
    ("kind", "status"), [(Invalid, 400), (NotAllowed, 403), (NotFound, 404), (Conflict, 409)]
)
def test_refusal_kinds_carry_their_http_status(kind, status):
    refused = kind("why", field="f")
    assert isinstance(refused, JobRefused)
    assert (refused.status, refused.message, refused.field) == (status, "why", "f")


def test_highest_priority_is_any_for_an_admin_and_the_configured_one_for_others():
    assert highest_priority(GpulabSettings(max_user_priority=3), admin=False) == 3
    assert highest_priority(GpulabSettings(max_user_priority=3), admin=True) == MAX_PRIORITY
    # never above what the spec allows
    assert highest_priority(GpulabSettings(max_user_priority=1000), admin=False) == MAX_PRIORITY
