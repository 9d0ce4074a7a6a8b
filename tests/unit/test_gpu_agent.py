"""The GPU agent of a Swarm's nodes (gpulab.gpus.agent) and how the Swarm backend runs and reads
it: the line an agent prints and its parse, which readings count (each node's newest, fresh
enough; a stale or missing one is unknown), the agent's service as data, and SwarmRuntime's
making, updating, removing and reading of it against a stand-in manager."""

from __future__ import annotations

import json

import pytest
from docker.errors import NotFound

from gpulab.gpus import agent
from gpulab.gpus.usage import DeviceUsage, busiest, keyed, usage_of
from gpulab.runtime.swarm import SwarmRuntime
from gpulab.runtime.swarm_specs import L_SPEC, gpu_agent_spec

from ..conftest import run_async

GIB = 1024**3
A0 = DeviceUsage("0", 87, 3 * GIB, 80 * GIB, "GPU-aaa")
A1 = DeviceUsage("1", 0, 0, 80 * GIB, "GPU-bbb")
MIG = DeviceUsage("MIG-ccc", None, GIB, 10 * GIB)


def test_a_reading_goes_through_its_line_unchanged():
    line = agent.reading_line("gpu-a", 1000.5, [A0, A1, MIG])
    assert "\n" not in line
    got = agent.parse_line(line)
    assert got == agent.Reading("gpu-a", 1000.5, (A0, A1, MIG), "")
    # as the engine may hand it: bytes, after a timestamp
    assert agent.parse_line(b"2026-11-26T19:00:00.000Z " + line.encode()) == got


@pytest.mark.parametrize(
    "line",
    [
        "",
        "WARNING GPU activity cannot be read: nvidia-ml-py is not installed",
        '{"node": "gpu-a", "time": 1, "devices": []}',  # not an agent's (no mark)
        '{"gpulab-gpu-agent": 1, "node": "", "time": 1, "devices": []}',  # no node
        '{"gpulab-gpu-agent": 1, "node": "a", "time": "soon", "devices": []}',
        '{"gpulab-gpu-agent": 1, "node": "a", "time": 1, "devices": [{"id": "0"}]}',
        '{"gpulab-gpu-agent": 1, "node": "a", "time": 1, "devices": [',  # cut short
        "[1, 2]",
    ],
)
def test_anything_else_in_the_output_is_no_reading(line):
    assert agent.parse_line(line) is None


def test_each_nodes_newest_fresh_reading_counts_and_a_stale_or_missing_one_is_unknown():
    now, age = 10_000.0, agent.max_age(10)
    assert age == 40
    lines = [
        agent.reading_line("a", now - 50, [DeviceUsage("0", 100, 0, 1)]),  # older, then newer
        agent.reading_line("a", now - 5, [A0]),
        "some log line",
        agent.reading_line("b", now - 41, [A1]),  # stale: b is unknown
        agent.reading_line("c", now - 1, [], "no NVIDIA driver found"),  # read nothing
        agent.reading_line("d", now + 120, [A0]),  # a clock gone wrong
        agent.reading_line("e", now - 40, [MIG]),  # at the bound: still counts
    ]
    got = agent.latest_readings(reversed(lines), now, age)
    assert got == {"a": [A0], "e": [MIG]}
    # on a cluster, the ledger's names: node/id and node/UUID
    named = keyed(got)
    assert [u.id for u in named] == ["a/0", "e/MIG-ccc"]
    assert busiest(usage_of(named, ["a/GPU-aaa"])) == 87
    assert usage_of(named, ["b/1", "0", "e/0"]) == []  # unknown node, one host's name, no such
    assert keyed({"": [A0]}) == [A0]  # one engine: as read


def test_the_agent_prints_one_reading_of_its_node(monkeypatch, capsys):
    class Reader:
        problem = ""

        def read(self):
            return [A0]

    monkeypatch.setattr(agent, "NvmlUsage", Reader)
    monkeypatch.setenv("GPULAB_NODE", "gpu-a")
    agent.main(["--once"])
    got = agent.parse_line(capsys.readouterr().out)
    assert (got.node, got.devices, got.problem) == ("gpu-a", (A0,), "")


