"""Exec and shell, the parts without an engine: request parsing, what events show, the
shell's control messages and origin check, the exec stream's framing, the shell's bounded input
queue, the nodes' engine URLs."""

from __future__ import annotations

import struct
import threading
import time
from types import SimpleNamespace

import pytest

from gpulab.jobs import exec as jobs_exec
from gpulab.jobs.exec import DEFAULT_EXEC_TIMEOUT, command_text, parse_exec
from gpulab.jobs.refusals import Busy, Conflict, Invalid, NotFound
from gpulab.runtime.base import WorkloadSpec
from gpulab.runtime.execution import MAX_PENDING_INPUT, InputQueue, _Collector
from gpulab.runtime.swarm_nodes import NodeEngines, check_template, node_tls
from gpulab.service.api.exec import _resize, same_host

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime, FakeWorkload


def test_parse_exec_takes_a_list_or_a_shell_line():
    assert parse_exec({"command": ["python", "-V"]}) == (["python", "-V"], DEFAULT_EXEC_TIMEOUT)
    assert parse_exec({"command": "echo hi | wc", "timeout": 5}) == (
        ["sh", "-c", "echo hi | wc"],
        5.0,
    )
    assert parse_exec({"command": ["true"], "timeout": None})[1] == DEFAULT_EXEC_TIMEOUT


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "command"),
        ({"command": "\u3000\ufeff"}, "command"),
        ({"command": ["", "x"]}, "command"),
        ({"command": "x" * 70_000}, "command"),
        ({"command": ["a" * 40_000, "b" * 40_000]}, "command"),
        ({"command": ["true"], "timeout": float("nan")}, "timeout"),
        ({"command": ["true"], "timeout": -1}, "timeout"),
        ({"command": ["true"], "user": "0:0"}, "user"),
    ],
)
def test_parse_exec_refuses_with_the_field(body, field):
    with pytest.raises(Invalid) as e:
        parse_exec(body)
    assert e.value.status == 400 and e.value.field == field


def test_command_text_is_one_capped_line():
    assert command_text(["python", "-c", "print(1)"]) == "python -c 'print(1)'"
    assert command_text("a\n  b") == "a b"
    long = command_text("x" * 500)
    assert len(long) == 200 and long.endswith("…")


def test_only_resize_is_a_control_message():
    assert _resize('{"resize": [120, 40]}') == (120, 40)
    for bad in ("ls", "[]", '{"resize": [0, 40]}', '{"resize": [1.5, 2]}', '{"resize": [1]}'):
        assert _resize(bad) is None


def test_same_host_only():
    assert same_host("https://hub.example:8443", "hub.example:8443")
    assert same_host("http://HUB.example", "hub.example")
    assert not same_host("https://hub.example.evil", "hub.example")
    assert not same_host("null", "hub.example")
    assert not same_host("https://hub.example", "")


