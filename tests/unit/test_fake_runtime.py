"""The fake Runtime honours the Runtime interface's contract (what unit tests rely on)."""

from __future__ import annotations

import inspect

import pytest

from gpulab.names import L_INSTANCE, L_KIND, L_USER
from gpulab.runtime.base import (
    EngineUnreachable,
    HelperSpec,
    Mount,
    Runtime,
    WorkloadGone,
    WorkloadSpec,
    WorkloadState,
)

from ..conftest import run_async
from ..support.fake_runtime import SIGKILL_EXIT, SIGTERM_EXIT, EngineError, FakeRuntime

IMAGE = "gpulab/python:3.11"


def spec(name: str = "w1", kind: str = "job", user: str = "alice", **kw) -> WorkloadSpec:
    labels = {L_INSTANCE: "test", L_KIND: kind, L_USER: user}
    return WorkloadSpec(name=name, image=IMAGE, command=["true"], labels=labels, **kw)


#: what the interface does itself for every backend, on the engine's own methods (the pools,
#: an image's name, the image cache): no backend implements them
OWN = ("image_ref", "log_gpus", "run", "run_exec", "image_builds", "missing_images")


def interface_methods() -> list[str]:
    return [
        n
        for n, f in vars(Runtime).items()
        if not n.startswith("_") and inspect.isfunction(f) and n not in OWN
    ]


def test_every_method_of_the_interface_is_implemented():
    rt = FakeRuntime()
    assert isinstance(rt, Runtime)
    for name in interface_methods():
        assert getattr(FakeRuntime, name) is not getattr(Runtime, name), name
        assert inspect.iscoroutinefunction(getattr(FakeRuntime, name)) == (
            inspect.iscoroutinefunction(getattr(Runtime, name))
        ), name


def abstract_methods() -> list[str]:
    """The interface's methods that a backend must implement (their body only raises)."""
    return [
        n
        for n in interface_methods()
        if "raise NotImplementedError" in inspect.getsource(getattr(Runtime, n))
    ]


def test_the_fake_has_the_interface_s_exact_signatures():
    """Every abstract method is implemented, and every method of the interface the fake
    defines takes the interface's parameters (names, kinds, defaults, annotations) and
    returns what it returns: the fake cannot drift from what the engine-side code calls."""
    assert "run_helper" in abstract_methods() and "state" in abstract_methods()
    for name in abstract_methods():
        assert name in vars(FakeRuntime), f"FakeRuntime does not implement {name}"
    for name in interface_methods():
        ours, theirs = getattr(FakeRuntime, name), getattr(Runtime, name)
        assert inspect.signature(ours) == inspect.signature(theirs), name


def test_a_created_workload_runs_is_listed_with_its_labels_and_is_recorded():
    rt = FakeRuntime(images={IMAGE})

    async def go():
        await rt.create_and_start(spec("w1"))
        await rt.create_and_start(spec("n1", kind="notebook"))
        return await rt.state("w1"), await rt.labelled("test", "job")

    state, found = run_async(go())
    assert state.running and state.exit_code is None and state.started_at
    assert [(x.name, x.labels[L_USER], x.running) for x in found] == [("w1", "alice", True)]
    assert rt.names("create_and_start") == ["w1", "n1"]
    assert rt.names("state") == ["w1"]


def test_remove_then_its_state_is_gone_and_a_second_remove_says_so():
    rt = FakeRuntime()

    async def go():
        await rt.create_and_start(spec())
        first = await rt.remove("w1")
        return first, await rt.state("w1"), await rt.remove("w1"), await rt.logs("w1")

    assert run_async(go()) == (True, None, False, b"")


def test_a_scripted_engine_error_hits_the_named_call_once():
    rt = FakeRuntime()
    rt.fail("create_and_start", name="w2")

    async def go():
        await rt.create_and_start(spec("w1"))
        with pytest.raises(EngineError):
            await rt.create_and_start(spec("w2"))
        assert await rt.state("w2") is None
        await rt.create_and_start(spec("w2"))  # only once
        return await rt.state("w2")

    assert run_async(go()).running
    with pytest.raises(AttributeError):
        rt.fail("no_such_method")
    rt.fail("state", times=0)  # every call from now on, until unfail
    for _ in range(3):
        with pytest.raises(EngineError):
            run_async(rt.state("w2"))
    rt.unfail("state")
    assert run_async(rt.state("w2")).running