def test_the_agents_service_as_data():
    body = gpu_agent_spec("lab-gpu-agent", "reg:5000/gpulab/sync:0.1.0", 10, "lab", "MGR", "0.1.0")
    assert body["Name"] == "lab-gpu-agent"
    assert body["Mode"] == {"Global": {}}  # a task on every node...
    task = body["TaskTemplate"]
    assert task["Placement"]["Constraints"] == ["node.id!=MGR"]  # ...but the service's own
    c = task["ContainerSpec"]
    assert c["Image"] == "reg:5000/gpulab/sync:0.1.0"
    assert c["Command"] == ["python", "-m", "gpulab.gpus.agent"]
    assert c["Args"] == ["--interval", "10"]
    # every GPU of its node, for reading only (NVML: the utility capability, no compute)
    assert sorted(c["Env"]) == [
        "GPULAB_NODE={{.Node.Hostname}}",
        "NVIDIA_DRIVER_CAPABILITIES=utility",
        "NVIDIA_VISIBLE_DEVICES=all",
    ]
    # unprivileged: nobody, read-only root, no capability, no mount, small limits
    assert (c["User"], c["ReadOnly"], c["CapabilityDrop"], c["Mounts"]) == (
        "65534:65534",
        True,
        ["ALL"],
        [],
    )
    assert task["Resources"]["Limits"] == {
        "NanoCPUs": 200_000_000,
        "MemoryBytes": 128 * 1024**2,
        "Pids": 32,
    }
    assert task["RestartPolicy"]["Condition"] == "any"
    assert body["Labels"]["org.gpulab.instance"] == "lab"
    assert body["Labels"]["org.gpulab.kind"] == "gpu-agent"
    # the digest of what was asked: the same spec, the same digest; any change, another
    again = gpu_agent_spec("lab-gpu-agent", "reg:5000/gpulab/sync:0.1.0", 10, "lab", "MGR", "0.1.0")
    other = gpu_agent_spec("lab-gpu-agent", "reg:5000/gpulab/sync:0.2.0", 10, "lab", "MGR", "0.1.0")
    assert again == body and other["Labels"][L_SPEC] != body["Labels"][L_SPEC]


class Response:
    def __init__(self, status: int = 200, body=None, chunks=()):
        self.status_code, self.body, self.chunks, self.closed = status, body, list(chunks), False

    def close(self):
        self.closed = True


class Manager:
    """A Swarm manager's low-level client, as the GPU agent's calls use it: its services by
    name, created and updated (each call recorded), and the agent service's logs."""

    base_url = "http://manager:2375"

    def __init__(self):
        self.services: dict[str, dict] = {}
        self.posts: list[tuple[str, dict, dict | None]] = []
        self.removed: list[str] = []
        self.log_chunks: list[bytes] = []
        self.log_asks: list[dict] = []

    def info(self):
        return {"Swarm": {"NodeID": "MGR"}}

    def inspect_service(self, name):
        if name not in self.services:
            raise NotFound("no such service")
        return self.services[name]

    def remove_service(self, sid):
        self.removed.append(sid)
        self.services = {n: s for n, s in self.services.items() if s["ID"] != sid}

    def _url(self, path, *args):
        return path.format(*args)

    def _post_json(self, url, data, params=None):
        self.posts.append((url, data, params))
        name = data["Name"]
        version = (self.services.get(name) or {"Version": {"Index": 0}})["Version"]["Index"]
        self.services[name] = {"ID": "svc-" + name, "Spec": data, "Version": {"Index": version + 1}}
        return Response(body={"ID": "svc-" + name})

    def _result(self, res, json=False):
        return res.body

    def _raise_for_status(self, res):
        assert res.status_code < 400

    def _get(self, url, params=None, stream=False, timeout=None):
        self.log_asks.append({"url": url, **params, "timeout": timeout})
        name = url.split("/")[2]
        if name not in self.services:
            return Response(404)
        return Response(chunks=self.log_chunks)

    def _multiplexed_response_stream_helper(self, res):
        yield from res.chunks


def swarm(manager, image="gpulab/sync:0.1.0", interval=10.0) -> SwarmRuntime:
    return SwarmRuntime(
        lambda: manager,
        registry="reg:5000",
        node_engine_plain=True,
        gpu_agent_image=image,
        gpu_agent_interval=interval,
    )