def _frame(kind: int, data: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + struct.pack(">I", len(data)) + data


def test_the_collector_takes_the_pid_line_out_and_caps_the_output():
    stream = _frame(1, b"12") + _frame(1, b"3\nout") + _frame(2, b"err") + _frame(1, b"more")
    found = _Collector(cap=8)
    for i in range(0, len(stream), 5):  # frames split anywhere
        found.feed(stream[i : i + 5])
    assert found.pid == 123
    assert bytes(found.out) == b"outerrmo" and found.truncated


def test_node_engine_urls():
    engines = NodeEngines("tcp://{address}:2375", plain=True)
    node = {"ID": "n1", "Status": {"Addr": "10.0.0.5"}, "Description": {"Hostname": "gpu-a"}}
    assert engines.url(node) == "tcp://10.0.0.5:2375"
    manager = {
        "ID": "n0",
        "Status": {"Addr": "0.0.0.0"},
        "ManagerStatus": {"Addr": "10.0.0.1:2377"},
    }
    assert engines.url(manager) == "tcp://10.0.0.1:2375"
    assert NodeEngines("ssh://admin@{hostname}").url(node) == "ssh://admin@gpu-a"
    with pytest.raises(ValueError, match="fields are"):
        check_template("tcp://{ip}:2376")
    with pytest.raises(ValueError, match="URL"):
        check_template("{address}:2376")


def test_a_node_s_engine_is_found_by_the_hostname_gpulab_places_by():
    """NodeEngines.of_node: the node of that hostname (of two, the one that is not down: it
    left and joined again); none in the cluster is NodeMissing; one the manager reports down
    is EngineUnreachable without a connection; workload_nodes leaves out the hub's own node
    and those that are down."""
    from gpulab.runtime.base import EngineUnreachable
    from gpulab.runtime.swarm_nodes import NodeMissing

    def node(node_id, hostname, addr, state="ready"):
        return {
            "ID": node_id,
            "Status": {"Addr": addr, "State": state},
            "Description": {"Hostname": hostname},
        }

    class Manager:
        def nodes(self):
            return [
                node("m", "hub", "10.0.0.1"),
                node("old", "gpu-a", "10.0.0.5", "down"),
                node("new", "gpu-a", "10.0.0.6"),
                node("b", "gpu-b", "10.0.0.7", "down"),
            ]

    engines = NodeEngines("tcp://{address}:2375", plain=True)
    made = []
    engines.client = lambda url: made.append(url) or f"client of {url}"
    assert engines.of_node(Manager(), "gpu-a") == ("client of tcp://10.0.0.6:2375", made[0])
    with pytest.raises(NodeMissing, match="node gpu-c is not in the cluster"):
        engines.of_node(Manager(), "gpu-c")
    with pytest.raises(NodeMissing):
        engines.of_node(Manager(), "")
    with pytest.raises(EngineUnreachable, match="node gpu-b is down"):
        engines.of_node(Manager(), "gpu-b")
    assert made == ["tcp://10.0.0.6:2375"]  # the node down was not connected to
    assert engines.workload_nodes(Manager(), "m") == [("gpu-a", "tcp://10.0.0.6:2375")]


def test_node_tls(tmp_path):
    assert node_tls("", "", "") is None
    with pytest.raises(ValueError, match="together"):
        node_tls("", "/cert.pem", "")
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_text("-")
    tls = node_tls(str(ca), str(cert), str(key))
    assert tls.verify is True and tls.ca_cert == str(ca) and tls.cert == (str(cert), str(key))
    assert node_tls("", str(cert), str(key)).ca_cert is None  # verified by the system CAs


def _writer(queue: InputQueue, data: bytes) -> tuple[threading.Thread, list[bool]]:
    """A thread putting ``data`` into ``queue`` (as the shell's WebSocket handler does);
    the list gets put's answer once it returns."""
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(queue.put(data)), daemon=True)
    thread.start()
    return thread, done


def _drain(queue: InputQueue, most: int) -> bytes:
    """Take up to ``most`` bytes off the queue, as the session's reader sends them."""
    out = b""
    while len(out) < most and (head := queue.head()) is not None:
        n = min(len(head), most - len(out))
        out += head[:n]
        queue.sent(n)
    return out


def test_the_shell_input_is_bounded_and_its_writer_waits_for_room():
    assert 64 * 1024 <= MAX_PENDING_INPUT <= 1024 * 1024  # the documented bound
    queue = InputQueue(cap=1000, piece=100)
    assert queue.put(b"a" * 1000) and len(queue) == 1000  # room for all of it: no wait
    writer, done = _writer(queue, b"b" * 250)
    writer.join(0.5)
    assert writer.is_alive() and not done and len(queue) == 1000  # full: it waits, drops nothing
    assert _drain(queue, 150) == b"a" * 150  # a piece and a half went: room for one piece
    time.sleep(0.2)
    assert writer.is_alive() and len(queue) == 950  # one piece of b in, the rest waits
    assert _drain(queue, 1000) == b"a" * 850 + b"b" * 100
    writer.join(5)
    assert done == [True] and _drain(queue, 1000) == b"b" * 150 and len(queue) == 0


def test_a_message_larger_than_the_queue_goes_through_in_order_within_the_bound():
    queue = InputQueue(cap=4096, piece=1000)
    data = bytes(range(256)) * 100  # 25,600 bytes: six times the queue
    writer, done = _writer(queue, data)
    got, most = b"", 0
    deadline = time.monotonic() + 10
    while len(got) < len(data) and time.monotonic() < deadline:
        most = max(most, len(queue))
        got += _drain(queue, 700)  # a slow reader: less than a piece at a time
        time.sleep(0.001)
    writer.join(5)
    assert got == data and done == [True]
    assert 0 < most <= 4096


def test_closing_wakes_a_waiting_writer():
    queue = InputQueue(cap=1000, piece=100)
    queue.put(b"x" * 1000)
    writers = [_writer(queue, b"y" * 500) for _ in range(3)]
    time.sleep(0.2)
    assert all(w.is_alive() for w, _ in writers)
    queue.close()
    for w, done in writers:
        w.join(5)
        assert not w.is_alive() and done == [False]  # woken, told its input went nowhere
    assert queue.head() is None and len(queue) == 0
    assert queue.put(b"late") is False  # a closed session takes nothing, without waiting


