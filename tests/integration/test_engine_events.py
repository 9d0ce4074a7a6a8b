"""The engine's announcements of containers' exits (runtime/exits.py) on the real engine: a
wait for a container wakes when it exits, not at its time-out, and only for the containers
it names; and the create path that asks the engine as little as it can."""

from __future__ import annotations

import secrets
import time

import pytest

from gpulab.names import L_INSTANCE, L_USER
from gpulab.runtime.base import WorkloadSpec
from gpulab.runtime.docker import DockerRuntime

from ..conftest import run_async

pytestmark = [pytest.mark.docker]

IMAGE = "gpulab/debian:bookworm"


def test_a_wait_wakes_when_its_container_exits_and_only_for_it(docker_client):
    runtime = DockerRuntime()
    mine, other = (f"gpulab-test-exit-{secrets.token_hex(4)}" for _ in range(2))
    # the stream is followed from the first wait on (a wait that hears nothing: False)
    assert run_async(runtime.wait_exit([mine], 0.5, time.monotonic())) is False
    assert runtime.announces_exits
    looked = time.monotonic()
    container = docker_client.containers.run(
        IMAGE, ["sh", "-c", "sleep 3"], name=mine, detach=True, network_mode="none"
    )
    try:
        # another container's wait hears nothing of it (a new loop: run_async's own)
        assert run_async(runtime.wait_exit([other], 0.5, looked)) is False
        container.reload()
        assert container.status == "running"  # this wait begins before the exit
        began = time.monotonic()
        assert run_async(runtime.wait_exit([mine, other], 60, looked)) is True
        assert time.monotonic() - began < 10, "woken by the exit, not by the time-out"
        container.reload()
        assert container.status == "exited"
        # announced before this wait began, after the look: no wait at all
        began = time.monotonic()
        assert run_async(runtime.wait_exit([mine], 60, looked)) is True
        assert time.monotonic() - began < 1
    finally:
        container.remove(force=True)


def test_a_create_outlives_a_stale_network_id_and_a_container_left_by_its_name(docker_client):
    """The create path asks the engine as little as it can (issue #32 item 6): the ID of the
    owner's network this process knew is reused for 10 s, and no stale container is looked
    for before the create. So when another process removed that network meanwhile (the hub,
    as a notebook stopped), the create looks again and joins the new one; and a container
    left under the workload's name (a start cut short) is removed and made anew."""
    runtime = DockerRuntime()
    instance, owner = "t" + secrets.token_hex(4), "stale"
    labels = {L_INSTANCE: instance, L_USER: owner}

    def spec(name: str) -> WorkloadSpec:
        return WorkloadSpec(
            name=name,
            image=IMAGE,
            command=["sleep", "60"],
            labels=dict(labels),
            network_owner=owner,
            runner=False,
            cpus=0.1,
            memory=64 * 1024**2,
        )

    first, second = (f"{instance}-job-{k}" for k in ("a", "b"))
    try:
        run_async(runtime.create_and_start(spec(first)))
        known = next(iter(docker_client.containers.get(first).attrs["NetworkSettings"]["Networks"]))
        old = docker_client.networks.get(known)
        docker_client.containers.get(first).remove(force=True)
        old.remove()  # as another process does when the owner's last container went
        # a container left under the second's name, on no network, never started
        docker_client.containers.create(IMAGE, ["true"], name=second, network_mode="none")
        run_async(runtime.create_and_start(spec(second)))
        c = docker_client.containers.get(second)
        assert c.status == "running" and c.attrs["Config"]["Cmd"] == ["sleep", "60"]
        new = c.attrs["NetworkSettings"]["Networks"]
        assert list(new) == [old.name] and new[old.name]["NetworkID"] != old.id
    finally:
        for name in (first, second):
            for c in docker_client.containers.list(all=True, filters={"name": name}):
                c.remove(force=True)
        for n in docker_client.networks.list(filters={"label": f"{L_INSTANCE}={instance}"}):
            n.remove()
