"""Pure builders of the per-user networks (runtime/network.py) and the job's network mode."""

from __future__ import annotations

import pytest
from docker.errors import APIError

from gpulab.names import user_network_name
from gpulab.runtime.base import WorkloadSpec
from gpulab.runtime.network import (
    explain_create_error,
    is_missing_network,
    network_for,
    user_network_config,
)
from gpulab.runtime.objects import workload_container_config

POOL_EXHAUSTED = (
    "could not find an available, non-overlapping IPv4 address pool among the defaults to "
    "assign to the network"
)


class _Response:
    def __init__(self, status: int):
        self.status_code = status
        self.reason = ""
        self.url = "http+docker://localhost/v1.41/containers/nb-1/json"


def test_names_are_escaped_and_per_user():
    assert user_network_name("gpulab", "alice") == "gpulab-net-alice"
    assert user_network_name("gpulab", "Bob.S") == "gpulab-net--42ob-2e-53"
    # users whose names escape alike never share a network
    assert user_network_name("gpulab", "a-b") != user_network_name("gpulab", "a.b")
    assert user_network_name("i", "a-net-b") != user_network_name("i-net-a", "b")


def test_config_is_a_labelled_non_internal_bridge():
    cfg = user_network_config("gpulab", "alice")
    assert cfg["name"] == "gpulab-net-alice"
    assert cfg["driver"] == "bridge" and cfg["internal"] is False
    labels = cfg["labels"]
    assert labels["org.gpulab.instance"] == "gpulab"
    assert labels["org.gpulab.kind"] == "network"
    assert labels["org.gpulab.user"] == "alice"


def test_overlays_are_attachable_and_encrypted_when_asked():
    from gpulab.runtime.network import job_network_config

    bridge = user_network_config("gpulab", "alice", "bridge", encrypted=True)
    assert "options" not in bridge and "attachable" not in bridge  # nothing to encrypt
    for make in (
        lambda e: user_network_config("gpulab", "alice", "overlay", e),
        lambda e: job_network_config("gpulab", "alice", "j1", "overlay", e),
    ):
        assert make(True)["options"] == {"encrypted": ""} and make(True)["attachable"]
        assert "options" not in make(False) and make(False)["attachable"]


def test_a_swarm_encrypts_its_overlays_unless_told_not_to():
    from gpulab.runtime import make_runtime
    from gpulab.settings import GpulabSettings

    settings = GpulabSettings(runtime="swarm", swarm_node_engine_plain=True)
    assert make_runtime(settings).encrypted is True
    settings.swarm_overlay_encryption = False
    assert make_runtime(settings).encrypted is False
    # and a node engine without a client certificate stops the service at start-up
    settings.swarm_node_engine_plain = False
    with pytest.raises(ValueError, match="swarm_node_engine_plain"):
        make_runtime(settings)
    # and every user's workloads (and git clones) on their own overlay: no shared bridge
    settings = GpulabSettings(runtime="swarm", swarm_node_engine_plain=True)
    settings.network_isolation = "none"
    with pytest.raises(ValueError, match="network_isolation = 'user'"):
        make_runtime(settings)


def test_mode_chooses_the_network():
    assert network_for("user", "gpulab", "alice") == "gpulab-net-alice"
    assert network_for("none", "gpulab", "alice") is None
    with pytest.raises(ValueError, match="user, none"):
        network_for("workload", "gpulab", "alice")


def test_pool_exhaustion_is_explained_to_the_user_and_the_operator():
    msg = explain_create_error("gpulab-net-alice", POOL_EXHAUSTED)
    assert "gpulab-net-alice" in msg and "default-address-pools" in msg
    assert POOL_EXHAUSTED in msg
    # the cause, then the operator's fix in daemon.json's own words
    assert "address pools are used up" in msg
    assert '{"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]}' in msg
    newer = explain_create_error("n", "all predefined address pools have been fully subnetted")
    assert "address pools are used up" in newer and "daemon.json" in newer
    other = explain_create_error("gpulab-net-alice", "permission denied")
    assert "default-address-pools" not in other and "permission denied" in other


def test_missing_network_is_told_apart_from_other_engine_errors():
    gone = APIError("x", _Response(404), explanation="network gpulab-net-alice not found")
    assert is_missing_network(gone)
    image = APIError("x", _Response(404), explanation="No such image: gpulab/python:3.11")
    assert not is_missing_network(image)
    assert not is_missing_network(APIError("x", _Response(500), explanation="network down"))
    # Engine 20.10's start of a container created on a network ID that went meanwhile
    said = (
        "Could not attach to network 33b48b: rpc error: code = NotFound desc = network "
        "33b48b not found"
    )
    assert is_missing_network(APIError("x", _Response(500), explanation=said))
    assert not is_missing_network(ValueError("network not found"))


@pytest.mark.parametrize("owner", ["alice", None])
def test_job_joins_only_its_owners_network(owner):
    spec = WorkloadSpec(name="gpulab-job-1", image="img", command=["true"], network_owner=owner)
    cfg = workload_container_config(spec, "device_request", "/r.sh")
    host = cfg["host_config"]
    if owner:
        # the backend puts the network's ID there (runtime/docker.py): only that network
        assert host["network_mode"] == owner
    else:
        assert "network_mode" not in host  # the engine's default bridge, as before
    assert cfg["command"][:2] == ["/bin/sh", "/opt/gpulab/run.sh"]
    assert host["binds"] == ["/r.sh:/opt/gpulab/run.sh:ro"]


