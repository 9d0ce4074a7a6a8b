"""Shared fixtures: the real Docker engine, the built images, and real hub processes.

Tests that need Docker skip on a developer machine without an engine, but FAIL in CI
(CI=true): a suite that silently skips its integration tests proves nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from gpulab import __version__

from .support.hub import Hub, HubLogErrors, HubPool, hub_groups
from .support.timeline import Timeline

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
    return client


def pytest_configure(config):
    """The controller (or the one process) keeps the run's timeline (tests/support/timeline.py)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        swarm = config.getoption("markexpr", "") == "swarm"
        config.pluginmanager.register(
            Timeline("timeline-swarm.tsv" if swarm else "timeline.tsv"), "gpulab-timeline"
        )


def pytest_sessionstart(session):
    """Leftover networks are pruned once, before any test (under pytest-xdist by the
    controller, before its workers start hubs of their own)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        client = docker.from_env()
        client.ping()
    except Exception:  # noqa: BLE001 - no engine: the docker_client fixture says so
        return
    _prune_leftover_networks(client)


def _prune_leftover_networks(client) -> None:
    """Users' networks left by interrupted runs would exhaust the engine's ~30 address pools.

    Only networks whose user has no container left go (safe beside running tests: gpulab
    makes a pruned network again when it needs it).
    """
    from gpulab.runtime.network import remove_user_network_if_unused

    for n in client.networks.list(filters={"label": "org.gpulab.kind=network"}):
        if n.attrs.get("Scope") == "swarm":
            continue  # the swarm lab's overlays (its tasks are not this engine's containers)
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


@pytest.fixture(scope="module")
def ldap_directory(tmp_path_factory):
    """A real LDAP directory (slapd, installed by scripts/ensure-slapd.sh as `make test` does)
    on a free port, with tests/support/ldap.py's users and groups; stopped after the module."""
    from .support.ldap import Directory, missing

    why = missing()
    if why:
        _need(why)
    directory = Directory(tmp_path_factory.mktemp("slapd")).start()
    yield directory
    directory.stop()


# --- hubs: hub_with(config), the one way to start one ------------------------------------------

#: the test module that runs now (set before its fixtures), for the hub pool
_running: dict[str, object] = {"module": None, "pool": None}
_HUB_WITH = re.compile(r"hub_with\(\s*([A-Za-z_][A-Za-z0-9_]*)?\s*[,)]")


def _hub_configs(module) -> list[str]:
    """The configurations a test module (or its package's conftest) asks hub_with to share:
    read from their source, ``hub_with(NAME)`` with NAME a string of the module's."""
    found = []
    sources = [module]
    conftest = sys.modules.get(module.__name__.rpartition(".")[0] + ".conftest")
    if conftest is not None and "\ndef hub(" not in Path(module.__file__).read_text():
        sources.append(conftest)  # its hub fixture, unless the module has its own
    for source in sources:
        try:
            text = Path(source.__file__).read_text()
        except (OSError, TypeError):
            continue
        for line in text.splitlines():
            if "fresh=" in line or "start=False" in line:
                continue
            for name in _HUB_WITH.findall(line):
                value = getattr(module, name, None) or getattr(source, name, None) if name else ""
                if isinstance(value, str):
                    found.append(value)
    return found


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(session, config, items):
    order: dict[str, int] = {}
    wanted: dict[str, list[int]] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in order:
            continue
        order[module.__name__] = len(order)
        for text in _hub_configs(module):
            wanted.setdefault(text, []).append(order[module.__name__])
    config.stash[_HUB_PLAN] = (order, wanted)
    _group_by_hub(items, order, wanted)


def _group_by_hub(items, order: dict[str, int], wanted: dict[str, list[int]]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, as `make test` runs), the modules that
    share a hub go to one worker, in their order, so that each shared hub starts once."""
    groups = hub_groups(order, wanted)
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ in groups:
            item.add_marker(pytest.mark.xdist_group(groups[module.__name__]))


_HUB_PLAN = pytest.StashKey[tuple]()


@pytest.fixture(scope="session")
def hub_with(request, tmp_path_factory, images):
    """``hub_with(extra_config="", fresh=False, start=True)``: a running hub with this extra
    configuration. Shared with every test module that asks for the same text, reset between
    them (servers stopped, jobs interrupted) and stopped after the last; ``fresh=True`` (a
    test that stops, kills or restarts its hub) or ``start=False`` gives a hub of the caller's
    own, stopped at the end of the test (or, asked for by a fixture, of the module). Every hub
    stopped has its log checked for tracebacks (tests/support/hub.py)."""
    order, wanted = request.config.stash.get(_HUB_PLAN, ({}, {}))
    pool = HubPool(tmp_path_factory.mktemp, lambda: _running["module"], wanted, order)
    _running["pool"] = pool
    yield pool.get
    _running["pool"] = None
    pool.close()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    module = getattr(item, "module", None)
    _running["module"] = module.__name__ if module else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    pool = _running["pool"]
    if pool is not None:
        pool.in_test = True
    try:
        return (yield)
    finally:
        if pool is not None:
            pool.in_test = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Hubs go before the fixtures they were configured with (a database, an S3 server): a
    test's fresh hubs before its fixtures' teardown, a module's hubs before its module's."""
    pool, error = _running["pool"], None
    if pool is not None:
        module = getattr(item, "module", None)
        try:
            pool.end_test()
            if module is not None and getattr(nextitem, "module", None) is not module:
                pool.end_module(module.__name__)
        except Exception as e:  # noqa: BLE001 - raised once the fixtures are torn down
            error = e
    result = yield
    if error is not None:
        raise error
    return result


def pytest_sessionfinish(session, exitstatus):
    """The logs of the hubs a test started without hub_with (the Swarm lab's) are checked
    here, at the end: an unexpected traceback fails the run."""
    problems = []
    for hub in [h for h in Hub.instances if not h.checked]:
        try:
            hub.check_log()
        except HubLogErrors as e:
            problems.append(str(e))
    _running["log_problems"] = problems
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if Hub.started:
        terminalreporter.write_line(f"gpulab: {Hub.started} hub process(es) started")
    if _running.get("log_problems"):
        terminalreporter.write_sep("=", "unexpected errors in hub logs", red=True)
        terminalreporter.write_line("\n\n".join(_running["log_problems"]))


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
