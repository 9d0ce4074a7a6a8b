"""Live pushes of running notebooks (gpulab.notebooks.live) on the fake Runtime: the periodic
look, an owner's push now (one at a time), every volume that pushes (the home too), and the
stop's push after it."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpulab.notebooks import life
from gpulab.notebooks.life import NotebookRefused
from gpulab.notebooks.live import NotebookLivePushes
from gpulab.service.tasks.live_push import look_every

from ..conftest import run_async
from ..support.notebooks import PUSHED, World, editor_answers

LIVE = json.dumps(
    {"event": "report", "ok": True, "live": True, "completed": 2, "skipped": 1, "in_flux": 1}
    | {"bytes_transferred": 4096}
)


@pytest.fixture
def answers(monkeypatch):
    editor_answers(monkeypatch)


def world(tmp_path, **settings) -> World:
    w = World(tmp_path, workspace=True)
    for key, value in settings.items():
        setattr(w.s, key, value)
    w.start(gpus="1")
    return w


def pushes_of(w: World) -> NotebookLivePushes:
    return NotebookLivePushes(w.s, w.rt, w.records)


async def settled(pushes: NotebookLivePushes) -> None:
    await asyncio.gather(*pushes.tasks.values())


def test_a_running_notebook_is_pushed_live_once_its_interval_passed(tmp_path, answers):
    w = world(tmp_path, sync_interval_floor=0.1, sync_interval=0.3)
    pushes = pushes_of(w)
    assert run_async(pushes.look()) == 0  # started just now: not one interval yet
    w.rt.script_helper(0, [LIVE])

    async def look_and_wait():
        await asyncio.sleep(0.3)
        n = await pushes.look()
        await settled(pushes)
        return n

    assert run_async(look_and_wait()) == 1
    helper = w.rt.helper_configs[-1]
    assert helper.command[0] == "push" and "--live" in helper.command
    assert helper.command[helper.command.index("--settle-seconds") + 1] == "10"
    record = w.record()
    assert record["state"] == "RUNNING" and record["live_push"]["ok"]
    assert record["live_push"]["files"] == 2 and record["live_push"]["bytes"] == 4096
    assert w.last()["reason"] == "LIVE_PUSH" and w.last()["state"] == "RUNNING"
    assert w.last()["message"] == (
        "live push (every interval): workspace: 2 transferred, 0 unchanged, 1 in flux, 4.0 KB"
    )
    w.rt.script_helper(1, ["gpulab-sync: error: the store said no"])
    run_async(look_and_wait())
    assert w.record()["state"] == "RUNNING"  # a failed live push stops nothing
    assert w.last()["reason"] == "LIVE_PUSH_FAILED" and "the store said no" in w.last()["message"]


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait, a loaded machine's while, for ``predicate`` (never a fixed sleep)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


def test_push_now_is_the_owners_one_at_a_time_and_the_stop_push_comes_after(tmp_path, answers):
    w = world(tmp_path)  # no interval: only on demand
    pushes = pushes_of(w)
    assert run_async(pushes.look()) == 0
    release, live_done = asyncio.Event(), asyncio.Event()
    ran: list[str] = []
    real = w.rt.run_helper

    async def held(spec, on_line, node=""):
        """The helper as the engine runs it: a live push until the test lets it end; a final
        push waits for the volume's lock (--wait-lock) while a live push holds it."""
        live = "--live" in spec.command
        if live:
            await release.wait()
        elif "--wait-lock" in spec.command and ran == [] and not live_done.is_set():
            await live_done.wait()
        try:
            return await real(spec, on_line, node)
        finally:
            ran.append("live" if live else spec.command[0])
            if live:
                live_done.set()

    w.rt.run_helper = held

    async def scenario():
        status, record = await pushes.push(w.record(), by="alice")
        assert status == 202 and record["push_requested"]
        with pytest.raises(NotebookRefused, match="already under way"):
            await pushes.push(w.record(), by="alice")
        await until(lambda: (w.record()["live_push"] or {}).get("running"))  # under way
        assert w.record()["push_requested"] is None
        other = NotebookLivePushes(w.s, w.rt, w.records)  # another service process
        with pytest.raises(NotebookRefused, match="already under way"):
            await other.push(w.record(), by="alice")
        w.rt.script_helper(0, [LIVE])
        w.rt.script_helper(0, [PUSHED])
        stop = asyncio.ensure_future(life.stop(w.nb))  # the hub's stop, meanwhile
        await until(lambda: w.record()["state"] == "STOPPING")
        await asyncio.sleep(0.1)
        assert ran == [] and w.record()["state"] == "STOPPING"  # the final push waits
        release.set()
        await stop
        await settled(pushes)

    run_async(scenario())
    assert ran == ["live", "push"]
    final = w.rt.helper_configs[-1]
    assert "--live" not in final.command and "--wait-lock" in final.command
    record = w.record()
    assert record["state"] == "STOPPED" and "asked by its owner" in record["live_push"]["message"]
    with pytest.raises(NotebookRefused, match="only while it is RUNNING") as e:
        run_async(pushes.push(record, by="alice"))
    assert e.value.status == 409


