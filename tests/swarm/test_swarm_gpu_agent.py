"""GPU activity on a Swarm (issue 28, item 5): the service runs gpulab's GPU agent on every
worker (a global service), reads what each node's GPUs do through the manager's service logs,
and a job's page and ``GET /api/jobs/{id}`` show its GPUs' use on its node.

The lab's workers have no GPU: the agent's image here is the sync image (built from this tree:
nvidia-ml-py and gpulab.gpus.agent) with the stand-in ``libnvidia-ml.so.1`` of
tests/support/nvml.py on its library path, reporting two GPUs whose utilization the test set
(GPU 0: 87 %, GPU 1: 5 %), pushed to the lab's registry like the lab's other images.
"""

from __future__ import annotations

import contextlib
import secrets
import time

import docker
import pytest

from gpulab.names import gpu_agent_service_name

from ..support.api import Api
from ..support.nvml import TWO_GPUS, build_fake_nvml, set_usage

MIB = 1024**2
#: what the stand-in reports on every node: device -> (utilization %, memory used in MiB)
USAGE = {"0": (87, 3072), "1": (5, 1024)}
#: the stand-in's devices' memory (TWO_GPUS), MiB
TOTAL = {"0": 81559, "1": 40960}


@pytest.fixture(scope="module")
def agent_image(swarm_lab, sync_image, docker_client, tmp_path_factory):
    """The sync image with the stand-in NVML, in the lab's registry."""
    ctx = tmp_path_factory.mktemp("gpu-agent-image")
    build_fake_nvml(ctx)
    set_usage(ctx / "usage", USAGE)
    (ctx / "Dockerfile").write_text(
        f"FROM {sync_image}\n"
        "COPY libnvidia-ml.so.1 usage /opt/fake-nvml/\n"
        "ENV LD_LIBRARY_PATH=/opt/fake-nvml FAKE_NVML_USAGE=/opt/fake-nvml/usage "
        f'FAKE_NVML_GPUS="{TWO_GPUS}"\n'
    )
    tag = swarm_lab.image(f"gpulab/gpu-agent-test:{secrets.token_hex(4)}")
    docker_client.images.build(path=str(ctx), tag=tag, rm=True)
    out = docker_client.images.push(tag)
    assert '"error"' not in out, out
    yield tag
    with contextlib.suppress(docker.errors.APIError):
        docker_client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def hub(swarm_lab, agent_image, hub_with):
    return hub_with(
        'c.GpulabSettings.runtime = "swarm"\n'
        f"c.GpulabSettings.image_registry = {swarm_lab.registry!r}\n"
        "c.GpulabSettings.supervisor_interval = 0.3\n"
        + swarm_lab.node_engine_config()
        + swarm_lab.NO_ENCRYPTION
        + f"c.GpulabSettings.swarm_gpu_agent_image = {agent_image!r}\n"
        "c.GpulabSettings.swarm_gpu_agent_interval = 2\n"
    )


def _rows(api: Api, job_id: str, timeout: float) -> list[dict]:
    """The job's ``gpu_usage`` once it has rows (or [] after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = api.job(job_id)["gpu_usage"]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_a_jobs_gpus_are_read_on_its_node_by_the_agent(hub, swarm_lab, agent_image):
    ana = Api(hub, "ana")
    api = swarm_lab.api()
    name = gpu_agent_service_name(hub.instance)
    # the agent: one task on each worker, none on the manager the service runs beside
    spec = api.inspect_service(name)["Spec"]
    assert spec["Mode"] == {"Global": {}}
    task = spec["TaskTemplate"]
    assert task["Placement"]["Constraints"] == [f"node.id!={swarm_lab.manager.node_id}"]
    c = task["ContainerSpec"]
    assert (c["Image"].split("@")[0], c["User"], c["ReadOnly"], c.get("Mounts") or []) == (
        agent_image,
        "65534:65534",
        True,
        [],
    )
    deadline = time.monotonic() + 120
    while True:
        running = {
            t["NodeID"]
            for t in api.tasks(filters={"service": name, "desired-state": "running"})
            if t["Status"]["State"] == "running"
        }
        if running == {w.node_id for w in swarm_lab.workers} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert running == {w.node_id for w in swarm_lab.workers}

    job = ana.submit(command=["sleep", "600"], resources={"gpus": 1, "cpus": 0.2, "memory": "128M"})
    try:
        on = ana.wait(job["id"], {"RUNNING"}, timeout=180)
        assert on["state"] == "RUNNING", on
        (device,) = on["devices"]
        node, _, gpu = device.partition("/")
        assert node == on["node"] and node.startswith("gpulab-lab-worker"), on
        rows = _rows(ana, job["id"], 60)
        percent, used = USAGE[gpu]
        assert rows == [
            {
                "rank": 0,
                "device": device,
                "utilization": percent,
                "memory_used": used * MIB,
                "memory_total": TOTAL[gpu] * MIB,
            }
        ], rows
        # no agent, no reading: unknown (nothing shown), never an error; the service makes
        # it again (at most once a minute) and the readings come back
        api.remove_service(name)
        assert _rows_gone(ana, job["id"], 30), "readings still shown without an agent"
        assert _rows(ana, job["id"], 150) == rows
    finally:
        ana.call("POST", f"/jobs/{job['id']}/interrupt")
        ana.wait(job["id"])


def _rows_gone(api: Api, job_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not api.job(job_id)["gpu_usage"]:
            return True
        time.sleep(0.5)
    return False