@pytest.mark.parametrize("owner", ["alice", None])
def test_a_notebook_s_port_is_published_only_off_its_owners_network(owner):
    """A notebook on its owner's bridge is reached at its address there; on the default
    bridge (network_isolation 'none') its port is published on the host's loopback only."""
    spec = WorkloadSpec(
        name="nb",
        image="img",
        command=["jupyterhub-singleuser"],
        network_owner=owner,
        runner=False,
        ports=(8888,),
    )
    cfg = workload_container_config(spec, "device_request", "/r.sh")
    host = cfg["host_config"]
    assert cfg["ports"] == [8888] and cfg["command"] == ["jupyterhub-singleuser"]
    assert host["binds"] == []  # no runner, no volume: nothing of the host
    if owner:
        assert "port_bindings" not in host
    else:
        assert host["port_bindings"] == {8888: ("127.0.0.1",)}


def test_an_overlay_made_without_encryption_is_named_in_a_warning(caplog):
    """An overlay's options cannot change: one made before encryption was on is reused (its
    workloads are on it) and the operator is told it stays in clear until it is made again."""
    from gpulab.names import user_network_name
    from gpulab.runtime.network import ensure_user_network

    name = user_network_name("gpulab", "olda", "overlay")

    class Engine:
        def networks(self, names):
            labels = {"org.gpulab.instance": "gpulab"}
            return [{"Name": name, "Id": "n1", "Labels": labels, "Options": {}}]

    with caplog.at_level("WARNING", logger="gpulab.runtime.network"):
        assert ensure_user_network(Engine(), "gpulab", "olda", "overlay", encrypted=True) == "n1"
        ensure_user_network(Engine(), "gpulab", "olda", "overlay", encrypted=True)
    warned = [r.getMessage() for r in caplog.records if "without encryption" in r.getMessage()]
    assert warned == [warned[0]] and name in warned[0]  # once
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpulab.runtime.network"):
        ensure_user_network(Engine(), "gpulab", "olda", "overlay", encrypted=False)
    assert not caplog.records


def test_an_engine_error_comes_up_as_gpulabs_own_with_its_status_and_words():
    """What a backend's call raises above runtime/ is gpulab's EngineError (or the kind
    asked for), never an SDK class: the message, the engine's status and its own words are
    fields of gpulab's class."""
    from docker.errors import DockerException, NotFound

    from gpulab.runtime.base import EngineError, WorkloadRefused
    from gpulab.runtime.engine import engine_error

    sdk = NotFound("x", _Response(404), explanation="No such container: nb-1")
    e = engine_error(sdk)
    assert type(e) is EngineError and not isinstance(e, DockerException)
    assert e.status == 404 and e.not_found and e.detail == "No such container: nb-1"
    assert str(e) == str(sdk)
    refused = engine_error(APIError("x", _Response(400), explanation="no device"), WorkloadRefused)
    assert type(refused) is WorkloadRefused and refused.status == 400 and not refused.not_found
    assert refused.detail == "no device"
    down = engine_error(DockerException("Error while fetching server API version"))
    assert down.status is None and down.detail == str(down)
    assert EngineError("plain").detail == "plain"


def test_the_backends_call_the_engine_through_their_engine_client():
    """Every blocking SDK call of a Docker-API backend goes through its EngineClient (where the
    SDK's errors become gpulab's): none through Runtime.run / run_exec directly."""
    import ast
    from pathlib import Path

    runtime_dir = Path(__file__).resolve().parents[2] / "src" / "gpulab" / "runtime"
    found = []
    for path in sorted(runtime_dir.glob("*.py")):
        if path.name in ("base.py", "engine.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run", "run_exec")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_a_known_network_id_is_reused_for_a_while_and_forgotten_on_demand(monkeypatch):
    """16 jobs of one user starting at once no longer each list the engine's networks: an
    ID this process found is given again for KNOWN_FOR seconds to a caller that may reuse it
    (the create path, which asks again when the engine says it is gone)."""
    from gpulab.runtime import network as net

    class Client:
        base_url = "http+docker://test-reuse"

        def __init__(self):
            self.listed = 0

        def networks(self, names=None, filters=None):
            self.listed += 1
            labels = {"org.gpulab.instance": "i"}
            return [{"Name": names[0], "Id": f"id{self.listed}", "Labels": labels}]

    clock = [100.0]
    monkeypatch.setattr(net.time, "monotonic", lambda: clock[0])
    client = Client()
    first = net.ensure_user_network(client, "i", "ann", reuse=True)
    assert client.listed == 1
    assert net.ensure_user_network(client, "i", "ann", reuse=True) == first
    assert client.listed == 1
    assert net.ensure_user_network(client, "i", "ann") != first  # a caller that may not
    assert client.listed == 2
    clock[0] += net.KNOWN_FOR
    assert net.ensure_user_network(client, "i", "ann", reuse=True) == "id3"  # too old
    net.forget_user_network(client, "i", "ann")
    assert net.ensure_user_network(client, "i", "ann", reuse=True) == "id4"
    assert net.ensure_user_network(client, "i", "bob", reuse=True) == "id5"  # per user
