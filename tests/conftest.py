"""Shared fixtures: the real Docker engine, the built images, and real hub processes.

Tests that need Docker skip on a developer machine without an engine, but FAIL in CI
(CI=true): a suite that silently skips its integration tests proves nothing.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import docker
import pytest

from gpulab import __version__

from .support.hub import Hub

IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")
BASE_IMAGE = "gpulab/python:3.11"
PYTORCH_IMAGE = "gpulab/pytorch:2.13"
FRAMEWORK_IMAGES = ("gpulab/tensorflow:2.20", "gpulab/jax:0.7")
SYNC_IMAGE = f"gpulab/sync:{__version__}"
ROOT = Path(__file__).resolve().parents[1]


def _need(message: str):
    if IN_CI:
        pytest.fail(message + " (CI=true: a missing engine is a failure, not a skip)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def docker_client():
    try:
        client = docker.from_env()
        client.ping()
    except Exception as e:  # any failure to reach the engine
        _need(f"no Docker engine answers ({e}); run `make engine`")
    _prune_leftover_networks(client)
    return client


def _prune_leftover_networks(client) -> None:
    """Users' networks left by interrupted runs would exhaust the engine's ~30 address pools.

    Only networks whose user has no container left go (safe beside running tests: gpulab
    makes a pruned network again when it needs it).
    """
    from gpulab.runtime.network import remove_user_network_if_unused

    for n in client.networks.list(filters={"label": "org.gpulab.kind=network"}):
        labels = n.attrs.get("Labels") or {}
        if "org.gpulab.instance" in labels and "org.gpulab.user" in labels:
            remove_user_network_if_unused(
                client.api, labels["org.gpulab.instance"], labels["org.gpulab.user"]
            )


def _image(client, image: str) -> str:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        _need(f"image {image} is missing; run `make images`")
    return image


@pytest.fixture(scope="session")
def images(docker_client):
    """The base notebook image that most tests spawn."""
    return _image(docker_client, BASE_IMAGE)


@pytest.fixture(scope="session")
def pytorch_image(docker_client):
    return _image(docker_client, PYTORCH_IMAGE)


@pytest.fixture(scope="session")
def framework_images(docker_client):
    """The TensorFlow and JAX images (built by `make images` too)."""
    return [_image(docker_client, image) for image in FRAMEWORK_IMAGES]


@pytest.fixture(scope="module")
def sync_image(docker_client):
    """The sync image with dulwich and this tree's gitclone module: built (or found up to
    date, in a second) by scripts/build-images.sh, as `make images` does."""
    run = subprocess.run(
        [str(ROOT / "scripts" / "build-images.sh"), "sync"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if run.returncode != 0:
        _need(f"scripts/build-images.sh sync failed:\n{run.stderr[-3000:]}")
    out = docker_client.containers.run(
        SYNC_IMAGE, ["git-clone", "--help"], remove=True, stdout=True, stderr=True
    )
    assert b"git-clone" in out
    return SYNC_IMAGE


@pytest.fixture(scope="session")
def postgres_server():
    """A local PostgreSQL server (`make test` starts one with scripts/ensure-postgres.sh)."""
    import psycopg

    try:
        psycopg.connect("dbname=postgres host=/var/run/postgresql", connect_timeout=5).close()
    except Exception as e:
        _need(f"no PostgreSQL server answers ({e}); run scripts/ensure-postgres.sh")
    return "host=/var/run/postgresql"


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh database for one test; dropped afterwards."""
    import secrets

    import psycopg

    name = "gpulab_test_" + secrets.token_hex(4)
    with psycopg.connect(f"dbname=postgres {postgres_server}", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+psycopg:///{name}?host=/var/run/postgresql"
    with psycopg.connect(f"dbname=postgres {postgres_server}", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def hub_factory(tmp_path_factory, images):
    """Start hubs with extra config; all are stopped and their containers removed afterwards."""
    hubs: list[Hub] = []

    def make(extra_config: str = "", start: bool = True) -> Hub:
        hub = Hub(workdir=tmp_path_factory.mktemp("hub"), extra_config=extra_config)
        hubs.append(hub)
        return hub.start() if start else hub

    yield make
    for hub in hubs:
        hub.stop()
        hub.remove_workloads()


def run_async(coro):
    """Run a coroutine to its end on a loop of its own, in a thread of its own: a test may run
    while another loop owns the main thread (Playwright's sync API, session-wide in the
    browser tests), where asyncio.run() and pytest-asyncio's loop are refused."""
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def wait_until(predicate, timeout: float = 60, step: float = 0.3, what: str = "condition"):
    """The predicate's first true value, asked every ``step`` seconds; TimeoutError after
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"{what} not met in {timeout} s")
