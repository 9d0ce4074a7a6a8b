"""The swarm lab: a real multi-node Docker Swarm on this one machine (docs/swarm-lab.md).

`swarm_lab` (session) runs `scripts/swarm-lab.sh up 2` and yields a `SwarmLab`: this host's
engine is the manager (active; gpulab places nothing on the hub's node), two Docker-in-Docker containers are the worker nodes, and a
registry serves the gpulab images under the same names on the host and on every node
(`swarm_lab.registry + "gpulab/python:3.11"`). At the end of the session it runs `down`, which
leaves the host's engine as it was (not when the lab was already up before the session, or
when SWARM_LAB_KEEP=1).

Every test under tests/swarm/ is marked `swarm` (deselect with `-m "not swarm"`; `make test` runs
them in a pytest process of their own beside the others, scripts/run-tests.sh); in a session
that collects both, it runs after all the others.
When the lab cannot be built the tests skip, and FAIL under CI=true.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..conftest import _need

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "swarm-lab.sh"
WORKERS = 2
HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "swarm: uses the multi-node swarm lab (tests/swarm; runs after the others)"
    )


def pytest_collection_modifyitems(config, items):
    """Mark the tests under tests/swarm/ and move them after all the others (stable order)."""
    swarm, rest = [], []
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.swarm)
            item.add_marker(pytest.mark.docker)
            swarm.append(item)
        else:
            rest.append(item)
    items[:] = rest + swarm


@dataclass(frozen=True)
class LabNode:
    """The manager: this host's engine."""

    node_id: str
    hostname: str
    addr: str  # its address on the lab network (what the workers joined)
    docker_url: str  # e.g. unix:///var/run/docker.sock


@dataclass(frozen=True)
class LabWorker:
    container: str  # the worker's container on this host's engine: gpulab-lab-worker-N
    node_id: str  # its swarm node ID
    hostname: str  # the node's hostname (= container name)
    addr: str  # its IP on the lab network (10.213.0.10+N)
    docker_url: str  # its own engine, tcp://ADDR:2376 (TLS client certificates only: engine_tls)
    gpus: tuple[str, ...]  # the fake GPU inventory, node label org.gpulab.gpus


