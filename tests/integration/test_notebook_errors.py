"""Bad options, missing images and dying notebooks: clear answers and the right states."""

from __future__ import annotations

import pytest

from ..support.hub import SpawnFailed, login
from ..support.images import build_from

pytestmark = [pytest.mark.docker, pytest.mark.hub]

BROKEN_IMAGE = "gpulab-test/broken:1"
VANISHING_IMAGE = "gpulab-test/vanishing:1"

EXTRA = f"""
c.GpulabSettings.frameworks = [
    {{"id": "python", "title": "Python", "versions": [{{"id": "3.11", "image": "gpulab/python:3.11"}}]}},
    {{"id": "ghost", "title": "Missing image", "versions": [{{"id": "1", "image": "gpulab-test/nope:404"}}]}},
    {{"id": "broken", "title": "Exits at once", "versions": [{{"id": "1", "image": "{BROKEN_IMAGE}"}}]}},
    {{"id": "vanishing", "title": "Removed after the check", "versions": [{{"id": "1", "image": "{VANISHING_IMAGE}"}}]}},
]
c.GpulabSettings.gpu_devices = [{{"id": "0"}}, {{"id": "1"}}]
c.GpulabSettings.gpu_mode = "env"
c.Spawner.poll_interval = 1
c.GpulabSettings.max_resources = {{"cpus": 2, "memory": "4G", "gpus": 1}}
c.GpulabSettings.group_max_resources = {{"big": {{"gpus": 8}}}}
"""


@pytest.fixture(scope="module")
def broken_image(docker_client, images):
    """An image whose server process exits with code 3 as soon as it starts."""
    dockerfile = 'FROM gpulab/python:3.11\nCMD ["sh", "-c", "echo boom >&2; exit 3"]\n'
    return build_from(docker_client, dockerfile, BROKEN_IMAGE)


@pytest.fixture(scope="module")
def hub(hub_with, broken_image):
    hub = hub_with(EXTRA)
    hub.token = hub.create_user("bob")
    return hub


@pytest.mark.parametrize(
    "options, field, words",
    [
        ({"framework": "tensorflow"}, "framework", "choose one of: python, ghost, broken"),
        ({"framework": "python", "version": "2.7"}, "version", "choose one of: 3.11"),
        ({"editor": "emacs"}, "editor", "offers editors: jupyterlab"),
        ({"flavor": "gpu-8"}, "flavor", "choose one of: cpu-small"),
        ({"cpus": 1, "memory": "-1G"}, "memory", "memory must be"),
        ({"cpus": 1, "memory": "1G", "gpus": 2}, "gpus", "over your limit; allowed"),
        ({"cpus": 64, "memory": "1G"}, "cpus", "over your limit; allowed: cpus ≤ 2"),
        ({"cpus": "lots", "memory": "1G"}, "cpus", "must be a number"),
        ({"image": "alpine:latest"}, "image", "not in the catalog"),
        ({"privileged": True}, "privileged", "unknown option 'privileged'"),
        ({"auto_restart": "maybe"}, "auto_restart", "must be true or false"),
    ],
)
def test_invalid_options_are_400_with_reason(hub, options, field, words):
    r = hub.spawn("bob", "bad", options, token=hub.token)
    assert r.status_code == 400, (r.status_code, r.text)
    message = r.json()["message"]
    assert words in message, message
    # nothing was started
    model = hub.server_model("bob", "bad")
    assert model is None or not model.get("ready")


def test_group_limit_applies_and_host_size_is_said(hub):
    token = hub.create_user("carol")
    r = hub.spawn("carol", "g", {"flavor": "gpu-2"}, token=token)
    assert r.status_code == 400 and "gpus ≤ 1" in r.json()["message"], r.text
    hub.request("POST", "/groups/big", json={}).raise_for_status()
    hub.request("POST", "/groups/big/users", json={"users": ["carol"]}).raise_for_status()
    r = hub.spawn("carol", "g", {"cpus": 1, "memory": "1G", "gpus": 5}, token=token)
    assert r.status_code == 400, r.text
    assert "gpus=5 requested but this host has 2 GPU(s)" in r.json()["message"]


def test_missing_image_is_a_400_not_a_failed_spawn(hub):
    r = hub.spawn("bob", "ghost", {"framework": "ghost"}, token=hub.token)
    assert r.status_code == 400, r.text
    assert (
        "version: Missing image 1 is unavailable: its image gpulab-test/nope:404 is missing"
        in (r.json()["message"])
    )
    assert hub.notebook("bob", "ghost").status_code == 404  # nothing was started or recorded


def test_image_gone_between_the_check_and_the_start_is_error(hub, docker_client):
    """The options trust the engine's answer about an image for 30 s: an image removed in
    between is found missing by the spawn's own check, an ERROR that names it."""
    docker_client.images.get("gpulab/python:3.11").tag(VANISHING_IMAGE)
    try:
        # the form asks the engine for every catalog image: one found there is trusted 30 s
        page = login(hub, "bob").get(f"{hub.url}/hub/spawn/bob/vanish", timeout=60)
        assert page.status_code == 200 and 'value="vanishing"' in page.text
    finally:
        docker_client.images.remove(VANISHING_IMAGE)
    r = hub.spawn("bob", "vanish", {"framework": "vanishing"}, token=hub.token)
    assert r.status_code >= 400 or hub.server_model("bob", "vanish") is not None
    with pytest.raises(SpawnFailed):
        hub.wait_ready("bob", "vanish", timeout=30)
    nb = hub.wait_state("bob", "vanish", "ERROR")
    last = nb["history"][-1]
    assert last["reason"] == "IMAGE_MISSING"
    assert f"{VANISHING_IMAGE} is missing" in last["message"]


def test_process_exiting_at_start_is_failed_with_exit_code(hub):
    r = hub.spawn("bob", "broken", {"framework": "broken"}, token=hub.token)
    assert r.status_code in (201, 202, 500), r.text
    with pytest.raises(SpawnFailed):
        hub.wait_ready("bob", "broken", timeout=60)
    nb = hub.wait_state("bob", "broken", "FAILED")
    last = nb["history"][-1]
    assert last["exit_code"] == 3, last
    assert "exit code 3" in last["message"]


def test_running_notebook_killed_is_failed(hub, docker_client):
    hub.spawn("bob", "victim", {}, token=hub.token)
    hub.wait_ready("bob", "victim")
    nb = hub.wait_state("bob", "victim", "RUNNING")
    docker_client.containers.get(nb["container"]).kill(signal="SIGKILL")
    # the hub notices through poll() at its poll interval
    nb = hub.wait_state("bob", "victim", "FAILED", timeout=60)
    assert nb["history"][-1]["exit_code"] == 137, nb["history"][-1]
    hub.wait_stopped("bob", "victim")
    # FAILED keeps its meaning after the hub cleans up, and the notebook can start again
    assert hub.notebook("bob", "victim").json()["state"] == "FAILED"
    r = hub.spawn("bob", "victim", {}, token=hub.token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("bob", "victim")
    assert hub.wait_state("bob", "victim", "RUNNING")["history"][-2]["state"] == "STARTING"
