"""No GPU outside the ledger: what every container gpulab starts is told about GPUs (exactly the
devices it booked, or ``void``), in every gpu_mode and on Swarm; and whether an engine, by the
runtimes ``docker info`` lists, can hand booked GPUs out in a gpu_mode (a table of data); on a
Swarm, the same rule asked of each GPU node's engine, and a node that cannot deliver offering
no GPU to placement."""

from __future__ import annotations

import dataclasses

import pytest

from gpulab.db import Database
from gpulab.gpus.inventory import from_nodes
from gpulab.gpus.ledger import GpuLedger
from gpulab.runtime.base import EngineUnreachable, HelperSpec, Node, WorkloadSpec
from gpulab.runtime.gateway import gateway_config
from gpulab.runtime.objects import (
    gpu_delivery_refusal,
    helper_container_config,
    workload_container_config,
)
from gpulab.runtime.swarm import SwarmRuntime
from gpulab.runtime.swarm_nodes import (
    RECHECK_CLEARED,
    RECHECK_KEPT_OUT,
    GpuDeliveryChecks,
    node_gpu_refusal,
)
from gpulab.runtime.swarm_specs import helper_service_spec, service_spec

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime


def _visible(env) -> str | None:
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return env.get("NVIDIA_VISIBLE_DEVICES")


def _workload(gpu_ids=(), **kw) -> WorkloadSpec:
    # what a user may put in a workload's environment cannot widen its devices
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "A": "1"}
    return WorkloadSpec(name="w", image="cuda", command=["true"], env=env, gpu_ids=gpu_ids, **kw)


@pytest.mark.parametrize("mode", ["device_request", "env"])
def test_a_workload_is_told_exactly_its_booked_devices_in_every_mode(mode):
    cpu = workload_container_config(_workload(), mode, "/runner.sh")
    assert _visible(cpu["environment"]) == "void"
    assert "device_requests" not in cpu["host_config"]
    gpu = workload_container_config(_workload(["1", "MIG-abc"]), mode, "/runner.sh")
    assert _visible(gpu["environment"]) == "1,MIG-abc"
    assert gpu["environment"]["A"] == "1"
    requests = gpu["host_config"].get("device_requests")
    if mode == "device_request":
        assert requests == [
            {"Driver": "nvidia", "DeviceIDs": ["1", "MIG-abc"], "Capabilities": [["gpu"]]}
        ]
    else:
        assert requests is None


def test_on_swarm_too():
    cpu = service_spec(_workload(node="n1", runner=False), None, None)
    assert _visible(cpu["TaskTemplate"]["ContainerSpec"]["Env"]) == "void"
    gpu = service_spec(_workload(["2"], node="n1", runner=False), None, None)
    gpu = gpu["TaskTemplate"]["ContainerSpec"]
    assert _visible(gpu["Env"]) == "2"


