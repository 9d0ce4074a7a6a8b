"""NotebookSpawner's own hooks on a fake Runtime: what the hub's poll sees of the container
(from its WorkloadState, never a Docker document), the one options path, and the start-up
warning that names each DockerSpawner option gpulab ignores."""

from __future__ import annotations

import logging

import pytest
from traitlets.config import Config

from gpulab.notebooks import spawner as spawner_module
from gpulab.notebooks.spawner import IGNORED_DOCKER_OPTIONS, NotebookSpawner, ignored_options
from gpulab.runtime.base import WorkloadSpec

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime

NAME = "t-nb-alice-"


class _Reconciler:
    busy: set[str] = set()

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


def test_a_start_without_applied_options_checks_them_as_the_hook_does(hooked, monkeypatch):
    """JupyterHub applies the options (apply_user_options) before each start; a start that
    finds none applied checks them through the same form.check_options, with its 400."""
    from types import SimpleNamespace

    from tornado import web

    from gpulab.notebooks import form

    sp, rt, ended = hooked
    asked = []

    async def refuse(settings, runtime, ledger, user, groups, user_options):
        asked.append((user, user_options))
        raise form.OptionsRefused("gpus: gpus=9 requested but this host has 0 GPU(s)")

    monkeypatch.setattr(form, "check_options", refuse)
    monkeypatch.setattr(NotebookSpawner, "ledger", property(lambda self: None))
    sp.user = SimpleNamespace(name="alice", groups=[])
    sp.user_options = {"gpus": 9}
    with pytest.raises(web.HTTPError) as e:
        run_async(sp.start())
    assert e.value.status_code == 400 and asked == [("alice", {"gpus": 9})]
    assert "Invalid notebook options: gpus: gpus=9" in str(e.value)
    assert rt.calls == []  # nothing reached the engine


def test_each_ignored_dockerspawner_option_is_named_with_what_to_use(monkeypatch, caplog):
    c = Config()
    c.DockerSpawner.network_name = "mynet"
    c.Spawner.mem_limit = "4G"
    c.NotebookSpawner.extra_host_config = {"privileged": True}
    c.DockerSpawner.port = 9999  # read: where the notebook's server listens
    c.DockerSpawner.client_kwargs = {"timeout": 30}  # read: how the hub reaches its engine
    assert [o for o, _ in ignored_options(c, NotebookSpawner.mro())] == [
        "c.Spawner.mem_limit",
        "c.NotebookSpawner.extra_host_config",
        "c.DockerSpawner.network_name",
    ]
    monkeypatch.setattr(spawner_module, "_warned", False)
    with caplog.at_level(logging.WARNING):
        sp = NotebookSpawner(config=c)
        NotebookSpawner(config=c)  # once a process
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    ours = [w for w in warned if "gpulab's NotebookSpawner ignores it" in w]
    assert len(ours) == 3, warned
    assert any(
        w.startswith("c.DockerSpawner.network_name is set")
        and "c.GpulabSettings.network_isolation" in w
        for w in ours
    )
    assert sp.port == 9999
    assert not ignored_options(Config(), NotebookSpawner.mro())
    # every option named is one of DockerSpawner's (a typo would never warn)
    from dockerspawner import DockerSpawner

    assert set(IGNORED_DOCKER_OPTIONS) <= set(DockerSpawner.class_trait_names(config=True))


def test_the_configuration_doc_names_exactly_the_ignored_options():
    """docs/configuration.md's table of ignored DockerSpawner options is the code's."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    table = doc[doc.index("| ignored | use instead |") :].split("\n\n", 1)[0]
    named = {
        name
        for row in table.splitlines()[2:]
        for name in re.findall(r"`([a-z_]+)`", row.split(" | ")[0])
    }
    assert named == set(IGNORED_DOCKER_OPTIONS)


def test_the_spawn_page_may_ask_for_progress_before_start_runs(hooked, monkeypatch):
    """JupyterHub serves the spawn page's event stream as soon as a spawn is requested,
    possibly before start() runs: progress() waits for that start's events (it raised
    AttributeError, a traceback in the hub's log), and after a stop waits for the next one's."""
    import asyncio
    from types import SimpleNamespace

    sp, rt, ended = hooked

    async def fake_start(nb, options, hub, user_options):
        sp._progress(40, "pulling the workspace")
        await asyncio.sleep(0.1)
        return "10.0.0.2", 8888

    async def fake_stop(nb):
        pass

    monkeypatch.setattr(spawner_module.life, "start", fake_start)
    monkeypatch.setattr(spawner_module.life, "stop", fake_stop)
    monkeypatch.setattr(spawner_module, "HubSide", lambda **kw: None)
    monkeypatch.setattr(
        NotebookSpawner, "server", property(lambda self: SimpleNamespace(base_url="/"))
    )
    monkeypatch.setattr(NotebookSpawner, "workload_id", "t-nb-alice-")
    monkeypatch.setattr(sp, "get_env", lambda: {})
    monkeypatch.setattr(sp, "get_args", lambda: [])
    sp.gpulab_options = SimpleNamespace()  # applied before the start, as JupyterHub does

    async def read(events: list) -> None:
        async for event in sp.progress():
            events.append(event)

    async def scenario():
        first: list[dict] = []
        reader = asyncio.create_task(read(first))
        await asyncio.sleep(0.3)
        assert not reader.done()  # waiting for start(), not failed
        assert await sp.start() == ("10.0.0.2", 8888)
        await asyncio.wait_for(reader, 5)
        await sp.stop()
        second: list[dict] = []
        reader = asyncio.create_task(read(second))
        await asyncio.sleep(0.3)
        waiting = not reader.done()  # the last start's events are not replayed
        reader.cancel()
        return first, second, waiting

    first, second, waiting = run_async(scenario())
    assert first == [{"progress": 40, "message": "pulling the workspace"}]
    assert second == [] and waiting
