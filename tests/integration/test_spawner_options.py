"""DockerSpawner's options that gpulab ignores, on a real hub: set, each is named at start-up in
a WARNING with what to use instead, and the notebook's container is gpulab's all the same (not
privileged, not on the configured network)."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.hub]

IGNORED = """
c.DockerSpawner.network_name = "host"
c.DockerSpawner.extra_host_config = {"privileged": True}
"""


def test_ignored_options_are_named_and_change_nothing(hub_with, docker_client):
    hub = hub_with(IGNORED, fresh=True)
    log = hub.log_file.read_text(errors="replace")
    for option, instead in (
        ("c.DockerSpawner.network_name", "c.GpulabSettings.network_isolation"),
        ("c.DockerSpawner.extra_host_config", "c.GpulabSettings ("),
    ):
        said = re.findall(
            rf"^\[W [^\]]*\] {re.escape(option)} is set, but gpulab's NotebookSpawner ignores "
            rf"it; use {re.escape(instead)}",
            log,
            re.MULTILINE,
        )
        assert len(said) == 1, hub.tail()  # once, at the hub's start

    hub.create_user("ivy")
    r = hub.spawn("ivy", "nb", {"framework": "python", "flavor": "cpu-small"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ivy", "nb")
    attrs = docker_client.containers.get(hub.notebook("ivy", "nb").json()["container"]).attrs
    assert attrs["HostConfig"]["Privileged"] is False
    assert attrs["HostConfig"]["NetworkMode"] != "host"
    assert "host" not in attrs["NetworkSettings"]["Networks"]
