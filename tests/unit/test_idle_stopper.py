"""The idle stop's compare-and-set and its races, on gpulab's real records (SQLite) and a
stand-in for the hub's REST API (the real hub: tests/integration/test_notebook_idle.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpulab.db import Database
from gpulab.lifecycle import NotebookState, utcnow
from gpulab.notebooks.records import NotebookRecords
from gpulab.resources import Limits, Resources
from gpulab.service.tasks.idle import IdleStopper

from ..conftest import run_async

S = NotebookState
RES = Resources(cpus=1, memory=1024**3, gpus=1)
LIMITS = Limits(cpus=8, memory=64 * 1024**3, gpus=8)


@pytest.fixture
def records(tmp_path):
    return NotebookRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "test")


def run(records, user="ann", server="nb", idle_timeout=60.0) -> dict:
    records.start(user, server, RES, LIMITS, options={"idle_timeout": idle_timeout})
    return records.transition(user, server, S.RUNNING)


def later():
    """The stopper's clock: ten minutes after the notebooks started RUNNING."""
    return utcnow() + timedelta(seconds=600)


class FakeHub:
    """The hub's answers: one server per (user, name), its last activity settable (seconds
    before the stopper's clock)."""

    def __init__(self, activity_ago: float = 600.0):
        self.activity = {}
        self.default_ago = activity_ago
        self.stopped: list[tuple[str, str]] = []
        self.fail_stop = False
        self.on_read = None  # called on each read: lets a test change things in between
        self.reads = 0

    def model(self, user, name):
        ago = self.activity.get((user, name), self.default_ago)
        t = (later() - timedelta(seconds=ago)).isoformat().replace("+00:00", "Z")
        return {"last_activity": t, "started": t, "ready": True, "pending": None}

    async def request(self, method, path, body=None):
        assert method == "GET"
        self.reads += 1
        if self.on_read:
            self.on_read(self.reads)
        user = path.rsplit("/", 1)[1]
        names = [n for (u, n) in [("ann", "nb"), ("ann", "other")] if u == user]
        return {"servers": {n: self.model(user, n) for n in names}}

    async def stop_server(self, user, server):
        if self.fail_stop:
            raise TimeoutError("the hub did not stop it")
        self.stopped.append((user, server))


def check(stopper):
    # a loop of its own: after the browser tests Playwright's loop owns the main thread
    return run_async(stopper.check())


def test_an_idle_notebook_is_stopped_with_reason_idle(records):
    run(records)
    hub = FakeHub(activity_ago=600)
    assert check(IdleStopper(records, hub, clock=later)) == [("ann", "nb")]
    assert hub.stopped == [("ann", "nb")]
    reason, message = records.take_stop_reason("ann", "nb")  # what the spawner's stop reads
    assert reason == "IDLE" and message.startswith("no activity for 10m") and "1m)" in message


def test_an_active_or_unlimited_notebook_is_not(records):
    run(records, server="nb")
    run(records, server="other", idle_timeout=0)
    hub = FakeHub(activity_ago=600)
    hub.activity[("ann", "nb")] = 5
    assert check(IdleStopper(records, hub, clock=later)) == []
    assert hub.stopped == []
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_a_notebook_started_again_meanwhile_is_left_alone(records):
    nb = run(records)
    # the decision saw one life; a stop and a start happen before the compare-and-set
    records.transition("ann", "nb", S.STOPPING)
    records.transition("ann", "nb", S.STOPPED)
    run(records)
    assert not records.ask_stop("ann", "nb", nb["running_since"], "IDLE", "idle")
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_a_stopping_notebook_takes_no_reason(records):
    nb = run(records)
    records.transition("ann", "nb", S.STOPPING)
    assert not records.ask_stop("ann", "nb", nb["running_since"], "IDLE", "idle")


def test_activity_that_comes_in_before_the_stop_withdraws_it(records):
    run(records)
    hub = FakeHub(activity_ago=600)

    def activity_arrives(reads):
        if reads == 2:  # the last look before the stop
            hub.activity[("ann", "nb")] = 1

    hub.on_read = activity_arrives
    assert check(IdleStopper(records, hub, clock=later)) == []
    assert hub.stopped == []
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_a_failed_stop_withdraws_its_reason(records):
    run(records)
    hub = FakeHub(activity_ago=600)
    hub.fail_stop = True
    assert check(IdleStopper(records, hub, clock=later)) == []
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_a_new_start_clears_a_reason_left_by_an_earlier_life(records):
    nb = run(records)
    assert records.ask_stop("ann", "nb", nb["running_since"], "IDLE", "idle")
    records.transition("ann", "nb", S.STOPPING)  # a stop that did not take the reason
    records.transition("ann", "nb", S.STOPPED)
    run(records)
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_withdraw_leaves_someone_elses_reason(records):
    nb = run(records)
    records.set_stop_reason("ann", "nb", "MAX_RUN_TIME", "max")
    assert not records.withdraw_stop("ann", "nb", "IDLE")
    assert records.take_stop_reason("ann", "nb") == ("MAX_RUN_TIME", "max")
    assert nb["state"] == "RUNNING"


# --- GPUs left unused (GpulabSettings.gpu_unused_timeout) ------------------------------------


class FakeLedger:
    def __init__(self, held: dict[str, list[str]]):
        self.held = held

    def held_by(self, workload: str) -> list[str]:
        return self.held.get(workload, [])


