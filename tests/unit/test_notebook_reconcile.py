"""The hub's settling of notebook records left in transit by an earlier hub process (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulab.lifecycle import NOTEBOOK_TRANSITIONS, NotebookState
from gpulab.notebook_reconcile import repairs
from gpulab.runtime.objects import notebook_workload_id

S = NotebookState
STARTED = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
BEFORE = (STARTED - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
AFTER = (STARTED + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")


def nb(server: str, state: NotebookState, updated: str = BEFORE) -> dict:
    return {"user": "ann", "server": server, "state": state.value, "updated": updated}


def wid(server: str) -> str:
    return notebook_workload_id("i", "ann", server)


def test_stale_transit_records_are_settled_from_the_engine():
    records = [
        nb("up", S.STARTING),
        nb("down", S.STARTING),
        nb("stopping", S.STOPPING),
        nb("stopping-up", S.STOPPING),
        nb("running", S.RUNNING),
        nb("stopped", S.STOPPED),
    ]
    running = {wid("up"), wid("stopping-up"), wid("running")}
    out = {r.server: r for r in repairs(records, running, set(), STARTED, "i")}
    assert (out["up"].state, out["up"].reason) == (S.RUNNING, "RECOVERED")
    assert (out["down"].state, out["down"].reason) == (S.FAILED, "HUB_RESTART")
    assert out["stopping"].state is S.SYNC_FAILED  # its data stays for a retried push
    assert set(out) == {"up", "down", "stopping"}  # a running stop is the hub's to redo
    for r in out.values():
        assert r.state in NOTEBOOK_TRANSITIONS[r.expect]


def test_work_in_progress_is_left_alone():
    records = [nb("busy", S.STARTING), nb("recent", S.STOPPING, AFTER)]
    assert repairs(records, set(), {wid("busy")}, STARTED, "i") == []