def test_the_service_makes_the_agent_once_updates_it_when_asked_otherwise_and_removes_it():
    mgr = Manager()
    run_async(swarm(mgr).watch_gpus("lab"))
    assert [(url, data["Name"]) for url, data, _ in mgr.posts] == [
        ("/services/create", "lab-gpu-agent")
    ]
    made = mgr.services["lab-gpu-agent"]["Spec"]
    assert made["TaskTemplate"]["ContainerSpec"]["Image"] == "reg:5000/gpulab/sync:0.1.0"
    assert made["TaskTemplate"]["Placement"]["Constraints"] == ["node.id!=MGR"]
    # a restart with the same settings changes nothing
    run_async(swarm(mgr).watch_gpus("lab"))
    assert len(mgr.posts) == 1
    # another image: an update of the service, at the version read
    run_async(swarm(mgr, image="gpulab/sync:0.2.0").watch_gpus("lab"))
    url, data, params = mgr.posts[-1]
    assert (url, params) == ("/services/svc-lab-gpu-agent/update", {"version": 1})
    assert data["TaskTemplate"]["ContainerSpec"]["Image"] == "reg:5000/gpulab/sync:0.2.0"
    # turned off (swarm_gpu_agent = False): removed
    run_async(swarm(mgr, image="").watch_gpus("lab"))
    assert mgr.removed == ["svc-lab-gpu-agent"] and mgr.services == {}


def _lines(*readings) -> bytes:
    return b"".join(agent.reading_line(*r).encode() + b"\n" for r in readings)


def test_the_nodes_readings_come_from_the_agents_last_lines_fresh_ones_only(monkeypatch):
    import time

    mgr = Manager()
    rt = swarm(mgr, interval=2.0)
    assert run_async(rt.gpu_usage()) == {}  # nobody asked for the agent (the hub): nothing
    run_async(rt.watch_gpus("lab"))
    now = time.time()
    mgr.log_chunks = [
        _lines(("gpu-a", now - 3, [A0])),
        b"a line the agent's library wrote\n" + _lines(("gpu-b", now - 60, [A1])),
    ]
    assert run_async(rt.gpu_usage()) == {"gpu-a": [A0]}  # gpu-b's is stale: unknown
    ask = mgr.log_asks[-1]
    assert (ask["url"], ask["tail"], ask["follow"], ask["timeout"]) == (
        "/services/lab-gpu-agent/logs",
        str(agent.TAIL),
        False,
        5.0,
    )
    # read at most every interval/2 (here 1 s): callers in between share the last reading
    assert run_async(rt.gpu_usage()) == {"gpu-a": [A0]} and len(mgr.log_asks) == 1
    # the agent removed behind gpulab's back: nothing read, and it is made again (at most
    # once a minute)
    mgr.services.clear()
    monkeypatch.setattr(rt, "_usage", (-1e9, {}))
    monkeypatch.setattr(rt, "_agent_checked", -1e9)
    assert run_async(rt.gpu_usage()) == {}
    assert "lab-gpu-agent" in mgr.services


def test_an_agents_output_cut_short_keeps_what_came():
    mgr = Manager()
    rt = swarm(mgr)
    run_async(rt.watch_gpus("lab"))
    import time

    def chunks(res):
        yield _lines(("gpu-a", time.time(), [A0]))
        raise TimeoutError("read timed out")  # a node that does not answer

    mgr._multiplexed_response_stream_helper = chunks
    assert run_async(rt.gpu_usage()) == {"gpu-a": [A0]}


def test_one_engine_reads_its_own_gpus_and_none_without_any(monkeypatch):
    from gpulab.gpus.inventory import GpuDevice, Inventory
    from gpulab.runtime import docker as docker_backend

    class Reader:
        def read(self):
            return [A0]

    monkeypatch.setattr(docker_backend, "NvmlUsage", Reader)
    one = docker_backend.DockerRuntime(inventory=Inventory((GpuDevice("0"),)))
    assert run_async(one.gpu_usage()) == {"": [A0]}
    assert run_async(docker_backend.DockerRuntime().gpu_usage()) == {}
    assert json.loads(agent.reading_line("n", 1, [A0]))[agent.MARK] == 1