def test_helpers_and_the_gateway_never_get_a_gpu():
    helper = helper_container_config(
        HelperSpec(image="sync", command=["x"], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    )
    assert _visible(helper["environment"]) == "void"
    task = helper_service_spec(helper, "n1")["TaskTemplate"]["ContainerSpec"]
    assert _visible(task["Env"]) == "void"
    assert _visible(gateway_config("t1", "proxy", 8002, 8003, "token")["environment"]) == "void"


RUNC = {"runc": {"path": "runc"}}
NVIDIA = {"runc": {"path": "runc"}, "nvidia": {"path": "nvidia-container-runtime"}}
#: a runtime registered under another name that is the NVIDIA one
RENAMED = {"runc": {"path": "runc"}, "gpu": {"path": "/usr/bin/nvidia-container-runtime"}}


@pytest.mark.parametrize(
    ("mode", "gpus", "runtimes", "default", "refused"),
    [
        # no GPU to hand out: nothing to refuse, whatever the engine
        ("env", 0, RUNC, "runc", None),
        ("device_request", 0, {}, "", None),
        # env: only the NVIDIA runtime as the default reads NVIDIA_VISIBLE_DEVICES
        ("env", 2, NVIDIA, "nvidia", None),
        ("env", 2, RENAMED, "gpu", None),
        ("env", 2, RUNC, "runc", "it has no NVIDIA runtime"),
        ("env", 2, NVIDIA, "runc", "it has the 'nvidia' runtime, but not as its default"),
        # device_request: the toolkit's nvidia runtime registered shows the toolkit is there
        ("device_request", 1, NVIDIA, "runc", None),
        ("device_request", 1, NVIDIA, "nvidia", None),
        ("device_request", 1, RENAMED, "runc", None),
        ("device_request", 1, RUNC, "runc", "lists no NVIDIA runtime (runtimes: runc)"),
    ],
)
def test_which_engine_can_deliver_booked_gpus(mode, gpus, runtimes, default, refused):
    got = gpu_delivery_refusal(mode, gpus, runtimes, default)
    if refused is None:
        assert got is None
    else:
        assert got is not None and refused in got


def test_a_refusal_says_what_to_configure():
    env = gpu_delivery_refusal("env", 1, RUNC, "runc")
    assert "the engine's default runtime is 'runc'" in env
    assert "nvidia-ctk runtime configure --runtime=docker --set-as-default" in env
    assert "or use gpu_mode 'device_request'" in env
    dr = gpu_delivery_refusal("device_request", 1, RUNC, "runc")
    assert "nvidia-container-runtime-hook" in dr and "nvidia-ctk runtime configure" in dr
    with pytest.raises(ValueError, match="unknown gpu mode"):
        gpu_delivery_refusal("cdi", 1, NVIDIA, "nvidia")


# --- on a Swarm: the same rule, asked of each GPU node's own engine ----------------------------


def test_a_swarm_nodes_refusal_names_the_node_and_its_way_out():
    ok = {"Runtimes": NVIDIA, "DefaultRuntime": "nvidia"}
    assert node_gpu_refusal("gpu-1", 4, ok) == ""
    assert node_gpu_refusal("gpu-1", 0, {"Runtimes": RUNC, "DefaultRuntime": "runc"}) == ""
    runc = node_gpu_refusal("gpu-1", 4, {"Runtimes": RUNC, "DefaultRuntime": "runc"})
    assert runc.startswith("node gpu-1 cannot hand out its GPUs: gpu_mode 'env' hands GPUs out")
    assert "the engine's default runtime is 'runc' (it has no NVIDIA runtime" in runc
    assert "nvidia-ctk runtime configure --runtime=docker --set-as-default" in runc
    # a Swarm service has no device requests: no other gpu_mode to point to
    assert "on that node: a Swarm service has no device requests" in runc
    assert "device_request" not in runc
    # exactly the one host's rule, whatever the gpu_mode setting (a Swarm task gets env)
    assert runc.endswith(gpu_delivery_refusal("env", 4, RUNC, "runc", swarm=True))
    beside = node_gpu_refusal("gpu-2", 1, {"Runtimes": NVIDIA, "DefaultRuntime": "runc"})
    assert "it has the 'nvidia' runtime, but not as its default" in beside
    silent = node_gpu_refusal(
        "gpu-3", 2, None, "tcp://user:pw@10.0.0.3:2376", "Docker engine ... is unreachable"
    )
    assert silent.startswith("node gpu-3: its engine at tcp://user@10.0.0.3:2376 did not say")
    assert "kept out of placement until it answers" in silent and "swarm_node_engine" in silent
    assert "pw" not in silent


class Engines:
    """What each node's engine answers ``docker info`` (an EngineError: it does not answer)."""

    def __init__(self, **infos):
        self.infos = infos
        self.asked: list[str] = []

    def __call__(self, url: str) -> dict:
        self.asked.append(url)
        found = self.infos[url]
        if isinstance(found, Exception):
            raise found
        return found


NVIDIA_INFO = {"Runtimes": NVIDIA, "DefaultRuntime": "nvidia"}
RUNC_INFO = {"Runtimes": RUNC, "DefaultRuntime": "runc"}


def test_each_node_is_asked_when_due_and_its_verdict_kept(caplog):
    now = [0.0]
    engines = Engines(
        a=NVIDIA_INFO,
        b=RUNC_INFO,
        c=EngineUnreachable("Docker engine at c is unreachable", url="c"),
    )
    checks = GpuDeliveryChecks(engines, clock=lambda: now[0])
    assert checks.due("A", 2) and not checks.due("X", 0)  # never asked; no GPU: never
    with caplog.at_level("INFO", logger="gpulab.runtime.swarm_nodes"):
        assert checks.check("A", "gpu-a", "a", 2) == ""
        assert "cannot hand out" in checks.check("B", "gpu-b", "b", 2)
        assert "did not say" in checks.check("C", "gpu-c", "c", 2)
        checks.check("B", "gpu-b", "b", 2)  # the same verdict: not logged again
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [lvl for lvl, _ in logged] == ["ERROR", "WARNING"], logged
    assert logged[0][1].startswith("GPUs kept out of placement: node gpu-b cannot hand out")
    assert logged[1][1].startswith("GPUs kept out of placement: node gpu-c: its engine at c")
    assert [checks.refusal(n, 2) != "" for n in "ABC"] == [False, True, True]
    assert checks.refusal("A", 0) == "" and checks.refusal("Z", 2) == ""

    # a node kept out is asked again after RECHECK_KEPT_OUT, one that could after RECHECK_CLEARED
    now[0] = RECHECK_KEPT_OUT
    assert [checks.due(n, 2) for n in "ABC"] == [False, True, True]
    assert checks.due("A", 3)  # its GPUs changed (a node label): asked at once
    now[0] = RECHECK_CLEARED
    assert checks.due("A", 2)

    # the node's engine fixed: cleared, said at INFO
    engines.infos["b"] = NVIDIA_INFO
    caplog.clear()
    with caplog.at_level("INFO", logger="gpulab.runtime.swarm_nodes"):
        assert checks.check("B", "gpu-b", "b", 2) == ""
    assert [r.getMessage() for r in caplog.records] == ["node gpu-b can hand out its GPUs now"]
    assert checks.refusal("B", 2) == ""


def test_an_unexpected_failure_of_the_ask_keeps_the_nodes_gpus_out_and_does_not_raise():
    def ask(url):
        raise OSError("TLS handshake failed")

    refusal = GpuDeliveryChecks(ask).check("N", "gpu-n", "tcp://n:2376", 1)
    assert "did not say which runtimes it has (TLS handshake failed)" in refusal


def test_a_node_whose_gpus_are_refused_offers_only_its_cpus():
    nodes = [
        Node("1", "w1", ready=True, active=True, gpus=("0", "1")),
        Node("2", "w2", ready=True, active=True, gpus=("0",), gpus_refused="node w2 cannot ..."),
    ]
    devices, usable = from_nodes(nodes)
    assert [d.key for d in devices] == ["w1/0", "w1/1"]
    assert usable == ["w1", "w2"]  # CPU work still goes there: void needs no NVIDIA runtime


def test_the_ledger_keeps_a_refused_nodes_gpus_out_until_it_can_deliver(tmp_path):
    runtime = FakeRuntime(
        nodes=[
            Node("1", "w1", ready=True, active=True, gpus=("0",)),
            Node("2", "w2", ready=True, active=True, gpus=("0", "1"), gpus_refused="no"),
        ]
    )
    ledger = GpuLedger(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "t", [], "pack", [])
    assert run_async(ledger.refresh(runtime))
    assert [d.key for d in ledger.devices] == ["w1/0"]
    assert ledger.biggest_node() == ("w1", 1)
    runtime.node_list[1] = dataclasses.replace(runtime.node_list[1], gpus_refused="")
    assert run_async(ledger.refresh(runtime))  # its engine was fixed: its GPUs come in
    assert [d.key for d in ledger.devices] == ["w1/0", "w2/0", "w2/1"]


class Manager:
    """A Swarm manager's low-level client, as SwarmRuntime.nodes() reads it."""

    base_url = "http://manager:2375"

    def __init__(self, nodes):
        self._nodes = nodes

    def info(self):
        return {"Swarm": {"NodeID": "M"}}

    def nodes(self):
        return self._nodes


def _swarm_node(node_id, hostname, addr, gpus="", state="ready", availability="active"):
    return {
        "ID": node_id,
        "Spec": {"Availability": availability, "Labels": {"org.gpulab.gpus": gpus}},
        "Status": {"State": state, "Addr": addr},
        "Description": {"Hostname": hostname},
    }


def test_a_swarm_asks_each_ready_gpu_node_and_marks_those_that_cannot_deliver():
    manager = Manager(
        [
            _swarm_node("M", "mgr", "10.0.0.1"),
            _swarm_node("A", "gpu-a", "10.0.0.2", "0,1"),
            _swarm_node("B", "gpu-b", "10.0.0.3", "0"),
            _swarm_node("C", "gpu-c", "10.0.0.4", "0", state="down"),
            _swarm_node("D", "cpu-d", "10.0.0.5"),
        ]
    )
    engines = Engines(**{"tcp://10.0.0.2:2376": NVIDIA_INFO, "tcp://10.0.0.3:2376": RUNC_INFO})
    runtime = SwarmRuntime(lambda: manager, node_engine_plain=True, check_gpus=True)
    runtime.gpu_checks = GpuDeliveryChecks(engines)
    assert run_async(runtime.gpu_delivery_refusal()) is None  # never the whole cluster
    # a node down, a node without GPUs, the manager's: not asked
    assert sorted(engines.asked) == ["tcp://10.0.0.2:2376", "tcp://10.0.0.3:2376"]
    nodes = {n.hostname: n for n in run_async(runtime.nodes())}
    assert len(engines.asked) == 2  # not due again yet
    assert nodes["gpu-a"].gpus_refused == "" and nodes["cpu-d"].gpus_refused == ""
    assert nodes["gpu-b"].gpus_refused.startswith("node gpu-b cannot hand out its GPUs")
    devices, _ = from_nodes(nodes.values())
    assert [d.key for d in devices] == ["gpu-a/0", "gpu-a/1"]

    # check_gpu_runtime off: nobody is asked, every labelled GPU counts
    off = SwarmRuntime(lambda: manager, node_engine_plain=True)
    assert off.gpu_checks is None
    assert all(n.gpus_refused == "" for n in run_async(off.nodes()))
