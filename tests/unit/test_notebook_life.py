"""The notebook's life (gpulab.notebooks.life) step by step on a fake Runtime: every failure
path of a start, what a stop and a delete give back and when."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

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
from ..support.fake_runtime import EngineError, FakeRuntime

IMAGE = "gpulab/python:3.11"
SYNC = "gpulab/sync:test"
PUSHED = json.dumps({"event": "report", "ok": True, "completed": 1, "bytes_transferred": 10})


def settings_for(tmp_path, workspace: bool = False) -> GpulabSettings:
    c = Config()
    c.GpulabSettings.database_url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    c.GpulabSettings.instance = "t"
    c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
    c.GpulabSettings.sync_image = SYNC
    c.GpulabSettings.frameworks = [
        {"id": "python", "title": "Python", "versions": [{"id": "3.11", "image": IMAGE}]}
    ]
    if workspace:
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

    def __init__(self, tmp_path, workspace=False, images=(IMAGE, SYNC), server="nb"):
        self.s = settings_for(tmp_path, workspace)
        db = Database(self.s.database_url)
        self.rt = FakeRuntime(images=set(images))
        self.records = NotebookRecords(db, "t")
        self.ledger = GpuLedger(db, "t", [GpuDevice("0"), GpuDevice("1")])
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


@pytest.fixture
def answers(monkeypatch):
    """The notebook's server answers at once (no HTTP in unit tests)."""

    async def yes(url):
        return True

    monkeypatch.setattr(life, "editor_answers", yes)


@pytest.fixture
def silent(monkeypatch):
    async def no(url):
        return False

    monkeypatch.setattr(life, "editor_answers", no)


def test_start_runs_one_workload_and_records_running(tmp_path, answers):
    w = World(tmp_path)
    ip, port = w.start(gpus="1")
    assert port == 8888 and ip.startswith("10.0.0.")
    assert w.record()["state"] == "RUNNING" and w.last()["reason"] == "READY"
    spec = w.rt.workloads[w.nb.container].spec
    assert spec.image == IMAGE and spec.network_owner == "alice" and not spec.runner
    assert spec.gpu_ids == ["0"] and spec.ports == (8888,)
    assert spec.command == ["jupyterhub-singleuser", "--port=8888"]  # the fake knows no CMD
    assert spec.env["JUPYTERHUB_ACTIVITY_INTERVAL"] and spec.env["JUPYTERHUB_API_TOKEN"] == "x"
    assert [m.target for m in spec.mounts] == [w.s.workspace_dir]
    assert w.held_gpus() == ["0"] and w.nb.held.ran
    assert w.events[-1][0] == 100


def test_the_image_s_own_command_runs_when_the_hub_names_none(tmp_path, answers):
    w = World(tmp_path)
    w.rt.image_commands[IMAGE] = ["sh", "-c", "serve"]
    w.start()
    assert w.rt.workloads[w.nb.container].spec.command == ["sh", "-c", "serve", "--port=8888"]


def test_limits_refuse_before_anything_runs(tmp_path, answers):
    w = World(tmp_path)
    w.start(gpus="1", cpus="2")
    other = World(tmp_path, server="two")
    other.s.max_resources = {"cpus": 2, "memory": "64G", "gpus": 8}
    e = other.refused(other.start, cpus="1")
    assert e.status == 409 and "cpus" in e.message
    assert other.record()["state"] == "FAILED" and other.last()["reason"] == "LIMIT_EXCEEDED"
    assert other.rt.names("create_and_start") == []


def test_image_missing_is_error_and_runs_nothing(tmp_path, answers):
    w = World(tmp_path, images=(SYNC,))
    e = w.refused(w.start, gpus="1")
    assert e.status == 503 and f"image {IMAGE} is missing on this host" in e.message
    assert w.record()["state"] == "ERROR" and w.last()["reason"] == "IMAGE_MISSING"
    assert w.rt.names("create_and_start") == []
    # the hub then stops it: the GPUs it reserved go back, nothing is pushed
    assert w.held_gpus() == ["0"]
    run_async(life.stop(w.nb))
    assert w.held_gpus() == [] and w.rt.called("run_helper") == []
    assert w.record()["state"] == "ERROR"


def test_an_engine_that_cannot_deliver_gpus_refuses_gpu_notebooks_only(tmp_path, answers):
    why = "gpu_mode 'env' hands GPUs out with NVIDIA_VISIBLE_DEVICES, which ..."
    w = World(tmp_path)
    w.nb.gpu_refusal = why  # what the hub's start-up check found
    e = w.refused(w.start, gpus="1")
    assert e.status == 503 and e.message == f"this host cannot give containers GPUs: {why}"
    assert w.record()["state"] == "ERROR" and w.last()["reason"] == "GPU_RUNTIME_MISSING"
    assert w.held_gpus() == [] and w.rt.names("create_and_start") == []
    # a CPU notebook starts: it is given no GPU in any mode (runtime/objects.gpu_request)
    cpu = World(tmp_path, server="cpu")
    cpu.nb.gpu_refusal = why
    cpu.start(gpus="0")
    assert cpu.record()["state"] == "RUNNING"