def test_a_node_engine_without_a_client_certificate_is_refused_unless_allowed(tmp_path):
    from docker.tls import TLSConfig

    for template in ("tcp://{address}:2376", "http://{address}:2375", "https://{hostname}:2376"):
        with pytest.raises(ValueError, match="swarm_node_engine_plain = True") as refused:
            NodeEngines(template)
        assert "swarm_node_tls_cert" in str(refused.value)
        # a CA alone verifies the node, but the node cannot know who calls: refused too
        with pytest.raises(ValueError, match="without a TLS client certificate"):
            NodeEngines(template, TLSConfig(ca_cert=__file__, verify=True))
        NodeEngines(template, plain=True)  # the lab's explicit choice
    cert = TLSConfig(client_cert=(__file__, __file__), ca_cert=__file__, verify=True)
    assert NodeEngines("tcp://{address}:2376", cert).tls is cert
    # a socket or ssh carries its own access control
    NodeEngines("unix:///var/run/docker.sock")
    NodeEngines("ssh://admin@{hostname}")


class _Notes:
    """A job's records as the exec rules use them: the events noted."""

    def __init__(self):
        self.events: list[tuple[str, str, str, str]] = []

    def note(self, job_id, kind, reason, message):
        self.events.append((job_id, kind, reason, message))


def _sup(*names: str) -> SimpleNamespace:
    rt = FakeRuntime()
    for name in names:
        rt.workloads[name] = FakeWorkload(WorkloadSpec(name=name, image="i", command=[]))
    return SimpleNamespace(
        runtime=rt, records=_Notes(), container_name=lambda job_id: f"c-{job_id}"
    )


def _job(state="RUNNING", workers=1) -> dict:
    return {"id": "j1", "state": state, "spec": {"workers": workers}}


def test_an_exec_runs_in_the_running_job_and_is_recorded_first():
    sup = _sup("c-j1", "c-j1-r1")
    sup.runtime.script_exec("c-j1-r1", 3, b"out\n")
    got = run_async(jobs_exec.run(sup, _job(workers=2), "1", b'{"command": "echo hi"}', "ann"))
    assert got == {"exit_code": 3, "output": "out\n", "truncated": False, "timed_out": False}
    assert sup.records.events == [("j1", "exec", "EXEC", "exec by ann (rank 1): echo hi")]
    assert jobs_exec.EXECS.open == {}


@pytest.mark.parametrize(
    "job, rank, body, kind, status",
    [
        (_job("DONE"), "9", b"not json", Conflict, 409),  # the job's state first
        (_job(), "1", b"not json", NotFound, 404),  # then the rank
        (_job(), "x", b"{}", Invalid, 400),
        (_job(), "0", b"[]", Invalid, 400),  # then the body
        (_job(), "0", b'{"command": []}', Invalid, 400),
    ],
)
def test_an_exec_refused_says_why_in_order(job, rank, body, kind, status):
    sup = _sup("c-j1")
    with pytest.raises(kind) as e:
        run_async(jobs_exec.run(sup, job, rank, body, "ann"))
    assert e.value.status == status and sup.records.events == []


def test_execs_and_shells_are_capped_per_user_and_gone_is_a_409():
    sup = _sup("c-j1")
    counts = jobs_exec.OpenCounts(1, 2, "execs")
    with counts.held("ann"), pytest.raises(Busy, match="you have 1 execs open"), counts.held("ann"):
        pass
    with (
        counts.held("ann"),
        counts.held("bob"),
        pytest.raises(Busy, match="service has 2"),
        counts.held("cid"),
    ):
        pass
    assert counts.open == {}
    sup.runtime.workloads["c-j1"].running = False
    with pytest.raises(Conflict, match="no longer running"):
        run_async(jobs_exec.run(sup, _job(), "0", b'{"command": "id"}', "ann"))
    assert jobs_exec.EXECS.open == {}


def test_a_shell_checks_the_job_then_the_callers_handshake_then_opens():
    sup = _sup("c-j1")
    calls = []

    def handshake():
        calls.append("handshake")
        return 100, 30

    with pytest.raises(Conflict):
        run_async(_open_shell(sup, _job("FAILED"), handshake))
    assert calls == []  # the job's state decides first

    async def use():
        async with jobs_exec.shell(sup, _job(), "0", "ann", handshake) as session:
            assert jobs_exec.SHELLS.open == {"ann": 1}
            return session

    session = run_async(use())
    assert calls == ["handshake"] and jobs_exec.SHELLS.open == {}
    assert session.read() == b""  # closed at the end of the block
    assert sup.records.events == [("j1", "shell", "SHELL", "shell opened by ann")]


async def _open_shell(sup, job, handshake):
    async with jobs_exec.shell(sup, job, "0", "ann", handshake):
        pass
