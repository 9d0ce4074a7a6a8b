"""The engine gpulab drives is the one DOCKER_HOST names (as docker.from_env reads it), for
the hub and the gpulab service alike; one that does not answer is named in a 503, never a
500 or a traceback. A real hub and service, the real runtime client, the real engine."""

from __future__ import annotations

import os

import pytest

from gpulab.runtime.base import EngineUnreachable
from gpulab.runtime.docker import DockerRuntime

from ..conftest import run_async
from ..support.api import Api

pytestmark = [pytest.mark.docker]

ENGINE = "/var/run/docker.sock"


def test_docker_host_names_the_engine(monkeypatch, tmp_path):
    """The same engine through another path (a link to its socket) answers; a path where
    no engine listens is EngineUnreachable naming that path: DOCKER_HOST is what is read."""
    link = tmp_path / "engine.sock"
    os.symlink(ENGINE, link)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{link}")
    runtime = DockerRuntime()
    assert run_async(runtime.state("gpulab-no-such-workload")) is None
    assert runtime.engine.url == f"unix://{link}"
    wrong = f"unix://{tmp_path}/none.sock"
    monkeypatch.setenv("DOCKER_HOST", wrong)
    with pytest.raises(EngineUnreachable) as e:
        run_async(DockerRuntime().state("gpulab-no-such-workload"))
    assert str(e.value) == f"Docker engine at {wrong} is unreachable: No such file or directory"


@pytest.mark.hub
def test_the_api_answers_503_naming_an_engine_that_does_not_answer(hub_with, tmp_path):
    wrong = f"unix://{tmp_path}/no-engine.sock"
    hub = hub_with("c.GpulabSettings.supervisor_interval = 0.3\n", start=False)
    hub.env["DOCKER_HOST"] = wrong  # the hub's environment; it hands it to its service
    hub.start()
    ann = Api(hub, "ann")
    job = ann.submit(name="quiet", framework="python", command=["true"])  # needs no engine
    said = f"Docker engine at {wrong} is unreachable: No such file or directory"
    for path in (f"/jobs/{job['id']}/logs", f"/jobs/{job['id']}/logs?follow=true"):
        r = ann.call("GET", path)
        assert r.status_code == 503, r.text
        assert r.json() == {"status": 503, "message": said}
    r = ann.call("POST", f"/jobs/{job['id']}/exec", json={"command": "id"})
    assert r.status_code == 409, r.text  # QUEUED: never started, nothing asked of the engine
    listed = ann.call("GET", "/jobs")
    assert listed.status_code == 200 and listed.json()["total"] == 1
    # the supervisor says it in a line and tries again (no traceback: checked at the hub's end)
    assert f"supervisor pass failed: {said}" in hub.log_file.read_text(), hub.tail(40)
    assert ann.job(job["id"])["state"] == "QUEUED"
