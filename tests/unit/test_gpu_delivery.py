"""No GPU outside the ledger: what every container gpulab starts is told about GPUs (exactly the
devices it booked, or ``void``), in every gpu_mode and on Swarm; and whether an engine, by the
runtimes ``docker info`` lists, can hand booked GPUs out in a gpu_mode (a table of data)."""

from __future__ import annotations

import pytest

from gpulab.runtime.base import HelperSpec, WorkloadSpec
from gpulab.runtime.gateway import gateway_config
from gpulab.runtime.objects import (
    gpu_delivery_refusal,
    helper_container_config,
    workload_container_config,
)
from gpulab.runtime.swarm_specs import helper_service_spec, service_spec


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