def test_exit_codes_now_or_on_start_and_oom():
    rt = FakeRuntime()
    rt.exits("w2", 3)

    async def go():
        await rt.create_and_start(spec("w1"))
        rt.exits("w1", 0, oom=True)
        await rt.create_and_start(spec("w2"))
        return await rt.state("w1"), await rt.state("w2")

    w1, w2 = run_async(go())
    assert w1 == WorkloadState(running=False, exit_code=0, oom=True, started_at=w1.started_at)
    assert (w2.running, w2.exit_code) == (False, 3)


def test_stop_terminate_kill_start_again():
    rt = FakeRuntime()

    async def go():
        await rt.create_and_start(spec("a"))
        await rt.create_and_start(spec("b"))
        await rt.create_and_start(spec("c"))
        rt.workloads["b"].ignores_term = True
        await rt.stop("a", 1)
        await rt.terminate("b", 1)
        still = (await rt.state("b")).running
        await rt.kill("b")
        await rt.terminate("c", 1)
        codes = [(await rt.state(n)).exit_code for n in "abc"]
        await rt.start_again("a")
        with pytest.raises(EngineError):
            await rt.start_again("gone")
        return still, codes, await rt.state("a")

    still, codes, again = run_async(go())
    assert still and codes == [SIGTERM_EXIT, SIGKILL_EXIT, SIGTERM_EXIT]
    assert again.running and rt.workloads["a"].starts == 2


def test_a_vanished_or_lost_workload():
    rt = FakeRuntime()

    async def go():
        await rt.create_and_start(spec("a"))
        await rt.create_and_start(spec("b", node="n2"))
        rt.vanish("a")
        rt.lose("b")
        return await rt.state("a"), await rt.state("b")

    a, b = run_async(go())
    assert a is None
    assert (b.running, b.exit_code, b.lost, b.node) == (False, None, True, "n2")


def test_a_missing_image_refuses_the_create():
    rt = FakeRuntime(images={IMAGE})
    rt.forget_image(IMAGE)

    async def go():
        assert not await rt.image_exists(IMAGE)
        with pytest.raises(EngineError, match="No such image"):
            await rt.create_and_start(spec())
        return await rt.state("w1")

    assert run_async(go()) is None


def test_exec_logs_and_sessions():
    rt = FakeRuntime()
    rt.script_exec("w1", 2, b"x" * 10)

    async def go():
        with pytest.raises(WorkloadGone):
            await rt.exec_run("w1", ["ls"], 5, 100)
        await rt.create_and_start(spec())
        rt.workloads["w1"].logs = b"one\ntwo\n"
        cut = await rt.exec_run("w1", ["ls"], 5, 4)
        default = await rt.exec_run("w1", ["ls"], 5, 4)
        session = await rt.exec_session("w1")
        return cut, default, await rt.logs("w1", tail=1), session

    cut, default, tail, session = run_async(go())
    assert cut == (2, b"xxxx", True) and default == (0, b"", False)
    assert tail == b"two\n"
    assert list(rt.log_stream("w1", follow=False)) == [b"one\n", b"two\n"]
    with pytest.raises(WorkloadGone):
        rt.log_stream("nope", follow=True)
    session.write(b"ls\n")
    assert session.read() == b"ls\n"
    session.finish(0)
    assert session.read() == b"" and session.exit_code() == 0


def test_volumes_helpers_and_networks():
    rt = FakeRuntime()
    rt.script_helper(1, ["pulling", "failed"])
    seen: list[str] = []

    async def go():
        net = await rt.ensure_user_network("test", "alice")
        await rt.create_and_start(
            spec(network_owner="alice", mounts=[Mount("data-alice", "/data")])
        )
        addr = await rt.address("w1", net)
        with pytest.raises(WorkloadGone):
            await rt.address("w1", "other")
        in_use = await rt.remove_user_network_if_unused("test", "alice")
        with pytest.raises(EngineError):
            await rt.remove_volume("data-alice")
        vols = await rt.volumes_named("data-")
        helper = await rt.run_helper(HelperSpec("sync", ["pull"]), seen.append)
        await rt.remove("w1")
        gone = await rt.remove_user_network_if_unused("test", "alice")
        return addr, in_use, vols, helper, gone, await rt.remove_volume("data-alice")

    addr, in_use, vols, helper, gone, removed = run_async(go())
    assert addr.startswith("10.0.0.") and not in_use and gone and removed
    assert vols == [("data-alice", "")]
    assert (helper.exit_code, helper.lines, seen) == (1, ["pulling", "failed"], helper.lines)
    assert rt.helper_configs == [HelperSpec("sync", ["pull"])] and rt.helper_nodes == [""]