class Clock:
    def __init__(self):
        self.now = later()

    def __call__(self):
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def gpu_notebook(records, server="nb", unused=120.0) -> dict:
    records.start(
        "ann", server, RES, LIMITS, options={"idle_timeout": 0, "gpu_unused_timeout": unused}
    )
    return records.transition("ann", server, S.RUNNING)


def asynced(read):
    """A blocking reader as the stopper reads the GPUs: a coroutine function (the supervisor's
    ``JobContext.gpu_readings``)."""

    async def readings():
        return read()

    return readings


def reader(percent: dict[str, int | None]):
    from gpulab.gpus.usage import DeviceUsage

    return lambda: [DeviceUsage(d, p, 0, 80 * 1024**3) for d, p in percent.items()]


def test_a_notebook_whose_gpus_stay_unused_is_stopped_even_while_its_kernel_is_active(records):
    gpu_notebook(records)
    hub = FakeHub(activity_ago=1)  # the kernel reports activity all along
    clock, percent = Clock(), {"0": 0}
    stopper = IdleStopper(
        records,
        hub,
        clock=clock,
        ledger=FakeLedger({"test/notebook/ann/nb": ["0"]}),
        gpu_usage=asynced(lambda: reader(percent)()),
    )
    assert check(stopper) == []  # the clock starts at the first look that finds them unused
    clock.tick(60)
    assert check(stopper) == []
    clock.tick(61)
    assert check(stopper) == [("ann", "nb")]
    reason, message = records.take_stop_reason("ann", "nb")
    assert reason == "IDLE" and message.startswith("its GPUs unused for 2m"), message


def test_one_look_with_the_gpu_in_use_starts_its_clock_again(records):
    gpu_notebook(records)
    clock, percent = Clock(), {"0": 0}
    stopper = IdleStopper(
        records,
        FakeHub(activity_ago=1),
        clock=clock,
        ledger=FakeLedger({"test/notebook/ann/nb": ["0"]}),
        gpu_usage=asynced(lambda: reader(percent)()),
    )
    check(stopper)
    clock.tick(100)
    percent["0"] = 1  # 1 % busy: in use
    assert check(stopper) == []
    percent["0"] = 0
    clock.tick(100)
    assert check(stopper) == []  # the first look unused again: its clock starts here
    clock.tick(119)
    assert check(stopper) == []  # 119 s unused (219 s since the first look unused)
    clock.tick(1)
    assert check(stopper) == [("ann", "nb")]


def test_gpus_that_cannot_be_read_or_a_policy_that_is_off_stop_nobody(records):
    gpu_notebook(records, server="nb")  # its GPU is a MIG device: no utilization
    gpu_notebook(records, server="other", unused=0)  # the policy is off for it
    hub = FakeHub(activity_ago=1)
    clock = Clock()
    stopper = IdleStopper(
        records,
        hub,
        clock=clock,
        ledger=FakeLedger({"test/notebook/ann/nb": ["MIG-1"], "test/notebook/ann/other": ["1"]}),
        gpu_usage=asynced(reader({"MIG-1": None, "1": 0})),
    )
    for _ in range(3):
        assert check(stopper) == []
        clock.tick(600)
    no_reader = IdleStopper(records, hub, clock=clock, ledger=FakeLedger({}), gpu_usage=None)
    assert check(no_reader) == [] and hub.stopped == []


def test_gpu_use_seen_at_the_last_look_withdraws_the_stop(records):
    gpu_notebook(records)
    hub = FakeHub(activity_ago=1)
    clock, percent = Clock(), {"0": 0}
    reads = {"n": 0}

    def read():
        reads["n"] += 1
        if reads["n"] == 3:  # the last look before the stop: a cell started on the GPU
            percent["0"] = 90
        return reader(percent)()

    stopper = IdleStopper(
        records,
        hub,
        clock=clock,
        ledger=FakeLedger({"test/notebook/ann/nb": ["0"]}),
        gpu_usage=asynced(read),
    )
    check(stopper)
    clock.tick(200)
    assert check(stopper) == [] and hub.stopped == []
    assert records.take_stop_reason("ann", "nb") == ("STOP", "stop requested")


def test_on_a_cluster_a_notebooks_gpus_are_read_on_its_node(records):
    """On a Swarm the GPUs' readings are its nodes' agents' (node -> devices, named as the
    ledger names them by the supervisor's reader): another node's busy GPU "0" is not the
    notebook's, and a node without a fresh reading stops nobody."""
    from pathlib import Path

    from gpulab.gpus.usage import DeviceUsage
    from gpulab.jobs.supervisor.context import JobContext

    from ..support.fake_runtime import FakeRuntime

    gpu_notebook(records)
    rt = FakeRuntime.cluster({"a": ("0",), "b": ("0",)})
    percent = {"a": 0, "b": 90}
    rt.gpu_readings = lambda: {
        n: [DeviceUsage("0", p, 0, 80 * 1024**3)] for n, p in percent.items()
    }
    ctx = JobContext(None, None, None, None, rt, None, Path("."))
    hub, clock = FakeHub(activity_ago=1), Clock()
    stopper = IdleStopper(
        records,
        hub,
        clock=clock,
        ledger=FakeLedger({"test/notebook/ann/nb": ["a/0"]}),
        gpu_usage=ctx.gpu_readings,
    )
    del percent["a"]  # node a's agent has no fresh reading: unknown, never idle
    for _ in range(3):
        assert check(stopper) == []
        clock.tick(600)
    percent["a"] = 0  # read again, and unused (node b's GPU "0" is busy: not the notebook's)
    assert check(stopper) == []
    clock.tick(121)
    assert check(stopper) == [("ann", "nb")]
