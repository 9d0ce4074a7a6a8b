"""Pure parts of the cluster backend: the service a workload becomes, what a task's state
means, and placement on one node by the ledger's policy (no engine needed)."""

from __future__ import annotations

import pytest

from gpulab.gpus.inventory import GpuDevice, device_id, from_nodes, node_of
from gpulab.gpus.ledger import GpuLedger, NoGpuAvailable
from gpulab.runtime.base import Mount, Node, WorkloadSpec
from gpulab.runtime.swarm_specs import helper_service_spec, service_spec, task_state
from tests.conftest import run_async
from tests.support.fake_runtime import FakeRuntime


def _spec(**kw) -> WorkloadSpec:
    base = dict(
        name="gpulab-job-abc",
        image="reg:5000/gpulab/python:3.11",
        command=["python", "-c", "print(1)"],
        env={"A": "1"},
        labels={"org.gpulab.instance": "t", "org.gpulab.kind": "job"},
        cpus=1.5,
        memory=2 * 1024**3,
        pids_limit=512,
        shm_size=1024**3,
        gpu_ids=["0", "1"],
        mounts=[Mount("vol-a", "/data", read_only=True), Mount("vol-b", "/out")],
        node="worker-2",
        stop_grace=7,
    )
    base.update(kw)
    return WorkloadSpec(**base)


def test_a_workload_becomes_one_pinned_task_that_swarm_never_restarts():
    body = service_spec(_spec(), {"ConfigID": "c1", "ConfigName": "gpulab-runner-x"}, "net-1")
    task = body["TaskTemplate"]
    c = task["ContainerSpec"]
    assert task["Placement"]["Constraints"] == ["node.hostname==worker-2"]
    assert task["RestartPolicy"]["Condition"] == "none"
    assert body["Mode"] == {"Replicated": {"Replicas": 1}}
    assert task["Networks"] == [{"Target": "net-1"}]
    assert task["Resources"]["Limits"] == {
        "NanoCPUs": 1_500_000_000,
        "MemoryBytes": 2 * 1024**3,
        "Pids": 512,
    }
    assert c["CapabilityDrop"] == ["ALL"] and c["User"] == "1000:100"
    assert c["Args"][:2] == ["/bin/sh", "/opt/gpulab/run.sh"]
    assert c["Configs"][0]["File"]["Name"] == "/opt/gpulab/run.sh"
    assert "NVIDIA_VISIBLE_DEVICES=0,1" in c["Env"] and "A=1" in c["Env"]
    assert c["StopGracePeriod"] == 7_000_000_000
    mounts = {m["Target"]: m for m in c["Mounts"]}
    assert mounts["/data"] == {
        "Type": "volume",
        "Source": "vol-a",
        "Target": "/data",
        "ReadOnly": True,
    }
    assert mounts["/dev/shm"]["TmpfsOptions"]["SizeBytes"] == 1024**3
    assert body["Labels"]["org.gpulab.node"] == "worker-2"
    # no host path anywhere: nothing comes from the hub's host
    assert all(m["Type"] in ("volume", "tmpfs") for m in c["Mounts"])