def test_engine_unreachable_at_the_image_check_is_error(tmp_path, answers):
    w = World(tmp_path)
    w.rt.fail("image_exists")
    e = w.refused(w.start)
    assert e.status == 503 and "did not answer" in e.message
    assert w.last()["reason"] == "ENGINE_UNREACHABLE"


def test_no_gpu_available_is_failed(tmp_path, answers):
    w = World(tmp_path)
    w.ledger.reserve("someone-else", "bob", "notebook", 2)
    e = w.refused(w.start, gpus="1")
    assert e.status == 409
    assert w.record()["state"] == "FAILED" and w.last()["reason"] == "NO_GPU_AVAILABLE"
    assert w.rt.names("create_and_start") == []


def test_gpu_quota_is_failed(tmp_path, answers):
    w = World(tmp_path)
    w.s.job_quota = {"gpus": 0}
    e = w.refused(w.start, gpus="1")
    assert e.status == 409 and w.last()["reason"] == "GPU_QUOTA_EXCEEDED"
    assert w.held_gpus() == []


def test_engine_error_at_create_is_error_and_keeps_no_container(tmp_path, answers):
    w = World(tmp_path)
    w.rt.fail("create_and_start", EngineError("could not select device driver"))
    e = w.refused(w.start, gpus="1")
    assert e.status == 503 and "could not select device driver" in e.message
    assert w.record()["state"] == "ERROR" and w.last()["reason"] == "ENGINE_ERROR"
    assert not w.nb.held.ran
    run_async(life.stop(w.nb))
    assert w.held_gpus() == []


def test_network_unavailable_is_error(tmp_path, answers):
    w = World(tmp_path)
    w.rt.fail("ensure_user_network")
    e = w.refused(w.start)
    assert e.status == 503 and w.last()["reason"] == "NETWORK_UNAVAILABLE"
    assert w.rt.names("create_and_start") == []


def test_process_exiting_at_start_is_failed_with_its_exit_code(tmp_path, answers):
    w = World(tmp_path)
    w.rt.exits(w.nb.container, 3)
    e = w.refused(w.start)
    assert e.status == 500 and "exit code 3" in e.message
    assert w.record()["state"] == "FAILED" and w.last()["reason"] == "EXITED"
    assert w.last()["exit_code"] == 3
    # the failed container is kept (stopped) for its logs until the next start or a delete
    run_async(life.stop(w.nb))
    assert w.nb.container in w.rt.workloads and w.rt.names("remove") == []
    assert w.record()["state"] == "FAILED"


def test_out_of_memory_says_so(tmp_path, silent):
    w = World(tmp_path)
    w.rt.exits(w.nb.container, 137, oom=True)
    e = w.refused(w.start, memory="1G")
    assert "killed: out of memory (limit 1" in e.message and "(exit code 137)" in e.message
    assert w.last()["exit_code"] == 137


def test_editor_never_answering_is_a_ready_timeout(tmp_path, silent):
    w = World(tmp_path)
    w.nb.http_timeout = 0.1
    e = w.refused(w.start)
    assert w.last()["reason"] == "READY_TIMEOUT" and "did not answer within" in e.message


