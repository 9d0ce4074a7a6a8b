"""What the service shows of a user's workloads (gpulab.jobs.overview): a user's billed
minutes, read from real records on a SQLite file."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpulab.db import Database
from gpulab.disk_ledger import DiskLedger
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger
from gpulab.jobs import overview
from gpulab.jobs.records import JobRecords
from gpulab.lifecycle import JobState, NotebookState
from gpulab.notebooks.records import NotebookRecords
from gpulab.settings import GpulabSettings

J, N = JobState, NotebookState
RAN = [J.INITIALIZING, J.PENDING, J.RUNNING, J.FINALIZING, J.DONE]
SPEC = {"image": "img", "command": ["true"], "resources": {"gpus": 1}, "workers": 1}


class Lab:
    """Records, ledgers and a supervisor-shaped holder of them, on one database."""

    def __init__(self, tmp_path, readings=None):
        db = Database(f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
        devices = [GpuDevice(str(i), "Test GPU", "16G") for i in range(3)]
        self.jobs = JobRecords(db, "t")
        self.notebooks = NotebookRecords(db, "t")
        self.settings = GpulabSettings(instance="t")
        self.sup = SimpleNamespace(
            records=self.jobs,
            ledger=GpuLedger(db, "t", devices, sharing={"1": 4}),
            disk=DiskLedger(db, "t"),
            runtime=SimpleNamespace(inventory="the inventory"),
            ctx=SimpleNamespace(gpu_usage=None if readings is None else lambda: readings),
        )

    def job(self, owner: str, states=(), groups=()) -> str:
        job_id = self.jobs.create(owner, dict(SPEC), None, groups=groups)["id"]
        before = J.QUEUED
        for state in states:
            self.jobs.transition(job_id, state, expect=before)
            before = state
        return job_id

    def notebook(self, user: str, *states: NotebookState, server: str = "") -> None:
        for state in states:
            self.notebooks.transition(user, server, state)


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp_path)


def test_a_users_usage_is_their_jobs_and_notebooks_billed_minutes(lab):
    assert overview.usage_of(lab.jobs, lab.notebooks, "ann") == {
        "user": "ann",
        "jobs_billed_minutes": 0,
        "notebooks_billed_minutes": 0,
        "billed_minutes": 0,
    }
    lab.job("ann", RAN)
    lab.job("ann", RAN)
    lab.job("ann")  # queued: never billed
    lab.job("bob", RAN)
    lab.notebook("ann", N.STARTING, N.RUNNING, N.STOPPING, N.STOPPED)
    got = overview.usage_of(lab.jobs, lab.notebooks, "ann")
    # each ran less than a minute: one commenced minute each
    assert got == {
        "user": "ann",
        "jobs_billed_minutes": 2,
        "notebooks_billed_minutes": 1,
        "billed_minutes": 3,
    }
    # what the records' own readers say, added by billing's rule
    assert got["jobs_billed_minutes"] == lab.jobs.usage("ann")["jobs_billed_minutes"]
    assert got["notebooks_billed_minutes"] == lab.notebooks.billed_minutes("ann")
