"""Fractional GPUs: the pure rules (gpulab.gpus.sharing) and the ledger's shares on a real
SQLite file, under concurrent fractional and whole reservations from several threads."""

from __future__ import annotations

import concurrent.futures
import random

import pytest
from sqlalchemy import select

from gpulab.db import Database, GpuAllocation
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger, GpuQuotaExceeded, NoGpuAvailable, NoGpuShareAvailable
from gpulab.gpus.sharing import (
    check_sharing,
    fraction_refusal,
    mps_environment,
    offered_fractions,
    pick_shared,
    share_container,
    slots_for,
)
from gpulab.resources import Flavor
from gpulab.settings import ConfigError, GpulabSettings

from ..support.ledger import check_ledger_invariants

# --- the pure rules -----------------------------------------------------------------------


def test_slots_for_a_fraction():
    assert slots_for(0.5, 4) == 2
    assert slots_for(0.25, 4) == 1
    assert slots_for(0.75, 4) == 3
    assert slots_for(0.5, 2) == 1
    assert slots_for(0.25, 2) is None  # half a slot
    assert slots_for(0.3, 4) is None
    assert slots_for(1.0, 4) is None  # a whole device is not a share
    assert slots_for(1 / 3, 3) == 1  # float noise is tolerated


def test_offered_fractions_and_refusals():
    assert offered_fractions([4, 2]) == [0.25, 0.5, 0.75]
    assert offered_fractions([]) == []
    assert fraction_refusal(1, [4]) is None
    assert fraction_refusal(0.5, [4]) is None
    assert "choose one of: 0.25, 0.5, 0.75" in fraction_refusal(0.3, [4])
    assert "shares no GPU" in fraction_refusal(0.5, [])
    assert "more than one GPU is a whole number" in fraction_refusal(1.5, [4])


def test_check_sharing_refuses_bad_slot_counts():
    assert check_sharing({"0": 4, "node-a/1": 2}) == {"0": 4, "node-a/1": 2}
    for bad in (1, 17, 2.5, True, "4"):
        with pytest.raises(ValueError, match=r"gpu_sharing\['0'\] must be a whole number"):
            check_sharing({"0": bad})


def test_pick_shared_packs_or_spreads():
    counts = {"0": 4, "1": 4}
    free = {"0": 2, "1": 4}
    assert pick_shared(free, counts, 0.5) == ("0", 2)  # pack: the fuller one that fits
    assert pick_shared(free, counts, 0.5, spread=True) == ("1", 2)
    assert pick_shared(free, counts, 0.75) == ("1", 3)  # only 1 has 3 slots free
    assert pick_shared({"0": 0, "1": 1}, counts, 0.5) is None


def test_mps_environment_and_share_container():
    env = mps_environment(0.25, "81920M", "/tmp/nvidia-mps")
    assert env == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    }
    assert mps_environment(0.5, "80G", "/p")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    # memory unknown: no memory limit rather than a wrong one
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in mps_environment(0.5, "", "/p")
    env, binds = share_container(0.5, "16G", "time-slicing", "/tmp/nvidia-mps")
    assert env == {"GPULAB_GPU_FRACTION": "0.5"} and binds == {}
    env, binds = share_container(0.5, "16G", "mps", "/tmp/nvidia-mps")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert binds == {"/tmp/nvidia-mps": {"bind": "/tmp/nvidia-mps", "mode": "rw"}}


def test_settings_refuse_a_flavor_no_shared_gpu_gives():
    flavor = {"id": "gpu-half", "cpus": 1, "memory": "2G", "gpus": 0.5}
    ok = GpulabSettings(flavors=[flavor], gpu_sharing={"0": 2})
    assert ok.flavor_map["gpu-half"].resources.gpus == 0.5
    with pytest.raises(ConfigError, match="flavor 'gpu-half'.*shares no GPU"):
        GpulabSettings(flavors=[flavor], gpu_sharing={})
    with pytest.raises(ConfigError, match="gpu_sharing"):
        GpulabSettings(gpu_sharing={"0": 1})
    with pytest.raises(ValueError, match="whole number or a fraction below 1"):
        Flavor.from_config({**flavor, "gpus": 1.5})


# --- the ledger -----------------------------------------------------------------------------

DEVICES = [GpuDevice(str(i), memory="16384M") for i in range(4)]


