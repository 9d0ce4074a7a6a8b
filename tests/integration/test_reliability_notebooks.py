"""The hub settles what an earlier hub process left behind, periodically, not once.

An earlier hub was killed in the middle of things: a notebook record stuck in STARTING with
GPUs booked and no container, another stuck in STOPPING with its sync helper (store
credentials in its environment) still there, a helper of a stopped notebook. The new hub's
reconciler settles each from what the engine says.
"""

from __future__ import annotations

import time

import pytest

from gpulab.db import Database
from gpulab.gpus.inventory import load_inventory
from gpulab.gpus.ledger import GpuLedger
from gpulab.lifecycle import NotebookState
from gpulab.names import notebook_workload_id
from gpulab.notebooks.records import NotebookRecords

pytestmark = [pytest.mark.docker, pytest.mark.hub]
S = NotebookState

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.notebook_reconcile_interval = 0.5
c.GpulabSettings.notebook_stale_after = 0.5
c.GpulabSettings.gpu_reconcile_grace = 0
"""


def _helper(docker_client, instance: str, workload: str):
    """A stand-in for a sync helper left running: labelled as gpulab labels its helpers."""
    return docker_client.containers.run(
        "gpulab/python:3.11",
        ["sleep", "300"],
        detach=True,
        labels={
            "org.gpulab.instance": instance,
            "org.gpulab.kind": "sync-helper",
            "org.gpulab.workload": workload,
        },
        environment={"AWS_SECRET_ACCESS_KEY": "planted"},
    )


def _container_ids(docker_client) -> set[str]:
    """Every container's ID, in one engine call: ``containers.list`` inspects each one it
    listed, and one that another test removes meanwhile is a 404 there."""
    return {c["Id"] for c in docker_client.api.containers(all=True)}


def test_a_new_hub_settles_records_helpers_and_gpus_left_by_the_last(hub_with, docker_client):
    hub = hub_with(CONFIG, start=False)
    hub.write_config()
    data = hub.workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{data / 'gpulab.sqlite'}")
    records = NotebookRecords(db, hub.instance)
    ledger = GpuLedger(db, hub.instance, load_inventory([{"id": "0"}, {"id": "1"}], False))
    # left by the killed hub
    records.transition("carol", "starting", S.STARTING, reason="SPAWN")
    ledger.reserve(notebook_workload_id(hub.instance, "carol", "starting"), "carol", "notebook", 1)
    for state in (S.STARTING, S.RUNNING, S.STOPPING):
        records.transition("carol", "stopping", state)
    for state in (S.STARTING, S.RUNNING, S.STOPPING, S.STOPPED):
        records.transition("carol", "stopped", state)
    left = [
        _helper(docker_client, hub.instance, notebook_workload_id(hub.instance, "carol", s))
        for s in ("stopping", "stopped")
    ]
    hub.start()
    # any spawn starts the hub's reconciler; the first pass runs at once
    token = hub.create_user("dan")
    r = hub.spawn("dan", "nb", {"framework": "python", "flavor": "cpu-small"}, token=token)
    assert r.status_code in (201, 202), r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if records.state("carol", "starting") is S.FAILED and ledger.allocations() == []:
            break
        time.sleep(0.2)
    starting = records.get("carol", "starting")
    assert (starting["state"], starting["history"][-1]["reason"]) == ("FAILED", "HUB_RESTART")
    assert records.state("carol", "stopping") is S.SYNC_FAILED  # push retry stays possible
    assert records.state("carol", "stopped") is S.STOPPED
    assert ledger.allocations() == []
    deadline = time.monotonic() + 10
    alive = left
    while alive and time.monotonic() < deadline:
        alive = [c for c in left if c.id in _container_ids(docker_client)]
        time.sleep(0.2)
    assert alive == [], "orphaned sync helpers were not removed"
    # a real spawn stays STARTING far longer than notebook_stale_after: left alone all along,
    # because a spawner of this hub works on it
    hub.wait_ready("dan", "nb")
    assert "HUB_RESTART" not in {e["reason"] for e in records.get("dan", "nb")["history"]}

    # periodic, not once: what goes stale later is settled too
    for state in (S.STARTING, S.RUNNING, S.STOPPING):
        records.transition("carol", "later", state)
    late = _helper(
        docker_client, hub.instance, notebook_workload_id(hub.instance, "carol", "later")
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and records.state("carol", "later") is not S.SYNC_FAILED:
        time.sleep(0.2)
    assert records.state("carol", "later") is S.SYNC_FAILED
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and late.id in _container_ids(docker_client):
        time.sleep(0.2)
    assert late.id not in _container_ids(docker_client)
