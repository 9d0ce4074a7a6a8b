"""The hub's settling of notebook records that nobody works on any more (pure), and its
pass on a fake cluster: a notebook whose node is lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpulab.lifecycle import LOST_AFTER, NOTEBOOK_TRANSITIONS, NotebookState
from gpulab.names import notebook_workload_id
from gpulab.notebooks import reconcile
from gpulab.notebooks.reconcile import PUSH_RETRY_STALE_AFTER, NotebookReconciler, repairs

from ..conftest import run_async
from ..support.fake_runtime import EngineError
from ..support.notebooks import REPORT, cluster_world, editor_answers, empty_store_listing

S = NotebookState
NOW = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def nb(server: str, state: NotebookState, age: float = 300, reason: str = "") -> dict:
    return {
        "user": "ann",
        "server": server,
        "state": state.value,
        "updated": ago(age),
        "container": f"c-{server}",
        "history": [{"state": state.value, "reason": reason}],
    }


def wid(server: str) -> str:
    return notebook_workload_id("i", "ann", server)


def test_stale_transit_records_are_settled_from_the_engine():
    records = [
        nb("up", S.STARTING),
        nb("down", S.STARTING),
        nb("stopping", S.STOPPING),
        nb("stopping-up", S.STOPPING),
        nb("deleting", S.DELETING),
        nb("running", S.RUNNING),
        nb("stopped", S.STOPPED),
    ]
    running = {wid("up"), wid("stopping-up"), wid("running")}
    settle, to_stop = repairs(records, running, set(), NOW, "i")
    out = {r.server: r for r in settle}
    assert (out["up"].state, out["up"].reason) == (S.RUNNING, "RECOVERED")
    assert (out["down"].state, out["down"].reason) == (S.FAILED, "HUB_RESTART")
    assert out["stopping"].state is S.SYNC_FAILED  # its data stays for a retried push
    assert out["deleting"].state is S.ERROR  # deleted again by its owner
    assert set(out) == {"up", "down", "stopping", "deleting"}
    # a stop the engine did not confirm: its container is stopped first, settled later
    assert [n["server"] for n in to_stop] == ["stopping-up"]
    for r in out.values():
        assert r.state in NOTEBOOK_TRANSITIONS[r.expect]


def test_work_in_progress_is_left_alone():
    records = [
        nb("busy", S.STARTING),
        nb("recent", S.STOPPING, age=5),
        nb("push-retry", S.STOPPING, age=600, reason="PUSH_RETRY"),
    ]
    assert repairs(records, set(), {wid("busy")}, NOW, "i") == ([], [])
    # a push retry of the service is given its helper's whole time
    old = [nb("push-retry", S.STOPPING, age=PUSH_RETRY_STALE_AFTER + 1, reason="PUSH_RETRY")]
    assert [r.state for r in repairs(old, set(), set(), NOW, "i")[0]] == [S.SYNC_FAILED]
    # stale_after is the operator's
    assert repairs([nb("recent", S.STOPPING, age=5)], set(), set(), NOW, "i", 1.0)[0]


class Clock:
    """The reconciler's monotonic clock, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """Two running notebooks of alice's on a fake cluster: "nb" on node b (its GPU b/0),
    "two" on node a; the hub's reconciler on a clock of the test's."""
    editor_answers(monkeypatch)
    empty_store_listing(monkeypatch)
    clock = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=clock.monotonic))
    lost = cluster_world(tmp_path)
    lost.rt.script_helper(0, [REPORT])
    lost.start(gpus="1")
    kept = cluster_world(tmp_path, server="two", runtime=lost.rt)
    kept.rt.script_helper(0, [REPORT])
    kept.start(gpus="1")
    assert (lost.nb.held.node, kept.nb.held.node) == ("b", "a")
    assert lost.held_gpus() == ["b/0"] and len(kept.held_gpus()) == 1
    rec = NotebookReconciler(lost.s, lost.records, lost.ledger, lost.rt)
    return SimpleNamespace(lost=lost, kept=kept, rt=lost.rt, rec=rec, clock=clock)


def test_a_notebook_on_a_lost_node_is_node_lost_its_gpus_released_once_it_is_gone(lab):
    lost, kept, rt = lab.lost, lab.kept, lab.rt
    rt.node_down("b")
    assert run_async(lab.rec.pass_once())["records"] == []  # seen lost: the clock starts
    lab.clock.now += LOST_AFTER - 0.5
    assert run_async(lab.rec.pass_once())["records"] == []  # not for long enough yet
    assert lost.record()["state"] == "RUNNING" and lost.held_gpus() == ["b/0"]
    assert lost.nb.container in rt.workloads and rt.names("remove") == []
    held_at_remove = []
    real_remove = rt.remove

    async def remove(name):  # what the ledger holds when the engine is asked to remove it
        held_at_remove.append(lost.held_gpus())
        return await real_remove(name)

    rt.remove = remove
    lab.clock.now += 1.0
    done = run_async(lab.rec.pass_once())
    assert done["records"] == [f"{lost.nb.workload_id} RUNNING->ERROR (NODE_LOST)"]
    record = lost.record()
    assert record["state"] == "ERROR" and lost.last()["reason"] == "NODE_LOST"
    assert lost.last()["message"].startswith("node b is down: the notebook is gone with it")
    # removed first (the manager forgot its task), its GPUs released after
    assert held_at_remove == [["b/0"]] and lost.nb.container not in rt.workloads
    assert lost.held_gpus() == [] and rt.names("unreach") == [lost.nb.url_path]
    # the notebook on a healthy node is left alone
    assert kept.record()["state"] == "RUNNING" and len(kept.held_gpus()) == 1
    assert kept.nb.container in rt.running()


def test_a_lost_notebook_whose_removal_fails_keeps_its_gpus(lab):
    lost, rt = lab.lost, lab.rt
    rt.drain("b")
    run_async(lab.rec.pass_once())
    lab.clock.now += LOST_AFTER + 1
    rt.fail("remove", EngineError("the manager did not answer"), name=lost.nb.container)
    with pytest.raises(EngineError):
        run_async(lab.rec.pass_once())
    assert lost.record()["state"] == "ERROR" and lost.last()["reason"] == "NODE_LOST"
    assert "node b is drain" in lost.last()["message"]
    assert lost.held_gpus() == ["b/0"]  # not confirmed gone: still booked
    # the next pass tries the removal again; once it is confirmed, the GPUs go back
    done = run_async(lab.rec.pass_once())
    assert lost.nb.container not in rt.workloads and lost.held_gpus() == []
    assert rt.names("unreach") == [lost.nb.url_path]
    assert lost.record()["state"] == "ERROR" and done["records"] == []  # settled before


def test_a_pass_removes_what_dead_helpers_left_an_engine_error_is_a_warning(lab, caplog):
    """After the orphaned helpers, what dead helpers left apart from themselves (a Swarm's
    secrets holding store credentials: Runtime.remove_helper_leftovers) goes, this instance's
    only; an engine that refuses is a warning, and the pass goes on."""
    rt, instance = lab.rt, lab.lost.s.instance
    rt.helper_leftovers = {instance: ["h1-store-credentials"], "other": ["o1-git-password"]}
    with caplog.at_level("WARNING", "gpulab.notebooks"):
        run_async(lab.rec.pass_once())
        assert rt.names("remove_helper_leftovers") == [instance]
        assert "removed what dead sync helpers left behind: h1-store-credentials" in caplog.text
        assert rt.helper_leftovers == {"other": ["o1-git-password"]}
        rt.fail("remove_helper_leftovers", EngineError("the manager did not answer"))
        done = run_async(lab.rec.pass_once())
    assert "what dead helpers left is not removed yet: the manager did not answer" in caplog.text
    assert done["records"] == [] and lab.kept.record()["state"] == "RUNNING"