def test_no_gpu_means_none_not_all_and_no_runner_needs_no_config():
    body = service_spec(_spec(gpu_ids=[], runner=False), None, None)
    c = body["TaskTemplate"]["ContainerSpec"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in c["Env"]
    assert c["Args"] == ["python", "-c", "print(1)"] and "Configs" not in c
    with pytest.raises(ValueError):
        service_spec(_spec(), None, None)


def test_the_sync_helper_runs_next_to_its_volume_and_refuses_host_paths():
    config = {
        "image": "gpulab/sync:1",
        "command": ["pull"],
        "labels": {"org.gpulab.kind": "sync-helper"},
        "environment": {"AWS_ACCESS_KEY_ID": "k"},
        "user": "1000:100",
        "host_config": {"binds": {"vol-a": {"bind": "/data", "mode": "rw"}}},
    }
    body = helper_service_spec(config, "worker-1")
    task = body["TaskTemplate"]
    assert task["Placement"]["Constraints"] == ["node.hostname==worker-1"]
    assert task["ContainerSpec"]["Mounts"][0]["Source"] == "vol-a"
    assert task["RestartPolicy"]["Condition"] == "none"
    config["host_config"]["binds"]["/srv/store/b"] = {"bind": "/store/b", "mode": "ro"}
    with pytest.raises(ValueError, match="S3 store"):
        helper_service_spec(config, "worker-1")


def _node(state="ready", avail="active", host="worker-1"):
    return {
        "Description": {"Hostname": host},
        "Status": {"State": state},
        "Spec": {"Availability": avail},
    }


def _task(state, created="2027-01-15T08:00:00Z", code=None, desired="running"):
    status = {"State": state}
    if code is not None:
        status["ContainerStatus"] = {"ExitCode": code}
    return {"ID": created, "CreatedAt": created, "Status": status, "DesiredState": desired}


def test_task_states_read_as_running_ended_or_lost():
    node = _node()
    assert task_state([_task("preparing")], node).running  # pulling the image
    assert task_state([_task("running")], node).running
    done = task_state([_task("complete", code=0)], node)
    assert (done.running, done.exit_code) == (False, 0)
    failed = task_state([_task("failed", code=3)], node)
    assert (failed.running, failed.exit_code) == (False, 3)
    # the newest task decides (a forced update ran a new one)
    both = [_task("failed", "2027-01-15T08:00:00Z", 3), _task("running", "2027-01-15T08:01:00Z")]
    assert task_state(both, node).running
    # its node went down or was drained: lost, no exit code, the reason says which
    lost = task_state([_task("running")], _node(state="down"))
    assert (lost.running, lost.exit_code, lost.lost) == (False, None, True)
    assert "down" in lost.error
    # what a new manager leader or a missed heartbeat says of healthy nodes is not a loss
    assert task_state([_task("running")], _node(state="unknown")).running
    assert task_state([_task("running")], _node(state="disconnected")).running
    drained = task_state([_task("running")], _node(avail="drain"))
    assert drained.exit_code is None and "drain" in drained.error
    assert task_state([_task("running")], None).error == "not in the cluster"
    # an ended task on a node lost afterwards still ended with its code
    assert task_state([_task("complete", code=0)], _node(state="down")).exit_code == 0
    rejected = task_state([_task("rejected")], node)
    # the engine refused it on a healthy node: an error of the job, not a lost node
    assert not rejected.running and rejected.exit_code is None and not rejected.lost
    assert task_state([_task("running")], node).started_at == 1_800_000_000.0


class _DB:
    pass


def _ledger(devices, nodes, policy="pack"):
    return GpuLedger(_DB(), "t", devices, policy, nodes)


def test_placement_puts_a_workload_on_one_node_by_policy():
    devs = [GpuDevice("0", node="a"), GpuDevice("1", node="a")]
    devs += [GpuDevice(str(i), node="b") for i in range(4)]
    free = [d for d in devs if d.key != "b/0"]  # b has 3 free, a has 2
    pack = _ledger(devs, ["a", "b"], "pack")
    assert [d.key for d in pack.choose(free, 2)] == ["a/0", "a/1"]  # fullest that fits
    assert [d.key for d in pack.choose(free, 3)] == ["b/1", "b/2", "b/3"]
    spread = _ledger(devs, ["a", "b"], "spread")
    assert [d.key for d in spread.choose(free, 1)] == ["b/1"]  # the emptiest
    assert pack.choose(free, 4) == []  # 5 free in all, but no node has 4
    assert pack.biggest_node() == ("b", 4)
    home = pack.gpu_home()
    assert home[0] == 4 and "biggest (b)" in home[1]
    msg = str(NoGpuAvailable(5, 6, 0, pack.biggest_node()))
    assert "biggest node (b) has 4" in msg
    # one host: the first free ones, the message names the host
    single = GpuLedger(_DB(), "t", [GpuDevice("0"), GpuDevice("1")])
    assert [d.key for d in single.choose(single.devices, 2)] == ["0", "1"]
    assert single.gpu_home() == (2, "this host")


def test_nodes_that_are_down_or_drained_offer_nothing_new():
    nodes = [
        Node("1", "w1", ready=True, active=True, gpus=("0", "1")),
        Node("2", "w2", ready=False, active=True, gpus=("0", "1")),
        Node("3", "w3", ready=True, active=False, gpus=("0",)),
        Node("4", "mgr", ready=True, active=True, gpus=()),
    ]
    devices, usable = from_nodes(nodes)
    assert usable == ["mgr", "w1"]
    assert [d.key for d in devices] == ["w1/0", "w1/1"]
    assert node_of("w1/1") == "w1" and device_id("w1/1") == "1"
    assert node_of("GPU-abc") == "" and device_id("GPU-abc") == "GPU-abc"


def test_a_stopped_service_keeps_its_ended_task_and_ignores_its_unplaceable_one():
    node = _node()
    ended = _task("shutdown", "2027-01-15T08:00:00Z", 143, desired="shutdown")
    waiting = _task("pending", "2027-01-15T08:00:05Z")
    st = task_state([ended, waiting], node, stopped=True)
    assert (st.running, st.exit_code) == (False, 143)
    stopping = _task("running", "2027-01-15T08:00:00Z", desired="shutdown")
    assert task_state([stopping], node, stopped=True).running  # not there yet
    assert not task_state([waiting], node, stopped=True).running


def test_the_ledger_is_made_for_its_runtime():
    """One constructor for the spawner and the supervisor: one engine's devices come from
    make_runtime (configured here: model and memory kept), a cluster's from its nodes."""
    from gpulab.runtime import make_runtime
    from gpulab.settings import GpulabSettings

    configured = [{"id": "0", "model": "A100", "memory": "81920M"}, {"id": "1"}]
    settings = GpulabSettings(gpu_devices=configured, discover_gpus=False, placement="spread")
    host = make_runtime(settings)
    assert not host.clustered
    assert [n.gpus for n in run_async(host.nodes())] == [("0", "1")]
    single = GpuLedger.for_runtime(_DB(), settings, host)
    assert single.devices == [GpuDevice("0", "A100", "81920M"), GpuDevice("1")]
    assert not single.clustered and single.policy == "spread"
    assert single.gang_refusal(1, 2) is None and "this host" in single.gang_refusal(1, 3)
    assert run_async(single.refresh(host)) is False  # one host's devices are fixed
    assert single.devices == [GpuDevice("0", "A100", "81920M"), GpuDevice("1")]

    cluster = FakeRuntime(
        nodes=[Node("1", "w1", ready=True, active=True, gpus=("0", "1"))], clustered=True
    )
    swarm = GpuLedger.for_runtime(_DB(), settings, cluster)
    assert swarm.clustered and swarm.devices == [] and swarm.nodes == []
    assert run_async(swarm.refresh(cluster)) is True
    assert [d.key for d in swarm.devices] == ["w1/0", "w1/1"] and swarm.nodes == ["w1"]
    assert run_async(swarm.refresh(cluster)) is False  # nothing changed
    assert "the cluster's 1 node(s)" in swarm.gang_refusal(1, 3)
    cluster.node_list = []  # every node down or drained
    assert run_async(swarm.refresh(cluster)) is True and swarm.nodes == []


def test_make_runtime_hands_each_backend_all_it_needs():
    """A runtime is complete when made: one engine is handed its inventory (how its GPUs
    were found), a Swarm its nodes' engines; nothing is set afterwards."""
    from gpulab.runtime import make_runtime
    from gpulab.settings import GpulabSettings

    host = make_runtime(
        GpulabSettings(gpu_devices=[{"id": "0"}], discover_gpus=False, sync_image="r/sync:9")
    )
    assert host.inventory.source == "configured"
    assert host.devices == tuple(host.inventory.devices) == (GpuDevice("0"),)
    swarm = make_runtime(
        GpulabSettings(
            runtime="swarm",
            network_isolation="user",
            swarm_node_engine_plain=True,
            sync_image="r/sync:9",
        )
    )
    assert swarm.clustered and swarm.inventory is None
    assert swarm.node_engines.template == "tcp://{address}:2376"


def test_a_service_removed_between_its_two_reads_is_gone_not_an_error():
    """The state's read of a service, then of its tasks: a service its stop or its clean-up
    removed between the two is gone (None), as if the first read had not found it; the tasks'
    404 is no engine error (it came up through the hub's poll as a traceback)."""
    from docker.errors import NotFound

    from gpulab.runtime.swarm import SwarmRuntime

    class Client:
        def inspect_service(self, name):
            return {"ID": "s1", "Spec": {"Name": name, "Labels": {}}}

        def tasks(self, filters=None):
            raise NotFound("service s1 not found")

    class Engine:
        client = Client()

    swarm = SwarmRuntime.__new__(SwarmRuntime)
    swarm.engine = Engine()
    assert swarm._state_blocking("nb-x") is None