def test_a_stopping_notebook_is_not_pushed_live(tmp_path, answers):
    w = world(tmp_path)
    pushes = pushes_of(w)
    w.records.request_push("alice", "nb")
    w.records.transition("alice", "nb", life.S.STOPPING, reason="STOP")
    helpers = len(w.rt.helper_configs)

    async def begin():
        pushes._start(("alice", "nb"), "request")
        await settled(pushes)

    run_async(begin())
    assert len(w.rt.helper_configs) == helpers  # its stop's push takes everything
    assert w.record()["push_requested"] is None


def test_the_home_is_pushed_live_with_the_workspace(tmp_path, answers):
    w = World(tmp_path, workspace=True, home=True)
    w.start(gpus="1")
    pushes = pushes_of(w)

    async def now():
        await pushes.push(w.record(), by="alice")
        await settled(pushes)

    run_async(now())
    live = [h for h in w.rt.helper_configs if "--live" in h.command]
    assert len(live) == 2  # the workspace and the home: every volume that pushes
    assert any("--exclude" in h.command for h in live)  # the home's exclusions hold


def test_the_look_is_a_tenth_of_the_floor_within_bounds(tmp_path):
    w = World(tmp_path)
    assert look_every(w.s) == 6.0
    w.s.sync_interval_floor = 1.0
    assert look_every(w.s) == 1.0
    w.s.sync_interval_floor = 3600.0
    assert look_every(w.s) == 30.0


def test_the_home_page_offers_push_now_for_a_running_notebook(tmp_path):
    from gpulab.jobs import overview
    from gpulab.lifecycle import NotebookState as N
    from gpulab.service.pages.base import _env

    from .test_overview import Lab

    lab = Lab(tmp_path)
    lab.notebook("ann", N.STARTING, N.RUNNING, server="nb")
    lab.notebook("ann", N.STARTING, N.FAILED, server="old")
    home = overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=True)
    common = dict(
        prefix="/p/", static="/s/", xsrf_form_html=lambda: "", me={"name": "ann"}, hub="/h/",
        request_path="/p/", users_prefix="/u/", is_admin=False, xsrf_token="", running="RUNNING",
    )  # fmt: skip
    page = _env.get_template("home.html")
    html = page.render(**home, **common)
    assert 'action="/p/notebooks/nb/push"' in html and ">Push now</button>" in html
    assert 'action="/p/notebooks/old/push"' not in html  # FAILED: nothing to push
    lab.notebooks.request_push("ann", "nb")
    lab.notebooks.live_push_began("ann", "nb", "request")
    lab.notebooks.live_push_ended("ann", "nb", True, "live push: workspace: 1 transferred", 1, 9)
    home = overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=True)
    html = page.render(**home, **common)
    assert "live push: workspace: 1 transferred" in html and ">Push now</button>" in html
    lab.notebooks.request_push("ann", "nb")
    home = overview.home_overview(lab.sup, lab.notebooks, "ann", with_notebooks=True)
    html = page.render(**home, **common)
    assert "pushing…" in html and ">Push now</button>" not in html  # one at a time


def test_a_history_keeps_only_the_latest_live_pushes():
    from types import SimpleNamespace

    from gpulab.live_push import MAX_LIVE_PUSH_EVENTS, trim_live_pushes

    events = [SimpleNamespace(reason="SPAWNED")]
    for i in range(MAX_LIVE_PUSH_EVENTS + 30):
        events.append(SimpleNamespace(reason="LIVE_PUSH" if i % 3 else "LIVE_PUSH_FAILED", i=i))
        trim_live_pushes(events)
    assert events[0].reason == "SPAWNED" and len(events) == MAX_LIVE_PUSH_EVENTS + 1
    assert [e.i for e in events[1:]] == list(range(30, MAX_LIVE_PUSH_EVENTS + 30))