@pytest.fixture
def db_path(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def make_ledger(url: str, sharing=None) -> GpuLedger:
    return GpuLedger(Database(url), "test", DEVICES, sharing=sharing or {"0": 4, "1": 2})


def test_shares_fill_a_device_and_never_exceed_its_slots(db_path):
    ledger = make_ledger(db_path)
    # whole GPUs go to the devices that are not shared first
    assert ledger.reserve("whole-a", "u", "notebook", 1) == ["2"]
    assert ledger.reserve("half-a", "u", "notebook", 0.5) == ["0"]
    assert ledger.reserve("half-b", "v", "notebook", 0.5) == ["0"]  # pack: the fuller one
    assert ledger.reserve("half-b", "v", "notebook", 0.5) == ["0"]  # idempotent
    assert ledger.shared_free() == {"0": (0, 4), "1": (2, 2)}
    assert ledger.shares() == {"half-a": 0.5, "half-b": 0.5}
    # 0.25 is not a whole slot of the 2-slot device, and the 4-slot one is full
    with pytest.raises(NoGpuShareAvailable, match="GPU 0: 0 of 4 slots free; GPU 1: 2 of 2"):
        ledger.reserve("quarter", "w", "notebook", 0.25)
    assert ledger.reserve("half-c", "w", "notebook", 0.5) == ["1"]
    assert ledger.free_count() == 1  # device 3 only: a device with a share is not free
    assert ledger.release("half-a") == ["0"]
    assert ledger.reserve("quarter", "w", "notebook", 0.25) == ["0"]
    with Database(db_path).read() as s:
        rows = s.execute(
            select(GpuAllocation.device, GpuAllocation.share, GpuAllocation.workload)
        ).all()
    # one row per slot, numbered within the device
    assert sorted(rows) == [
        ("0", 1, "quarter"),
        ("0", 3, "half-b"),
        ("0", 4, "half-b"),
        ("1", 1, "half-c"),
        ("2", 0, "whole-a"),
    ]


def test_no_share_on_a_device_held_whole_and_no_whole_device_with_shares(db_path):
    ledger = make_ledger(db_path)
    ledger.reserve("whole-2", "u", "notebook", 1)
    ledger.reserve("whole-3", "u", "notebook", 1)
    ledger.reserve("half", "u", "notebook", 0.5)  # device 0
    # the only device without any row is 1: a whole request takes it
    assert ledger.reserve("whole-1", "u", "notebook", 1) == ["1"]
    # device 0 has a share: it is not handed out whole
    with pytest.raises(NoGpuAvailable, match="4 of 4 in use"):
        ledger.reserve("whole-x", "u", "notebook", 1)
    ledger.release("half")
    ledger.reserve("whole-0", "u", "notebook", 1)
    ledger.release("whole-1")
    # device 0 is held whole: no share of it, though it is shareable
    assert ledger.shared_free() == {"0": (0, 4), "1": (2, 2)}
    assert ledger.reserve("half-2", "u", "notebook", 0.5) == ["1"]


def test_shares_count_as_fractions_against_the_quota(db_path):
    ledger = make_ledger(db_path)
    ledger.reserve("a", "u", "notebook", 0.5, quota=1)
    ledger.reserve("b", "u", "notebook", 0.25, quota=1)
    with pytest.raises(GpuQuotaExceeded, match="0.5 GPU.*already hold 0.75 of your quota of 1"):
        ledger.reserve("c", "u", "notebook", 0.5, quota=1)
    ledger.reserve("c", "u", "notebook", 0.25, quota=1)
    with pytest.raises(GpuQuotaExceeded, match="already hold 1 of your quota of 1"):
        ledger.reserve("d", "u", "notebook", 1, quota=1)


def test_concurrent_fractional_and_whole_requests(db_path):
    sharing = {"0": 4, "1": 4}
    # two Database objects on the same file stand for two processes (hub and service)
    ledgers = [make_ledger(db_path, sharing), make_ledger(db_path, sharing)]
    asks = [1, 1, 1, 0.5, 0.5, 0.25, 0.25, 0.75, 0.5, 1, 0.25, 0.5] * 2
    random.Random(7).shuffle(asks)

    def take(i):
        try:
            return asks[i], ledgers[i % 2].reserve(f"w{i}", f"u{i}", "notebook", asks[i])
        except NoGpuAvailable as e:
            return asks[i], str(e)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(take, range(len(asks))))
    rows = check_ledger_invariants(ledgers[0].db, "test", sharing)
    granted = [(a, r) for a, r in results if isinstance(r, list)]
    # every device ended up used, and nothing beyond what the devices hold was granted
    assert sum(a for a, _ in granted) <= 4
    assert {d for d, _, _ in rows} == {"0", "1", "2", "3"}
    # what each workload was told is what the ledger holds for it
    for i, (a, r) in enumerate(results):
        if isinstance(r, list):
            assert ledgers[0].held_by(f"w{i}") == r
            if a < 1:
                assert len([1 for d, sh, w in rows if w == f"w{i}"]) == round(a * 4)
