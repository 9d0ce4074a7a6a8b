"""The nodes' engines on a Swarm (runtime/swarm_nodes.py NodeEngines): a node's engine is
given a few seconds to accept a connection; one that gave no answer is not asked again for a
while (each call fails at once instead of waiting out its time-out); a node down past a grace
period counts as gone, so that what it held is recorded as left there and removals end."""

from __future__ import annotations

import logging

import pytest
import requests
from docker.errors import APIError

from gpulab.runtime import swarm_nodes
from gpulab.runtime.base import EngineError, EngineUnreachable
from gpulab.runtime.swarm import SwarmRuntime
from gpulab.runtime.swarm_nodes import (
    CONNECT_TIMEOUT,
    DOWN_GRACE,
    SILENT_FOR,
    NodeEngines,
    NodeMissing,
)

from ..conftest import run_async


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(node_id, hostname, addr, state="ready", updated=""):
    return {
        "ID": node_id,
        "UpdatedAt": updated,
        "Status": {"Addr": addr, "State": state},
        "Description": {"Hostname": hostname},
    }


class Manager:
    base_url = "http://manager:2375"

    def __init__(self, *nodes):
        self.listed = list(nodes)

    def nodes(self):
        return self.listed


def engines_at(clock: Clock, wall: float = 1.8e9) -> NodeEngines:
    engines = NodeEngines("tcp://{address}:2375", plain=True, clock=clock, wall=lambda: wall)
    engines.client = lambda url: engines._check_silent(url) or f"client of {url}"
    return engines


def test_a_node_client_waits_seconds_for_a_connection_and_a_minute_for_an_answer(monkeypatch):
    made = {}

    class Client:
        def __init__(self, **kw):
            made.update(kw)

    monkeypatch.setattr(swarm_nodes, "NodeClient", Client)
    NodeEngines("tcp://{address}:2375", plain=True).client("tcp://10.0.0.6:2375")
    assert made["timeout"] == (CONNECT_TIMEOUT, 60) and CONNECT_TIMEOUT <= 5


def test_an_engine_that_gave_no_answer_is_not_asked_again_for_a_while():
    clock = Clock()
    engines = engines_at(clock)
    url = "tcp://10.0.0.6:2375"
    with pytest.raises(EngineUnreachable), engines.calling(url):
        raise requests.ConnectionError("connect timeout")
    # the next calls fail at once, without a connection (of_node, a listing's client())
    manager = Manager(node("n", "gpu-a", "10.0.0.6"))
    for _ in range(3):
        with pytest.raises(EngineUnreachable, match="gave no answer 0 s ago"):
            engines.of_node(manager, "gpu-a")
    with pytest.raises(EngineUnreachable, match="not asked again"):
        NodeEngines.client(engines, url)
    clock.now += SILENT_FOR
    assert engines.of_node(manager, "gpu-a") == (f"client of {url}", url)  # asked again
    # an engine that answers, even with a refusal, is not silent
    with pytest.raises(EngineUnreachable), engines.calling(url):
        raise requests.ConnectionError("refused")
    clock.now += SILENT_FOR
    with pytest.raises(EngineError, match="409"), engines.calling(url):
        raise APIError("in use", response=_response(409))
    assert engines._silent == {}


def _response(status: int) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    return r


def test_a_node_down_past_its_grace_counts_as_gone():
    clock = Clock()
    wall = 1.8e9
    engines = engines_at(clock, wall)
    long_ago = "2026-01-01T00:00:00Z"  # the manager's time of its change: long before `wall`
    manager = Manager(
        node("a", "gpu-a", "10.0.0.5", "down", long_ago), node("b", "gpu-b", "10.0.0.7", "down")
    )
    with pytest.raises(NodeMissing, match="node gpu-a has been down for .* it counts as gone"):
        engines.of_node(manager, "gpu-a")
    with pytest.raises(EngineUnreachable, match="node gpu-b is down"):
        engines.of_node(manager, "gpu-b")
    clock.now += DOWN_GRACE - 1
    with pytest.raises(EngineUnreachable, match="node gpu-b is down"):
        engines.of_node(manager, "gpu-b")
    clock.now += 1
    with pytest.raises(NodeMissing, match="counts as gone"):
        engines.of_node(manager, "gpu-b")
    # back up: its engine is asked again, and a later fall is timed afresh
    manager.listed[1] = node("b", "gpu-b", "10.0.0.7")
    assert engines.of_node(manager, "gpu-b")[1] == "tcp://10.0.0.7:2375"
    manager.listed[1] = node("b", "gpu-b", "10.0.0.7", "down")
    with pytest.raises(EngineUnreachable, match="node gpu-b is down"):
        engines.of_node(manager, "gpu-b")


def test_a_volume_on_a_node_gone_is_recorded_as_left_there(caplog):
    """remove_volume on a node down past its grace: False (none there to remove, as for a
    node that left), and a WARNING naming the volume and the node; before the grace: the
    engine is unreachable (the caller tries again)."""
    clock = Clock()
    manager = Manager(node("b", "gpu-b", "10.0.0.7", "down"))
    rt = SwarmRuntime(lambda: manager, node_engine_plain=True)
    rt.node_engines.clock = clock
    with pytest.raises(EngineUnreachable):
        run_async(rt.remove_volume("gl-job-1-v-data", "gpu-b"))
    clock.now += DOWN_GRACE
    with caplog.at_level(logging.WARNING, logger="gpulab.runtime.swarm"):
        assert run_async(rt.remove_volume("gl-job-1-v-data", "gpu-b")) is False
    assert "volume gl-job-1-v-data is left on node gpu-b" in caplog.text
    assert run_async(rt.volumes_named("gl-", "gpu-b")) == []  # gone: none listed


def test_nodes_that_share_a_hostname_take_no_workload(caplog):
    """Two nodes not down with one hostname: placement by hostname would match either, so
    neither is active (an ERROR says so, once); a node down beside one up (it left and
    joined again) is no clash."""
    from gpulab.runtime.swarm import hostnames_shared

    def listed(node_id, hostname, state="ready"):
        return {**node(node_id, hostname, "10.0.0.9", state), "Spec": {"Availability": "active"}}

    manager = Manager(
        listed("m", "hub"),
        listed("x1", "gpu-x"),
        listed("x2", "gpu-x"),
        listed("y1", "gpu-y", "down"),
        listed("y2", "gpu-y"),
    )
    manager.info = lambda: {"Swarm": {"NodeID": "m"}}
    rt = SwarmRuntime(lambda: manager, node_engine_plain=True)
    with caplog.at_level(logging.ERROR, logger="gpulab.runtime.swarm"):
        nodes = run_async(rt.nodes())
        run_async(rt.nodes())
    assert {n.id: n.active for n in nodes} == {
        "m": False,
        "x1": False,
        "x2": False,
        "y1": True,
        "y2": True,
    }
    said = [r.getMessage() for r in caplog.records if "share the hostname" in r.getMessage()]
    assert said == [
        "nodes x1, x2 share the hostname gpu-x: gpulab places workloads by hostname, so "
        "neither takes any until one is removed (docker node rm) or renamed"
    ]
    assert hostnames_shared(manager.nodes()) == {"gpu-x"}
