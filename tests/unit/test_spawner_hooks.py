"""NotebookSpawner's own hooks on a fake Runtime: what the hub's poll sees of the container
(from its WorkloadState, never a Docker document)."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpulab.notebooks import spawner as spawner_module
from gpulab.notebooks.spawner import NotebookSpawner
from gpulab.runtime.base import WorkloadSpec

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime

NAME = "t-nb-alice-"


class _Reconciler:
    def ensure_running(self) -> None:
        pass


@pytest.fixture
def hooked(monkeypatch):
    """A NotebookSpawner on a fake Runtime; life.ended's calls recorded."""
    rt = FakeRuntime()
    ended: list[object] = []
    monkeypatch.setattr(NotebookSpawner, "runtime", property(lambda self: rt))
    monkeypatch.setattr(NotebookSpawner, "reconciler", property(lambda self: _Reconciler()))
    monkeypatch.setattr(NotebookSpawner, "notebook", lambda self: "nb")

    async def record_end(nb):
        ended.append(nb)

    monkeypatch.setattr(spawner_module.life, "ended", record_end)
    sp = NotebookSpawner(config=Config())
    sp.object_name = NAME
    return sp, rt, ended


def _run(rt: FakeRuntime) -> None:
    run_async(rt.create_and_start(WorkloadSpec(name=NAME, image="img", command=["x"])))


def test_poll_reads_the_workload_state(hooked):
    sp, rt, ended = hooked
    _run(rt)
    assert run_async(sp.poll()) is None and sp.object_id == NAME and ended == []
    rt.exits(NAME, 3)
    assert run_async(sp.poll()) == "ExitCode=3, Error='', FinishedAt="
    assert ended == ["nb"]  # the record is settled (FAILED with its exit code)


def test_a_container_on_a_lost_node_still_runs_for_the_hub(hooked):
    """The reconciler settles a lost notebook (NODE_LOST); until then the hub keeps it."""
    sp, rt, ended = hooked
    _run(rt)
    rt.lose(NAME)
    assert run_async(sp.poll()) is None and ended == []


def test_a_vanished_container_has_ended(hooked):
    sp, rt, ended = hooked
    sp.object_id = NAME
    assert run_async(sp.get_object()) is None and sp.object_id == ""
    assert run_async(sp.poll()) == 0 and ended == ["nb"]