def test_pull_failure_is_failed_and_nothing_is_pushed_at_the_stop(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    stored = tmp_path / "objects" / "gpulab-workspaces" / "workspaces" / "alice" / "nb"
    stored.mkdir(parents=True)
    (stored / "notes.txt").write_text("kept")
    w.rt.script_helper(1, ["cannot reach the store"])
    e = w.refused(w.start)
    assert e.status == 500 and "pull of volume workspace failed" in e.message
    assert w.record()["state"] == "FAILED" and w.last()["reason"] == "PULL_FAILED"
    assert w.nb.held.skip_push
    helpers = len(w.rt.called("run_helper"))
    run_async(life.stop(w.nb))
    assert len(w.rt.called("run_helper")) == helpers  # no push of a half-pulled start


def test_sync_helper_image_missing_is_error(tmp_path, answers):
    w = World(tmp_path, workspace=True, images=(IMAGE,))
    e = w.refused(w.start)
    assert "sync helper image" in e.message and w.last()["reason"] == "IMAGE_MISSING"


def test_stop_pushes_then_releases_and_records_stopped(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    w.start(gpus="1")  # nothing stored yet: the pull is skipped
    w.rt.script_helper(0, [PUSHED])
    run_async(life.stop(w.nb))
    assert w.record()["state"] == "STOPPED" and "pushed workspace" in w.last()["message"]
    assert w.rt.running() == [] and w.nb.container not in w.rt.workloads
    assert w.held_gpus() == []
    assert w.rt.helper_configs[-1].command[0] == "push"


def test_push_failure_keeps_the_data_and_says_sync_failed(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    w.start(gpus="1")
    w.rt.script_helper(1, ["store is down"])
    run_async(life.stop(w.nb))
    assert w.record()["state"] == "SYNC_FAILED" and w.last()["reason"] == "PUSH_FAILED"
    assert "Nothing local was deleted" in w.last()["message"]
    assert w.rt.names("remove_volume") == []  # every local byte stays
    assert (w.nb.volume, "") in w.rt.volumes
    assert w.held_gpus() == []  # the compute goes back all the same


def test_push_again_pushes_a_sync_failed_notebook_and_refuses_any_other(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    w.start(gpus="1")
    refused = w.refused(run_async, life.push_again(w.s, w.rt, w.records, w.record(), by="bob"))
    assert refused.status == 409 and "this one is RUNNING" in refused.message
    w.rt.script_helper(1, ["store is down"])
    run_async(life.stop(w.nb))
    w.rt.script_helper(1, ["store is still down"])
    ok, after = run_async(life.push_again(w.s, w.rt, w.records, w.record(), by="bob"))
    assert not ok and after["state"] == "SYNC_FAILED"
    assert [e["reason"] for e in after["history"][-2:]] == ["PUSH_RETRY", "PUSH_FAILED"]
    assert after["history"][-2]["message"] == "push retried by bob"
    w.rt.script_helper(0, [PUSHED])
    ok, after = run_async(life.push_again(w.s, w.rt, w.records, w.record(), by="alice"))
    assert ok and after["state"] == "STOPPED"
    assert w.rt.helper_configs[-1].command[0] == "push"


def test_gpus_stay_booked_while_the_engine_says_it_still_runs(tmp_path, answers):
    w = World(tmp_path)
    w.start(gpus="1")
    w.rt.fail("stop", times=1)
    w.rt.fail("kill", times=1)
    e = w.refused(run_async, life.stop(w.nb))
    assert e.status == 503 and "still runs" in e.message
    assert w.held_gpus() == ["0"] and w.record()["state"] == "STOPPING"
    # once the engine confirms it is gone, the GPUs go back
    run_async(life.stop(w.nb))
    assert w.held_gpus() == [] and w.record()["state"] == "STOPPED"


def test_stop_when_stop_fails_kills_then_releases(tmp_path, answers):
    w = World(tmp_path)
    w.start(gpus="1")
    w.rt.fail("stop", times=1)
    run_async(life.stop(w.nb))
    assert w.rt.names("kill") == [w.nb.container]
    assert w.held_gpus() == [] and w.record()["state"] == "STOPPED"


def test_a_running_notebook_that_exits_is_failed(tmp_path, answers):
    w = World(tmp_path)
    w.start()
    w.rt.exits(w.nb.container, 137)
    run_async(life.ended(w.nb))
    assert w.record()["state"] == "FAILED" and w.last()["exit_code"] == 137


def test_delete_removes_container_volumes_gpus_and_records_deleted(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    w.start(gpus="1")
    w.rt.script_helper(0, [PUSHED])
    run_async(life.stop(w.nb))
    w.rt.script_helper(0, [json.dumps({"event": "report", "ok": True})])
    assert run_async(life.delete(w.nb)) is True
    assert w.rt.helper_configs[-1].command[0] == "purge"
    assert w.nb.volume in w.rt.names("remove_volume")
    assert (w.nb.volume, "") not in w.rt.volumes
    assert w.record()["state"] == "DELETED" and w.held_gpus() == []


def test_delete_whose_purge_fails_keeps_the_local_copy(tmp_path, answers):
    w = World(tmp_path, workspace=True)
    w.start()
    w.rt.script_helper(0, [PUSHED])
    run_async(life.stop(w.nb))
    w.rt.script_helper(1, ["access denied"])
    assert run_async(life.delete(w.nb)) is False
    assert w.record()["state"] == "ERROR" and w.last()["reason"] == "DELETE_FAILED"
    assert w.rt.names("remove_volume") == [] and (w.nb.volume, "") in w.rt.volumes


def test_delete_with_the_engine_failing_is_error(tmp_path, answers):
    w = World(tmp_path)
    w.start()
    run_async(life.stop(w.nb))
    w.rt.fail("remove")
    with pytest.raises(EngineError):
        run_async(life.delete(w.nb))
    assert w.record()["state"] == "ERROR" and w.last()["reason"] == "DELETE_FAILED"
