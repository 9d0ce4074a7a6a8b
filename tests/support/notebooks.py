"""A notebook of alice's on the fake Runtime, with real records and ledgers (SQLite): what
the unit tests of the notebook's life and of the hub's reconciler build on."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from gpulab.data.sync import WorkloadData
from gpulab.db import Database
from gpulab.disk_ledger import DiskLedger
from gpulab.gpus.inventory import GpuDevice
from gpulab.gpus.ledger import GpuLedger
from gpulab.names import (
    notebook_container_name,
    notebook_volume_name,
    notebook_workload_id,
)
from gpulab.notebooks import life
from gpulab.notebooks.container import HubSide
from gpulab.notebooks.form import parse_options
from gpulab.notebooks.life import Held, Notebook, NotebookRefused
from gpulab.notebooks.records import NotebookRecords
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from .fake_runtime import FakeRuntime

IMAGE = "gpulab/python:3.11"
SYNC = "gpulab/sync:test"
PUSHED = json.dumps({"event": "report", "ok": True, "completed": 1, "bytes_transferred": 10})


def settings_for(
    tmp_path, workspace: bool = False, s3: bool = False, home: bool = False
) -> GpulabSettings:
    c = Config()
    c.GpulabSettings.database_url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    c.GpulabSettings.instance = "t"
    c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
    c.GpulabSettings.sync_image = SYNC
    # homes are kept where a test says so (tests/unit/test_notebook_home.py): the others count
    # a workspace's helper runs
    c.GpulabSettings.home_sync = home
    c.GpulabSettings.frameworks = [
        {"id": "python", "title": "Python", "versions": [{"id": "3.11", "image": IMAGE}]}
    ]
    if s3:  # what a cluster needs: the workspace follows the notebook between nodes
        creds = tmp_path / "s3-credentials"
        creds.write_text("AWS_ACCESS_KEY_ID=k\nAWS_SECRET_ACCESS_KEY=s\n")
        c.GpulabSettings.object_stores = {
            "s3": {
                "kind": "s3",
                "endpoint_url": "http://s3.test",
                "credentials": {"file": str(creds)},
            }
        }
        c.GpulabSettings.workspace_store = "s3"
    elif workspace:
        root = tmp_path / "objects"
        root.mkdir(exist_ok=True)
        c.GpulabSettings.object_stores = {"local": {"kind": "filesystem", "root": str(root)}}
        c.GpulabSettings.workspace_store = "local"
    else:
        c.GpulabSettings.object_stores = {}
        c.GpulabSettings.workspace_store = ""
    return GpulabSettings(config=c)


class World:
    """One notebook of alice's on a fake engine, with real records and ledgers (SQLite)."""

    def __init__(
        self,
        tmp_path,
        workspace=False,
        images=(IMAGE, SYNC),
        server="nb",
        cluster=None,
        s3=False,
        home=False,
    ):
        self.s = settings_for(tmp_path, workspace, s3, home)
        db = Database(self.s.database_url)
        if cluster is None:
            self.rt = FakeRuntime(images=set(images))
            self.ledger = GpuLedger(db, "t", [GpuDevice("0"), GpuDevice("1")])
        else:  # a cluster's GPUs come from its nodes, as the hub's ledger reads them
            self.rt = cluster
            self.ledger = GpuLedger.for_runtime(db, self.s, cluster)
        self.records = NotebookRecords(db, "t")
        self.disk = DiskLedger(db, "t")
        self.events: list[tuple[int, str]] = []
        self.nb = Notebook(
            settings=self.s,
            runtime=self.rt,
            records=self.records,
            ledger=self.ledger,
            disk_ledger=self.disk,
            user="alice",
            server=server,
            groups=[],
            workload_id=notebook_workload_id("t", "alice", server),
            container=notebook_container_name("t", "alice", server),
            volume=notebook_volume_name("t", "alice", server),
            url_path=f"/user/alice/{server}/",
            held=Held(),
            progress=lambda p, m: self.events.append((p, m)),
            http_timeout=2,
            editor_wait_interval=0.01,
        )

    def options(self, **raw):
        return parse_options(self.s, "alice", [], raw)

    def start(self, **raw):
        hub = HubSide(
            env={"JUPYTERHUB_API_TOKEN": "x"},
            command=[],
            args=["--port=8888"],
            base_url=self.nb.url_path,
            port=8888,
            user="1000",
        )
        return run_async(life.start(self.nb, self.options(**raw), hub, raw))

    def refused(self, fn, *args, **kw) -> NotebookRefused:
        with pytest.raises(NotebookRefused) as e:
            fn(*args, **kw)
        return e.value

    def record(self) -> dict:
        return self.records.get("alice", self.nb.server)

    def last(self) -> dict:
        return self.record()["history"][-1]

    def held_gpus(self) -> list[str]:
        return [
            a["device"] for a in self.ledger.allocations() if a["workload"] == self.nb.workload_id
        ]


REPORT = json.dumps({"event": "report", "ok": True, "completed": 1})


def cluster_world(tmp_path, server="nb", s3=True, runtime: FakeRuntime | None = None) -> World:
    """alice's notebook on a fake cluster: nodes a (GPUs 0, 1) and b (GPU 0), or ``runtime``'s
    (another notebook's, on the same database: same ``tmp_path``)."""
    rt = runtime or FakeRuntime.cluster({"a": ("0", "1"), "b": ("0",)}, images={IMAGE, SYNC})
    return World(tmp_path, server=server, cluster=rt, s3=s3)


def editor_answers(monkeypatch, answers: bool = True) -> None:
    """The notebook's server answers at once (or never): no HTTP in unit tests."""

    async def answer(url):
        return answers

    monkeypatch.setattr(life, "editor_answers", answer)


def empty_store_listing(monkeypatch) -> None:
    """The store's listing (what a pull brings, booked against the disk quota) is empty: no
    S3 in unit tests (the helper, which would talk to it, is the fake engine's)."""
    monkeypatch.setattr(WorkloadData, "listed_size", lambda self, vol: 0)
