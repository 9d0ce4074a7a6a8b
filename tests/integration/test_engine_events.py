"""The engine's announcements of containers' exits (runtime/exits.py) on the real engine: a
wait for a container wakes when it exits, not at its time-out, and only for the containers
it names."""

from __future__ import annotations

import secrets
import time

import pytest

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