@dataclass(frozen=True)
class SwarmLab:
    manager: LabNode
    registry: str  # image prefix, the same on the host and the nodes: "127.0.0.1:5000/"
    registry_addr: str  # "127.0.0.1:5000"
    workers: tuple[LabWorker, ...]
    gateway: str  # this host's address on the lab network: the nodes reach the host there
    network: str  # the lab's bridge network on this host (the nodes' underlay)
    subnet: str
    gpus_per_node: int
    images: tuple[str, ...]  # what the registry holds and every worker has pulled
    workdir: Path  # a directory of this session on the host (the facts file lives there)
    facts: dict = field(repr=False)  # everything `swarm-lab.sh up` reported

    def image(self, name: str) -> str:
        """'gpulab/python:3.11' -> '127.0.0.1:5000/gpulab/python:3.11'."""
        return self.registry + name

    def api(self, timeout: int = 60):
        """A low-level docker.APIClient on the manager (services, tasks, nodes)."""
        import docker

        return docker.APIClient(base_url=self.manager.docker_url, timeout=timeout)

    def worker(self, which: str | LabWorker) -> LabWorker:
        """A worker by hostname, container name or node ID."""
        if isinstance(which, LabWorker):
            return which
        for w in self.workers:
            if which in (w.hostname, w.container, w.node_id):
                return w
        raise KeyError(f"no lab worker {which!r}: {[w.hostname for w in self.workers]}")

    def engine_tls(self):
        """The client TLS configuration the workers' engines take (the lab's CA and client)."""
        from docker.tls import TLSConfig

        t = self.facts["engine_tls"]
        return TLSConfig(client_cert=(t["cert"], t["key"]), ca_cert=t["ca"], verify=True)

    def node_engine_config(self) -> str:
        """The hub configuration lines for the service to reach the workers' engines."""
        t = self.facts["engine_tls"]
        return (
            'c.GpulabSettings.swarm_node_engine = "tcp://{address}:2376"\n'
            f"c.GpulabSettings.swarm_node_tls_ca = {t['ca']!r}\n"
            f"c.GpulabSettings.swarm_node_tls_cert = {t['cert']!r}\n"
            f"c.GpulabSettings.swarm_node_tls_key = {t['key']!r}\n"
        )

    #: the lab's nodes are containers: Docker makes the IPsec policy of an encrypted overlay
    #: there but no security association (``ip xfrm state`` is empty on the workers), so its
    #: traffic between nodes times out (seen here); the lab uses the documented opt-out
    NO_ENCRYPTION = "c.GpulabSettings.swarm_overlay_encryption = False\n"

    def worker_client(self, which: str | LabWorker, timeout: int = 60):
        """A docker.DockerClient on one worker's own engine (over TLS, as the service)."""
        import docker

        from gpulab.runtime.swarm_nodes import NodeClient

        client = docker.DockerClient.__new__(docker.DockerClient)
        client.api = NodeClient(  # (the machine's REQUESTS_CA_BUNDLE would replace the lab's CA)
            base_url=self.worker(which).docker_url, timeout=timeout, tls=self.engine_tls()
        )
        return client

    def node_state(self, which: str | LabWorker) -> str:
        """The manager's view of a worker node: 'ready', 'down', 'unknown', 'disconnected'."""
        return self.api().inspect_node(self.worker(which).node_id)["Status"]["State"]

    def wait_node(self, which: str | LabWorker, state: str, timeout: float = 60) -> str:
        """Poll the manager (every 0.1 s) until the node is in `state`; returns the last state."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.node_state(which)
            if now == state or time.monotonic() > deadline:
                return now
            time.sleep(0.1)

    def kill_worker(self, which: str | LabWorker) -> LabWorker:
        """SIGKILL a worker's container: its engine and every task on it die at once, as when a
        machine loses power. The manager reports the node Down a few seconds later
        (docs/swarm-lab.md). Bring it back with restart_worker()."""
        import docker

        w = self.worker(which)
        docker.from_env().containers.get(w.container).kill()
        return w

    def restart_worker(self, which: str | LabWorker | None = None) -> SwarmLab:
        """Start the killed or stopped worker(s) again (`swarm-lab.sh up`: the same node IDs,
        waits until every node is Ready). Returns the refreshed lab."""
        if which is not None:
            self.worker(which)  # a typo fails here, not in the script
        lab = _up(len(self.workers), Path(self.facts["_path"]))
        old = {w.container: w.node_id for w in self.workers}
        new = {w.container: w.node_id for w in lab.workers}
        assert old == new, f"restarting changed the nodes: {old} -> {new}"
        return lab


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _load(facts_path: Path) -> SwarmLab:
    facts = json.loads(facts_path.read_text())
    facts["_path"] = str(facts_path)
    m = facts["manager"]
    return SwarmLab(
        manager=LabNode(m["node_id"], m["hostname"], m["addr"], m["docker_host"]),
        registry=facts["registry"]["prefix"],
        registry_addr=facts["registry"]["addr"],
        workers=tuple(
            LabWorker(
                container=w["container"],
                node_id=w["node_id"],
                hostname=w["hostname"],
                addr=w["addr"],
                docker_url=w["docker_url"],
                gpus=tuple(g for g in w["gpus"].split(",") if g),
            )
            for w in facts["workers"]
        ),
        gateway=facts["network"]["gateway"],
        network=facts["network"]["name"],
        subnet=facts["network"]["subnet"],
        gpus_per_node=facts["gpus_per_node"],
        images=tuple(facts["images"]),
        workdir=facts_path.parent,
        facts=facts,
    )


def _up(n: int, facts_path: Path) -> SwarmLab:
    t0 = time.monotonic()
    try:
        proc = _run("up", str(n), "--facts", str(facts_path), timeout=900)
    except subprocess.TimeoutExpired as e:
        _need(f"scripts/swarm-lab.sh up {n} did not finish in {e.timeout} s")
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        _need(f"the swarm lab could not be built (scripts/swarm-lab.sh up {n}):\n{tail}")
    lab = _load(facts_path)
    print(f"\nswarm lab up in {time.monotonic() - t0:.1f} s: {lab.facts.get('timings_s')}")
    return lab


LOCK = Path(os.environ.get("SWARM_LAB_LOCK", "/tmp/gpulab-swarm-lab.lock"))
HOLDERS = LOCK.with_name(LOCK.name + ".holders")


def _live_holders() -> list[int]:
    """Other pytest sessions using the lab now (one file per process id); dead ones go."""
    live = []
    for f in HOLDERS.glob("*") if HOLDERS.is_dir() else []:
        pid = int(f.name) if f.name.isdigit() else 0
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            live.append(pid)
        except (ProcessLookupError, ValueError):
            f.unlink(missing_ok=True)
        except PermissionError:
            live.append(pid)
    return live


@pytest.fixture(scope="session")
def swarm_lab(tmp_path_factory):
    """The lab, up for the session. Sessions running at the same time share it: the last one
    to end takes it down (the script's lock orders the check and the `down`). A lab that was
    up before, with no session holding it (`make swarm-lab`), is left up."""
    if os.geteuid() != 0:
        _need("the swarm lab needs root (a registry, packages, swarm mode on the engine)")
    facts_path = tmp_path_factory.mktemp("swarm-lab") / "facts.json"
    try:
        up_before = _run("status", "--facts", str(facts_path), timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        up_before = False
    left_up_by_hand = up_before and not _live_holders()
    HOLDERS.mkdir(parents=True, exist_ok=True)
    holder = HOLDERS / str(os.getpid())
    holder.touch()
    try:
        yield _up(WORKERS, facts_path)
    finally:
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            holder.unlink(missing_ok=True)
            keep = left_up_by_hand or _live_holders() or os.environ.get("SWARM_LAB_KEEP") == "1"
            if not keep:
                proc = subprocess.run(
                    [str(SCRIPT), "down"],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                    env={**os.environ, "SWARM_LAB_LOCKED": "1"},
                )
                assert proc.returncode == 0, f"scripts/swarm-lab.sh down failed:\n{proc.stderr}"


@pytest.fixture
def swarm_objects(swarm_lab):
    """Names for a test's services and networks; whatever was made under them is removed after
    the test (services first, then networks, which linger until their tasks are gone)."""
    api = swarm_lab.api()
    prefix = "lab-" + secrets.token_hex(3)
    yield prefix
    for svc in api.services(filters={"name": prefix}):
        api.remove_service(svc["ID"])
    deadline = time.monotonic() + 30
    for net in api.networks():
        if not net["Name"].startswith(prefix):
            continue
        while True:
            try:
                api.remove_network(net["Id"])
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def start_s3(lab: SwarmLab, buckets: tuple[str, ...], credentials: str):
    """moto's S3 server on this host's lab address (the nodes' sync helpers reach it there),
    with ``buckets``, a boto3 ``client`` and a ``credentials`` file (mode 0600) for the hub.
    The caller stops it."""
    from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server

    server = MotoS3Server(host=lab.gateway).start()
    server.client = server.boto_client()
    for bucket in buckets:
        server.client.create_bucket(Bucket=bucket)
    server.credentials = lab.workdir / credentials
    server.credentials.touch(mode=0o600)
    server.credentials.write_text(
        f"AWS_ACCESS_KEY_ID={TEST_ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={TEST_SECRET_KEY}\n"
    )
    return server


def remove_gateway(instance: str) -> None:
    """Remove a test hub's notebook gateway (a container on the manager that binds
    127.0.0.1:8002-8003): one left behind keeps the next run's gateway from starting."""
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        docker.from_env().containers.get(f"{instance}-gateway").remove(force=True)
