"""GPU placement through the shared ledger, on a real hub and engine.

No GPU exists here: the 'env' mode (NVIDIA_VISIBLE_DEVICES, for hosts whose default runtime is
nvidia) lets containers really run, and the 'device_request' mode is checked by inspecting what
the engine was asked for.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from ..hubctl import SpawnFailed

pytestmark = [pytest.mark.docker, pytest.mark.hub]

FOUR_GPUS = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}, {"id": "2"}, {"id": "3"}]
c.GpulabSettings.max_resources = {"cpus": 1, "memory": "1G", "gpus": 4}
c.GpulabSettings.gpu_mode = "%s"
"""


def _visible_devices(container) -> str:
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    return env.get("NVIDIA_VISIBLE_DEVICES", "")


def test_eight_concurrent_spawns_on_four_gpus(hub_factory, docker_client):
    hub = hub_factory(FOUR_GPUS % "env")
    users = [f"u{i}" for i in range(8)]
    tokens = {u: hub.create_user(u) for u in users}
    options = {"cpus": 0.2, "memory": "512M", "gpus": 1}

    def spawn(user):
        r = hub.spawn(user, "gpu", options, token=tokens[user])
        try:
            hub.wait_ready(user, "gpu", timeout=180)
            return user, "ready", r.status_code
        except SpawnFailed:
            return user, "failed", r.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(spawn, users))
    ready = [u for u, outcome, _ in results if outcome == "ready"]
    failed = [u for u, outcome, _ in results if outcome == "failed"]
    assert len(ready) == 4 and len(failed) == 4, results
    assert all(code in (201, 202, 409) for _, _, code in results), results

    devices = []
    for u in ready:
        nb = hub.notebook(u, "gpu").json()
        container = docker_client.containers.get(nb["container"])
        assert container.labels["org.gpulab.gpus"] == _visible_devices(container)
        devices.append(_visible_devices(container))
    assert sorted(devices) == ["0", "1", "2", "3"]

    for u in failed:
        nb = hub.wait_state(u, "gpu", "FAILED")
        last = nb["history"][-1]
        assert last["reason"] == "NO_GPU_AVAILABLE"
        assert "4 of 4 in use, 0 free" in last["message"], last

    # a stop gives the GPU back, and a waiting user can have it
    hub.stop_server(ready[0], "gpu")
    hub.spawn(failed[0], "gpu", options, token=tokens[failed[0]])
    hub.wait_ready(failed[0], "gpu", timeout=120)
    nb = hub.notebook(failed[0], "gpu").json()
    assert _visible_devices(docker_client.containers.get(nb["container"])) == devices[0]


def test_device_request_mode_asks_for_explicit_devices(hub_factory, docker_client):
    hub = hub_factory(FOUR_GPUS % "device_request")
    token = hub.create_user("dora")
    hub.spawn("dora", "two", {"cpus": 0.5, "memory": "512M", "gpus": 2}, token=token)
    # no NVIDIA toolkit here: the engine refuses to start it, which is an ERROR of the platform
    with pytest.raises(SpawnFailed):
        hub.wait_ready("dora", "two", timeout=60)
    nb = hub.wait_state("dora", "two", "ERROR")
    assert "could not select device driver" in nb["history"][-1]["message"]
    # the failed container is kept (stopped) for inspection until the next start or delete
    container = docker_client.containers.get(nb["container"])
    assert container.attrs["HostConfig"]["DeviceRequests"] == [
        {
            "Driver": "nvidia",
            "Count": 0,
            "DeviceIDs": ["0", "1"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in str(container.attrs["Config"]["Env"])
    # and the ledger gave them back
    hub.spawn("dora", "two", {"cpus": 0.5, "memory": "512M", "gpus": 4}, token=token)
    nb = hub.wait_state("dora", "two", "ERROR")
    assert nb["history"][-1]["reason"] == "ENGINE_ERROR"
