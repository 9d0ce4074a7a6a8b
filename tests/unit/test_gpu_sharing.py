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
    MPS_REMOVED,
    check_sharing,
    fraction_refusal,
    offered_fractions,
    pick_shared,
    share_environment,
    sharing_mode_refusal,
    slots_for,
)
from gpulab.notebooks.container import HubSide, notebook_spec
from gpulab.notebooks.life import policy_of
from gpulab.resources import Flavor, Resources
from gpulab.runtime.base import Mount
from gpulab.runtime.objects import workload_container_config
from gpulab.runtime.swarm_specs import service_spec
from gpulab.settings import ConfigError, GpulabSettings, load_config

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


def test_a_share_is_told_its_fraction_and_nothing_else():
    """Time-slicing is the one mode: a sharer learns its share (advice for its framework) and
    gets no MPS client variable and no host path, on one engine and on a Swarm."""
    assert share_environment(0.5) == {"GPULAB_GPU_FRACTION": "0.5"}
    assert share_environment(0.25) == {"GPULAB_GPU_FRACTION": "0.25"}
    s = GpulabSettings(gpu_sharing={"0": 4})
    hub = HubSide(
        # a previous start's share in the hub's environment does not leak into this one
        env={"JUPYTERHUB_API_TOKEN": "x", "GPULAB_GPU_FRACTION": "0.75"},
        command=[],
        args=[],
        base_url="/user/ann/nb/",
        port=8888,
        user="1000",
    )

    def spec(gpus: float, gpu_ids: list[str]):
        return notebook_spec(
            policy=policy_of(s),
            hub=hub,
            name="nb",
            image="img",
            user="ann",
            server="nb",
            workload_id="gpulab/notebook/ann/nb",
            resources=Resources(cpus=1, memory=2**30, gpus=gpus),
            gpu_ids=gpu_ids,
            mounts=[Mount("gpulab-nb-ann--nb-workspace", "/workspace")],
            network_id="",
            node="n1",
        )

    for gpus, ids, fraction in ((0.5, ["0"], "0.5"), (1, ["1"], None), (0, [], None)):
        w = spec(gpus, ids)
        assert w.env.get("GPULAB_GPU_FRACTION") == fraction, w.env
        assert not [k for k in w.env if k.startswith("CUDA_MPS_")], w.env
        host = workload_container_config(w, "device_request", "/r.sh")["host_config"]
        assert host["binds"] == ["gpulab-nb-ann--nb-workspace:/workspace:rw"], host[
            "binds"
        ]  # named volumes only: no path of the host
        swarm = service_spec(w, None, None)["TaskTemplate"]["ContainerSpec"]
        assert {m["Type"] for m in swarm["Mounts"]} == {"volume", "tmpfs"}, swarm["Mounts"]
        assert not [e for e in swarm["Env"] if e.startswith("CUDA_MPS_")], swarm["Env"]


def test_mps_is_refused_saying_it_was_removed_and_what_to_use(tmp_path):
    """A site configuration that still asks for MPS stops the hub and the service at start-up
    (a ConfigError, tests/integration/test_gpus.py shows the real start) instead of sharing
    without the limits it expects; 'time-slicing', written or not, is the one mode."""
    assert sharing_mode_refusal("time-slicing") is None
    assert sharing_mode_refusal("mps") == MPS_REMOVED
    for words in (
        "gpu_sharing_mode = 'mps' was removed",
        "a user can unset",
        "never started the MPS control daemon",
        "Remove the line",
        "without isolation (a sharer can use all of the device's memory and compute)",
        "for isolation use MIG devices",
    ):
        assert words in MPS_REMOVED
    assert "must be 'time-slicing' (the one mode), not 'exclusive'" in sharing_mode_refusal(
        "exclusive"
    )
    assert GpulabSettings().gpu_sharing_mode == "time-slicing"
    assert GpulabSettings(gpu_sharing_mode="time-slicing", gpu_sharing={"0": 2})
    with pytest.raises(ConfigError) as e:
        GpulabSettings(gpu_sharing_mode="mps")
    assert str(e.value) == MPS_REMOVED
    with pytest.raises(ConfigError, match="not 'MPS'"):
        GpulabSettings(gpu_sharing_mode="MPS")
    # as the hub and the service read it: the site's file
    site = tmp_path / "jupyterhub_config.py"
    site.write_text(
        'c.GpulabSettings.gpu_sharing = {"0": 4}\n'
        'c.GpulabSettings.gpu_sharing_mode = "mps"\n'
        'c.GpulabSettings.mps_pipe_directory = "/tmp/nvidia-mps"\n'
    )
    # the pipe directory went with it: traitlets says that nothing reads it
    with (
        pytest.raises(ConfigError, match="'mps' was removed"),
        pytest.warns(UserWarning, match="`mps_pipe_directory` not recognized"),
    ):
        GpulabSettings(config=load_config(str(site)))
    assert "mps_pipe_directory" not in GpulabSettings.class_trait_names(config=True)


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
