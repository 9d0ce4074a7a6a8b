"""GPU placement through the shared ledger, on a real hub and engine.

No GPU exists here: the 'env' mode (NVIDIA_VISIBLE_DEVICES, for hosts whose default runtime is
nvidia) lets containers really run, and the 'device_request' mode is checked by inspecting what
the engine was asked for.
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest
import requests

from gpulab.gpus.sharing import MPS_REMOVED

from ..support.hub import SpawnFailed, login

pytestmark = [pytest.mark.docker, pytest.mark.hub]

FOUR_GPUS = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}, {"id": "2"}, {"id": "3"}]
c.GpulabSettings.max_resources = {"cpus": 1, "memory": "1G", "gpus": 4}
c.GpulabSettings.gpu_mode = "%s"
"""


def _visible_devices(container) -> str:
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    return env.get("NVIDIA_VISIBLE_DEVICES", "")


def _usage(hub, user: str, token: str) -> dict:
    r = requests.get(
        f"{hub.url}/services/gpulab/api/usage",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()


def _progress_until(hub, user: str, token: str, text: str, timeout: float = 60) -> str:
    """The first message of the spawn's progress (the hub's event stream, which replays what
    was said) that holds ``text``."""
    r = requests.get(
        f"{hub.api}/users/{user}/servers/gpu/progress",
        headers={"Authorization": f"token {token}"},
        stream=True,
        timeout=timeout,
    )
    r.raise_for_status()
    for line in r.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            message = json.loads(line[5:]).get("message", "")
            if text in message:
                r.close()
                return message
    raise AssertionError(f"{user}: no progress message with {text!r}")


def _ready_ones(hub, users, n: int, timeout: float = 180) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = [u for u in users if (hub.server_model(u, "gpu") or {}).get("ready")]
        if len(ready) >= n:
            return ready
        time.sleep(0.3)
    raise AssertionError(f"not {n} ready in {timeout} s")


TWO_GPUS = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.notebook_gpu_wait = 300
c.GpulabSettings.supervisor_interval = 0.2
"""


def test_four_concurrent_spawns_on_two_gpus_two_wait_in_line(hub_with, docker_client):
    """Four users ask for a GPU at once on two: two start, two wait in the queue shared with
    jobs, told their place; a stop gives its GPU to the first in line, and stopping a waiting
    server cancels its wait, leaving nothing booked or in line. (Four on two, not eight on
    four: the same race and the same rules, at half the containers.)"""
    hub = hub_with(TWO_GPUS, fresh=True)
    users = [f"u{i}" for i in range(4)]
    tokens = {u: hub.create_user(u) for u in users}
    options = {"cpus": 0.2, "memory": "512M", "gpus": 1}

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda u: hub.spawn(u, "gpu", options, token=tokens[u]), users))
    assert all(r.status_code in (201, 202) for r in codes), [r.text for r in codes]
    ready = _ready_ones(hub, users, 2)
    waiting = [u for u in users if u not in ready]
    assert len(ready) == 2 and len(waiting) == 2
    time.sleep(1)  # a few of the supervisor's passes: each waiting one told its place
    for u in waiting:
        assert (hub.server_model(u, "gpu") or {}).get("pending") == "spawn", u
    places = {u: _usage(hub, u, tokens[u])["fair_share"]["queued"] for u in waiting}
    assert sorted(q[0]["place"] for q in places.values()) == [1, 2], places
    assert all(q[0]["notebook"] == "gpu" for q in places.values())
    first = next(u for u, q in places.items() if q[0]["place"] == 1)
    told = _progress_until(hub, first, tokens[first], "in line")
    assert "1st in line of 2" in told and "0 of 2 GPUs free now" in told, told
    admin = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    assert admin.status_code == 200 and "Waiting for GPUs (2)" in admin.text
    # the spawn page's Stop button stops this named server (JupyterHub's: the default one)
    page = login(hub, first).get(f"{hub.url}/hub/spawn-pending/{first}/gpu", timeout=30)
    assert page.status_code == 200 and "Stop Server" in page.text
    assert 'var server = "gpu";' in page.text and "api.stop_named_server(user, server" in page.text

    devices = []
    for u in ready:
        nb = hub.notebook(u, "gpu").json()
        container = docker_client.containers.get(nb["container"])
        assert container.labels["org.gpulab.gpus"] == _visible_devices(container)
        devices.append(_visible_devices(container))
    assert sorted(devices) == ["0", "1"]

    # a stop gives the GPU back, and the first in line has it
    hub.stop_server(ready[0], "gpu")
    hub.wait_ready(first, "gpu", timeout=120)
    nb = hub.notebook(first, "gpu").json()
    assert _visible_devices(docker_client.containers.get(nb["container"])) == devices[0]
    assert [h["state"] for h in nb["history"]] == ["STARTING", "RUNNING"]

    # stopping a waiting server cancels its wait: nothing booked, nothing left in line
    for u in waiting:
        if u != first:
            hub.stop_server(u, "gpu")
    admin = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    assert "Nothing waits for GPUs" in admin.text
    held = {
        c.labels["org.gpulab.gpus"]
        for c in docker_client.containers.list(filters={"label": "org.gpulab.kind=notebook"})
        if c.labels.get("org.gpulab.instance") == hub.instance
    }
    assert held == {"0", "1"}
    for u in waiting:
        if u != first:
            assert _usage(hub, u, tokens[u])["fair_share"]["queued"] == []


def test_device_request_mode_asks_for_explicit_devices(hub_with, docker_client):
    hub = hub_with(FOUR_GPUS % "device_request", fresh=True)
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
    # and its environment names the same devices (an image's NVIDIA_VISIBLE_DEVICES=all would
    # otherwise win on a host whose default runtime is nvidia)
    assert _visible_devices(container) == "0,1"
    # and the ledger gave them back
    hub.spawn("dora", "two", {"cpus": 0.5, "memory": "512M", "gpus": 4}, token=token)
    nb = hub.wait_state("dora", "two", "ERROR")
    assert nb["history"][-1]["reason"] == "ENGINE_ERROR"


SHARED_GPUS = """
c.GpulabSettings.gpu_devices = [
    {"id": "0", "memory": "16384M"}, {"id": "1", "memory": "16384M"}, {"id": "2", "memory": "16384M"}
]
c.GpulabSettings.gpu_sharing = {"0": 4}
c.GpulabSettings.max_resources = {"cpus": 1, "memory": "1G", "gpus": 2}
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.notebook_gpu_wait = 0
"""


def _env(container) -> dict[str, str]:
    return dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])


def _no_mps_and_no_host_path(container) -> None:
    """Time-slicing is the one sharing mode: no MPS client variable, and nothing of the host
    mounted (named volumes only)."""
    env = _env(container)
    assert not [k for k in env if k.startswith("CUDA_MPS_")], env
    mounts = container.attrs["Mounts"]
    assert mounts and {m["Type"] for m in mounts} == {"volume"}, mounts


def test_fractional_and_whole_gpus_at_once(hub_with, docker_client):
    """Two notebooks share device 0 in halves while two others take whole devices, all at
    once; a share that no longer fits is refused with the slots each shared GPU has free."""
    hub = hub_with(SHARED_GPUS, fresh=True)
    asks = {"ann": 0.5, "bob": 0.5, "cy": 1, "dee": 1}
    tokens = {u: hub.create_user(u) for u in [*asks, "eve"]}

    # what the installation does not offer is a 400 naming the field, before anything starts
    for gpus, words in ((0.3, "choose one of: 0.25, 0.5, 0.75"), (1.5, "whole number")):
        r = hub.spawn("eve", "x", {"cpus": 0.2, "memory": "256M", "gpus": gpus}, tokens["eve"])
        assert r.status_code == 400 and words in r.text and "gpus" in r.text, r.text

    def spawn(user):
        opts = {"cpus": 0.2, "memory": "256M", "gpus": asks[user]}
        hub.spawn(user, "nb", opts, token=tokens[user])
        hub.wait_ready(user, "nb", timeout=180)
        return docker_client.containers.get(hub.notebook(user, "nb").json()["container"])

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        containers = dict(zip(asks, pool.map(spawn, asks), strict=True))

    # the sharers get device 0 the way a whole GPU is given, and their share as advice
    for u in ("ann", "bob"):
        env = _env(containers[u])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "0"
        assert env["GPULAB_GPU_FRACTION"] == "0.5"
        _no_mps_and_no_host_path(containers[u])
    # whole GPUs went to the devices that are not shared; no share environment
    whole = sorted(_env(containers[u])["NVIDIA_VISIBLE_DEVICES"] for u in ("cy", "dee"))
    assert whole == ["1", "2"]
    for u in ("cy", "dee"):
        assert "GPULAB_GPU_FRACTION" not in _env(containers[u])
        _no_mps_and_no_host_path(containers[u])

    # device 0 is full (two halves): a quarter is refused, saying what is free
    hub.spawn("eve", "nb", {"cpus": 0.2, "memory": "256M", "gpus": 0.25}, token=tokens["eve"])
    nb = hub.wait_state("eve", "nb", "FAILED")
    assert nb["history"][-1]["reason"] == "NO_GPU_AVAILABLE"
    assert "GPU 0: 0 of 4 slots free" in nb["history"][-1]["message"], nb["history"][-1]

    # the admin's GPU view shows the shares
    page = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},  # custom:gpulab:admin
        timeout=30,
    )
    assert page.status_code == 200, page.text[:300]
    assert page.text.count('<td class="share">0.5 GPU') == 2, page.text
    assert "(slots 1, 2 of 4)" in page.text and "(slots 3, 4 of 4)" in page.text

    # the metrics count the two halves as one GPU held on device 0
    from prometheus_client.parser import text_string_to_metric_families

    metrics = requests.get(
        f"{hub.url}/services/gpulab/metrics",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    held = {
        (s.labels["device"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(metrics.text)
        for s in family.samples
        if s.name == "gpulab_gpus_held"
    }
    assert held[("0", "notebook")] == 1.0 and held[("1", "notebook")] == 1.0, held

    # a stop gives the slots back, and the quarter fits
    hub.stop_server("ann", "nb")
    hub.spawn("eve", "nb", {"cpus": 0.2, "memory": "256M", "gpus": 0.25}, token=tokens["eve"])
    hub.wait_ready("eve", "nb", timeout=120)
    env = _env(docker_client.containers.get(hub.notebook("eve", "nb").json()["container"]))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0" and env["GPULAB_GPU_FRACTION"] == "0.25"
    assert not [k for k in env if k.startswith("CUDA_MPS_")], env


MPS = """
c.GpulabSettings.gpu_devices = [{"id": "0", "memory": "16384M"}]
c.GpulabSettings.gpu_sharing = {"0": 2}
c.GpulabSettings.gpu_sharing_mode = "mps"
c.GpulabSettings.mps_pipe_directory = "/tmp/nvidia-mps"
"""


def test_a_site_that_still_asks_for_mps_does_not_start(hub_with):
    """MPS was removed: a configuration that still asks for it stops the service at start-up
    with the reason and what to use instead, and the hub, whose managed service exited, with
    it; nothing is shared without the limits the site expects."""
    log = hub_with(MPS, start=False).start_refused(60)
    assert f"gpulab.service] invalid configuration: {MPS_REMOVED}" in log, log[-3000:]
    assert "Service gpulab exited with status 2" in log
