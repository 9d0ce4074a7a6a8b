"""Distributed jobs' pure parts: gang placement, ranks from a record, the environment, the
one view of a gang for recovery, merged logs; and the ledger's all-or-nothing booking."""

from __future__ import annotations

import threading

import pytest

from gpulab.db import Database
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger, GpuQuotaExceeded, NoGpuAvailable
from gpulab.gpus.placement import choose_gang, gang_fits, regroup
from gpulab.jobs.gang import decode_devices, distributed_env, encode_devices, ranks
from gpulab.jobs.logs import merge_logs, strip_stamps
from gpulab.jobs.recovery import Container as C
from gpulab.jobs.recovery import combine
from gpulab.jobs.spec import JobSpec, JobSpecError
from gpulab.names import rank_name
from gpulab.resources import Limits


def test_pack_fills_the_fullest_nodes_first_and_never_half_places():
    free = {"a": ["a/0", "a/1"], "b": ["b/0", "b/1", "b/2", "b/3"], "c": ["c/0"]}
    assert choose_gang(free, 2, 2) == [["a/0", "a/1"], ["b/0", "b/1"]]
    assert choose_gang(free, 2, 3) == [["a/0", "a/1"], ["b/0", "b/1"], ["b/2", "b/3"]]
    assert choose_gang(free, 2, 4) == []  # c's one GPU cannot hold a rank: nothing
    assert choose_gang(free, 3, 2) == []
    assert choose_gang({"": ["0", "1", "2"]}, 1, 3) == [["0"], ["1"], ["2"]]
    assert choose_gang({"": ["0", "1", "2"]}, 1, 4) == []


def test_spread_puts_each_rank_where_most_is_free():
    free = {"a": ["a/0", "a/1"], "b": ["b/0", "b/1", "b/2", "b/3"]}
    assert choose_gang(free, 1, 3, spread=True) == [["b/0"], ["b/1"], ["a/0"]]


def test_what_can_ever_fit():
    assert gang_fits({"a": 4, "b": 4}, 2, 4) and not gang_fits({"a": 4, "b": 4}, 3, 3)
    assert gang_fits({"": 4}, 0, 64)  # CPU workers need no GPU


def test_devices_round_trip_per_rank_and_regroup():
    per = [["a/0", "a/1"], ["b/0", "b/1"]]
    assert decode_devices(encode_devices(per), 2) == per
    assert decode_devices("0,1", 1) == [["0", "1"]]  # a one-container job's record, as before
    assert decode_devices("", 3) == [[], [], []]
    assert regroup(["b/1", "a/1", "b/0", "a/0"], 2, 2) == per
    assert regroup(["a/0"], 2, 2) == []


def test_ranks_of_a_record():
    gang = ranks("inst-job-j1", 2, "n1/0;n2/0", "n1,n2")
    assert [(r.rank, r.name, r.node, r.devices) for r in gang] == [
        (0, "inst-job-j1", "n1", ("n1/0",)),
        (1, "inst-job-j1-r1", "n2", ("n2/0",)),
    ]
    # released (ended): each rank's node stays in the record; a CPU gang's one node for all
    assert [r.node for r in ranks("x", 2, "", "n1,n2")] == ["n1", "n2"]
    assert [r.node for r in ranks("x", 2, "", "n1")] == ["n1", "n1"]
    assert rank_name("x", 0) == "x" and rank_name("x", 3) == "x-r3"


def test_environment_torch_expects():
    env = distributed_env(1, 4)
    assert env["MASTER_ADDR"] == "worker-0" and env["MASTER_PORT"] == "29500"
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"]) == (
        "4",
        "1",
        "0",
        "1",
    )
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == (
        "4",
        "1",
        "worker-0",
    )


