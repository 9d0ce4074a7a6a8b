"""Notebooks end to end: a real hub process, its proxy, the gpulab service, the Docker engine."""

from __future__ import annotations

import pytest
import requests

pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(fresh=True)  # its last check: no volume of the instance is left


def states(hub, user, server):
    r = hub.notebook(user, server)
    assert r.status_code == 200, r.text
    return [e["state"] for e in r.json()["history"]]


def test_spawn_reach_stop_start_delete(hub, docker_client):
    token = hub.create_user("alice")
    r = hub.spawn("alice", "nb1", {"framework": "python", "flavor": "cpu-small"}, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice", "nb1")

    # the user's own token reaches the notebook server through the proxy
    status = requests.get(
        f"{hub.url}/user/alice/nb1/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert status.status_code == 200, status.text
    assert "started" in status.json()

    r = hub.notebook("alice", "nb1", token=token)
    assert r.status_code == 200, r.text
    nb = r.json()
    assert nb["state"] == "RUNNING"
    assert [e["state"] for e in nb["history"]] == ["STARTING", "RUNNING"]
    name = nb["container"]
    c = docker_client.containers.get(name)
    labels = c.labels
    assert labels["org.gpulab.user"] == "alice"
    assert labels["org.gpulab.server"] == "nb1"
    assert labels["org.gpulab.kind"] == "notebook"
    assert labels["org.gpulab.instance"] == hub.instance
    hc = c.attrs["HostConfig"]
    assert hc["NanoCpus"] == 0 and hc["CpuQuota"] == 100_000 and hc["CpuPeriod"] == 100_000
    assert hc["Memory"] == 2 * 1024**3
    assert hc["PidsLimit"] == 4096
    assert hc["ShmSize"] == 1024**3
    assert c.attrs["Config"]["User"] == "1000"
    assert hc["CapDrop"] == ["ALL"]

    # the workspace is pushed to the embedded object store (a directory that persists)
    c.exec_run(["sh", "-c", "echo kept > /workspace/kept.txt"])
    hub.stop_server("alice", "nb1")
    assert states(hub, "alice", "nb1") == ["STARTING", "RUNNING", "STOPPING", "STOPPED"]
    stored = hub.workdir / "data/objects/gpulab-workspaces/workspaces/alice/nb1/kept.txt"
    assert stored.read_text() == "kept\n"

    # without its local volume, the notebook starts again with its workspace pulled back
    docker_client.volumes.get(name + "-workspace").remove()
    hub.spawn("alice", "nb1", {}, token=token)
    hub.wait_ready("alice", "nb1")
    assert states(hub, "alice", "nb1")[-2:] == ["STARTING", "RUNNING"]
    out = docker_client.containers.get(name).exec_run(["cat", "/workspace/kept.txt"])
    assert out.output == b"kept\n"

    hub.stop_server("alice", "nb1", remove=True)
    hub.wait_state("alice", "nb1", "DELETED")
    assert states(hub, "alice", "nb1")[-4:] == ["STOPPING", "STOPPED", "DELETING", "DELETED"]
    volumes = [v.name for v in docker_client.volumes.list()]
    assert not [v for v in volumes if v.startswith(hub.instance)]
    # and so is its remote workspace
    assert not stored.exists()