def test_volumes_are_listed_on_one_node_or_on_every_node():
    """volumes_named(prefix, node): that node's only (a cluster's other nodes are not asked);
    without one, every node's; one engine has one node ("") whatever is named."""
    rt = FakeRuntime.cluster({"a": ("0",), "b": ("0",)})
    for vol in [("vol-1", "a"), ("vol-1", "b"), ("vol-2", "b"), ("other", "a")]:
        rt.add_volume(*vol)

    async def go():
        return [await rt.volumes_named("vol-", n) for n in (None, "a", "b", "x")]

    assert run_async(go()) == [
        [("vol-1", "a"), ("vol-1", "b"), ("vol-2", "b")],
        [("vol-1", "a")],
        [("vol-1", "b"), ("vol-2", "b")],
        [],
    ]
    one = FakeRuntime()
    one.add_volume("vol-1")
    assert run_async(one.volumes_named("vol-", "")) == [("vol-1", "")]


def test_a_cluster_places_on_nodes_and_a_node_down_loses_its_work():
    """What the Swarm backend reports: nodes with their GPUs, each workload on its node; a
    node down or drained: what ran there ends without an exit code (lost), the manager no
    longer counts it running, nothing new starts there, no helper runs there."""
    rt = FakeRuntime.cluster({"a": ("0", "1"), "b": ("0",)})
    assert rt.clustered and rt.devices == () and rt.images_at == "in the registry"
    assert not FakeRuntime().clustered

    async def go():
        nodes = await rt.nodes()
        await rt.create_and_start(spec("on-a", node="a", mounts=[Mount("vol-a", "/data")]))
        await rt.create_and_start(spec("on-b", node="b"))
        await rt.create_and_start(spec("done-b", node="b"))
        rt.exits("done-b", 0)
        rt.node_down("b")
        states = {n: await rt.state(n) for n in ("on-a", "on-b", "done-b")}
        listed = {x.name: x.running for x in await rt.labelled("test", "job")}
        await rt.create_and_start(spec("late-b", node="b"))  # its task never starts
        late = await rt.state("late-b")
        with pytest.raises(EngineError, match="node b is down"):
            await rt.run_helper(HelperSpec("sync", ["push"]), lambda _: None, "b")
        seen = await rt.volume_exists("vol-a", "a"), await rt.volumes_named("vol")
        with pytest.raises(EngineUnreachable, match="node b is down"):  # unknown, not absent
            await rt.volume_exists("vol-b", "b")
        gone = await rt.volume_exists("vol-a", "x"), await rt.remove_volume("vol-a", "x")
        rt.drain("a")
        drained = await rt.state("on-a")
        return nodes, states, listed, late, (seen, gone), drained

    nodes, states, listed, late, (seen, gone), drained = run_async(go())
    assert [(n.hostname, n.gpus, n.ready, n.active) for n in nodes] == [
        ("a", ("0", "1"), True, True),
        ("b", ("0",), True, True),
    ]
    assert states["on-a"].running and states["on-a"].node == "a"
    assert states["on-b"] == WorkloadState(
        running=False,
        started_at=states["on-b"].started_at,
        node="b",
        error="node b is down",
        lost=True,
    )
    assert (states["done-b"].exit_code, states["done-b"].lost) == (0, False)  # ended before
    assert listed == {"on-a": True, "on-b": False, "done-b": False}
    assert (late.running, late.lost, late.error) == (False, True, "node b is down")
    # each node answers for its own volumes; one not in the cluster has none
    assert seen == (True, [("vol-a", "a")]) and gone == (False, False)
    assert (drained.lost, drained.error) == (True, "node a is drain")
    assert [(n.ready, n.active) for n in run_async(rt.nodes())] == [(True, False), (False, True)]
    rt.node_up("b")
    back = run_async(rt.state("on-b"))
    assert (back.running, back.exit_code, back.lost) == (False, None, False)
    assert run_async(rt.remove("on-b")) and run_async(rt.state("on-b")) is None
