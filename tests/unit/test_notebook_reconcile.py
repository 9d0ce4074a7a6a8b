"""The hub's settling of notebook records that nobody works on any more (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulab.lifecycle import NOTEBOOK_TRANSITIONS, NotebookState
from gpulab.names import notebook_workload_id
from gpulab.notebooks.reconcile import PUSH_RETRY_STALE_AFTER, repairs

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