@pytest.mark.parametrize(
    ("found", "seen"),
    [
        ([C.RUNNING, C.RUNNING], C.RUNNING),
        ([C.RUNNING, C.ENDED], C.RUNNING),
        ([C.ENDED, C.ENDED], C.ENDED),
        ([C.RUNNING, C.ABSENT], C.ABSENT),  # a start cut short: not whole
        ([C.RUNNING, C.STALE], C.STALE),  # a whole-gang restart cut short: finish it
        ([], C.ABSENT),
    ],
)
def test_one_view_of_a_gang_for_recovery(found, seen):
    assert combine(found) is seen


def test_merged_logs_in_time_order_with_their_rank():
    r0 = b"2026-11-23T10:00:00.5Z first\n2026-11-23T10:00:02Z third\n"
    r1 = b"2026-11-23T10:00:01.000000001Z second\n2026-11-23T10:00:02Z third too"
    assert merge_logs([r0, r1]) == (
        b"[rank 0] first\n[rank 1] second\n[rank 0] third\n[rank 1] third too\n"
    )
    assert strip_stamps(r0) == b"first\nthird\n"


def _spec(raw: dict) -> JobSpec:
    from ..support.jobspecs import parse

    return parse(raw, limits=Limits(cpus=8, memory=64 * 1024**3, gpus=8), host_gpus=8)


def test_workers_in_the_spec():
    spec = _spec({"command": ["true"], "workers": 3, "resources": {"gpus": 2}})
    assert spec.workers == 3 and spec.total_gpus == 6
    assert JobSpec.from_json(spec.to_json()).workers == 3
    assert JobSpec.from_json({**spec.to_json(), "workers": None}).workers == 1  # older records
    for bad in (0, 65, "2", 1.5, True):
        with pytest.raises(JobSpecError) as e:
            _spec({"command": ["true"], "workers": bad})
        assert e.value.field == "workers"
    with pytest.raises(JobSpecError) as e:
        _spec({"command": ["true"], "workers": 2, "env": {"WORLD_SIZE": "9"}})
    assert e.value.field == "env.WORLD_SIZE"
    # one worker: the names are the user's own, as before
    assert _spec({"command": ["true"], "env": {"RANK": "x"}}).env == {"RANK": "x"}


@pytest.fixture
def cluster(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'l.sqlite'}")
    devices = [GpuDevice(str(i), node=n) for n in ("a", "b") for i in range(2)]
    return GpuLedger(db, "t", devices, "pack", ["a", "b"])


def test_ledger_books_a_gang_across_nodes_all_or_nothing(cluster):
    assert cluster.reserve_gang("w1", "u", "job", 2, 2) == [["a/0", "a/1"], ["b/0", "b/1"]]
    assert cluster.reserve_gang("w1", "u", "job", 2, 2) == [["a/0", "a/1"], ["b/0", "b/1"]]
    cluster.release("w1")
    cluster.reserve("nb", "v", "notebook", 1)
    with pytest.raises(NoGpuAvailable):
        cluster.reserve_gang("w2", "u", "job", 2, 2)  # only one node has 2 free
    assert cluster.held_by("w2") == []  # nothing half-booked
    assert cluster.reserve_gang("w3", "u", "job", 1, 3) != []
    assert cluster.gang_refusal(2, 3) and not cluster.gang_refusal(2, 2)
    assert "at most 2 such workers" in cluster.gang_refusal(2, 3)


def test_ledger_gang_counts_every_rank_against_the_quota(cluster):
    with pytest.raises(GpuQuotaExceeded):
        cluster.reserve_gang("w1", "u", "job", 1, 3, quota=2)
    assert cluster.held_by("w1") == []


def test_concurrent_gangs_never_share_a_device(cluster):
    got: dict[str, list] = {}

    def take(name: str) -> None:
        try:
            got[name] = cluster.reserve_gang(name, name, "job", 1, 2)
        except NoGpuAvailable:
            got[name] = []

    threads = [threading.Thread(target=take, args=(f"g{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    booked = [d for ranks_ in got.values() for ds in ranks_ for d in ds]
    assert len(booked) == len(set(booked)) == 4
    assert sorted(len(r) for r in got.values()) == [0, 0, 2, 2]
