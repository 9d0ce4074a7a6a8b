"""The dataset cache's state machine (gpulab.data.datasets) on the fake Runtime and a real
SQLite database: two cache objects on one database stand for the hub's and the service's
processes. What jobs make of it: tests/unit/test_supervisor.py ("the dataset cache");
notebooks: below and tests/integration/test_dataset_cache.py."""

from __future__ import annotations

import asyncio
import json
import time

from gpulab.data.datasets import (
    EVICTING,
    PULLING,
    READY,
    DatasetCache,
    DatasetCopies,
    _at,
    cache_prefix,
)
from gpulab.data.sync import VolumeSync
from gpulab.db import Database
from gpulab.notebooks import life
from gpulab.settings import GpulabSettings
from gpulab.volumes import parse_volume

from ..conftest import run_async
from ..support.fake_runtime import EngineError, FakeRuntime, HelperResult
from ..support.notebooks import SYNC, World, editor_answers

OK = json.dumps({"event": "report", "ok": True, "completed": 1})


class Engine(FakeRuntime):
    """The fake engine whose sync helpers succeed, each pull waiting for ``gate`` (when set)
    so that a test can hold a pull under way."""

    def __init__(self, **kw):
        super().__init__(images={SYNC}, **kw)
        self.gate: asyncio.Event | None = None
        self.failing = False
        #: by holder (the pull helper's workload label ends with it): its own gate, failure
        self.gates: dict[str, asyncio.Event] = {}
        self.failing_for: set[str] = set()

    async def run_helper(self, spec, on_line, node: str = ""):
        result = await super().run_helper(spec, on_line, node)
        holder = spec.labels.get("org.gpulab.workload", "").rsplit("/", 1)[-1]
        gate = self.gates.get(holder, self.gate)
        if gate is not None:
            await gate.wait()
        if self.failing or holder in self.failing_for:
            return HelperResult(1, ["the store is down"])
        on_line(OK)
        return result


class Site:
    """A site with one filesystem store (bucket ``data``, granted to ann only), a database,
    and an engine; :meth:`cache` makes one process's cache on them."""

    def __init__(self, tmp_path, cap: str = "1K"):
        self.tmp = tmp_path
        store = tmp_path / "store"
        store.mkdir(exist_ok=True)
        self.settings = GpulabSettings(
            instance="t",
            sync_image=SYNC,
            object_stores={"local": {"kind": "filesystem", "root": str(store)}},
            volume_grants=[{"store": "local", "bucket": "data", "users": ["ann"], "modes": ["ro"]}],
            dataset_cache_max_bytes=cap,
        )
        self.db = Database(f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
        self.rt = Engine()
        self.copies = DatasetCopies(self.db, "t")

    def cache(self, holder: str) -> DatasetCache:
        c = DatasetCache(DatasetCopies(self.db, "t"), self.settings, self.rt, holder)
        c.poll = 0.01
        return c

    def dataset(self, name: str, files: dict[str, str]) -> VolumeSync:
        root = self.tmp / "store" / "data" / name
        root.mkdir(parents=True, exist_ok=True)
        for rel, text in files.items():
            (root / rel).write_text(text)
        spec = parse_volume(f"data@local/{name}:/{name}:ro", self.settings.storage.stores)
        return VolumeSync(spec, f"t-own-{name}", str(spec), "")

    def pulls(self) -> list[str]:
        return [
            m.volume
            for h in self.rt.helper_configs
            if h.command[0] == "pull"
            for m in h.mounts
            if m.volume.startswith(cache_prefix("t"))
        ]

    def row(self, volume: str):
        return self.copies.get("", volume)


def quiet(_):
    return None


async def die(cache: DatasetCache, *tasks: asyncio.Task) -> None:
    """``cache``'s process dies: its tasks stop where they are, and nothing it would do at a
    clean stop (giving its claims up) is done."""

    async def nothing(*_):
        return None

    cache._give_up = nothing
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await cache.close()


def test_two_processes_racing_for_one_copy_pull_it_once_and_share_it(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"train.csv": "1,2,3\n"})
    hub, service = site.cache("hub"), site.cache("service")

    async def test():
        site.rt.gate = asyncio.Event()
        first = asyncio.create_task(service.volume_for("ann", "job-1", vol, quiet))
        second = asyncio.create_task(hub.volume_for("ann", "nb-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (name,) = site.pulls()
        row = site.row(name)
        assert row.state == PULLING and row.bytes == 6 and row.lease_until > time.time()
        await asyncio.sleep(0.1)  # the other waits: no second pull while one is under way
        assert len(site.pulls()) == 1 and not second.done()
        site.rt.gate.set()
        (a, one), (b, other) = await first, await second
        assert {a.docker_volume, b.docker_volume} == {name}
        assert sorted([one is None, other is None]) == [False, True]  # one pulled, one found
        assert (one or other).ok
        assert len(site.pulls()) == 1
        row = site.row(name)
        assert row.state == READY and set(row.pins) == {"job-1", "nb-1"}
        await service.release("job-1")
        await hub.release("nb-1")
        assert site.row(name).pins == {} and hub.pinned == {} == service.pinned
        await hub.close()
        await service.close()

    run_async(test())


def test_a_restarted_process_trusts_a_ready_copy_and_forgets_one_whose_volume_is_gone(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        before = site.cache("service")
        (copy, _) = await before.volume_for("ann", "job-1", vol, quiet)
        await before.release("job-1")
        await before.close()
        after = site.cache("service-restarted")  # a new process, a new holder
        (again, pulled) = await after.volume_for("ann", "job-2", vol, quiet)
        assert again.docker_volume == copy.docker_volume and pulled is None
        assert len(site.pulls()) == 1 and site.rt.names("remove_volume") == [copy.docker_volume]
        await after.release("job-2")
        site.rt.volumes.discard((copy.docker_volume, ""))  # removed by hand
        (third, pulled) = await after.volume_for("ann", "job-3", vol, quiet)
        assert third.docker_volume == copy.docker_volume and pulled.ok
        assert len(site.pulls()) == 2 and site.row(copy.docker_volume).state == READY
        await after.close()

    run_async(test())


def test_a_pull_whose_process_died_is_taken_over_once_its_lease_lapses(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        dead = site.cache("dead")
        name = None
        site.rt.gate = asyncio.Event()
        task = asyncio.create_task(dead.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (name,) = site.pulls()
        await die(dead, task)  # mid-pull: its row stays, its lease runs out
        site.rt.gate = None
        row = site.row(name)
        assert row.state == PULLING and row.holder == "dead"
        alive = site.cache("alive")
        waiting = asyncio.create_task(alive.volume_for("ann", "job-2", vol, quiet))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # the lease still holds: it waits
        assert site.copies.change(site.row(name), lease_until=_at(time.time() - 1))
        (copy, pulled) = await waiting
        assert copy.docker_volume == name and pulled.ok and len(site.pulls()) == 2
        assert site.rt.names("remove_volume").count(name) == 2  # before each pull: never trusted
        row = site.row(name)
        assert row.state == READY and row.holder == "" and set(row.pins) == {"job-2"}
        await alive.close()

    run_async(test())


def test_an_eviction_and_a_pin_race_by_compare_and_set_and_one_wins(tmp_path):
    """Two 6-byte datasets under a 10-byte cap. A pin read before an eviction marked the copy
    loses; a pin that came first keeps the copy and the other dataset is not cached."""
    site = Site(tmp_path, cap="10")
    a = site.dataset("a", {"f": "aaaaaa"})
    b = site.dataset("b", {"f": "bbbbbb"})

    async def test():
        hub, service = site.cache("hub"), site.cache("service")
        (copy_a, _) = await service.volume_for("ann", "job-1", a, quiet)
        await service.release("job-1")
        seen = site.row(copy_a.docker_volume)
        # the hub pins a first: the service's claim for b finds no room (a stays)
        assert (await hub.volume_for("ann", "nb-1", a, quiet))[0] is not None
        assert await service.volume_for("ann", "job-2", b, quiet) == (None, None)
        assert site.row(copy_a.docker_volume).state == READY
        # a pin written from a read before an eviction marked the copy is refused
        await hub.release("nb-1")
        marked = site.copies.claim("", "t-dataset-b-6", 6, 10, "service", {})
        assert marked.outcome == "evict" and marked.evict == (copy_a.docker_volume,)
        assert site.row(copy_a.docker_volume).state == EVICTING
        assert not site.copies.change(seen, pins={"nb-2": time.time() + 60})
        # the hub asking now waits for the eviction, then pulls it anew
        asking = asyncio.create_task(hub.volume_for("ann", "nb-2", a, quiet))
        await asyncio.sleep(0.05)
        assert not asking.done()
        await service._evict("", marked.evict, set())
        (again, pulled) = await asking
        assert again.docker_volume == copy_a.docker_volume and pulled.ok
        # removed before its first pull (no row: not trusted), by the eviction, and before
        # its pull anew
        assert site.rt.names("remove_volume").count(copy_a.docker_volume) == 3
        assert len(site.pulls()) == 2
        await hub.close()
        await service.close()

    run_async(test())


def test_a_copy_a_container_uses_is_never_evicted_its_row_goes_back_to_ready(tmp_path):
    site = Site(tmp_path, cap="10")
    a = site.dataset("a", {"f": "aaaaaa"})
    b = site.dataset("b", {"f": "bbbbbb"})

    async def test():
        hub, service = site.cache("hub"), site.cache("service")
        (copy_a, _) = await hub.volume_for("ann", "nb-1", a, quiet)
        real = site.rt.remove_volume

        async def in_use(name, node=""):
            if name == copy_a.docker_volume:
                raise EngineError("volume is in use", status=409)
            return await real(name, node)

        site.rt.remove_volume = in_use
        await hub.release("nb-1")  # its container holds it now: the engine is the guard
        assert await service.volume_for("ann", "job-1", b, quiet) == (None, None)
        row = site.row(copy_a.docker_volume)
        assert (
            row.state == READY
            and row.holder == ""
            and (copy_a.docker_volume, "") in (site.rt.volumes)
        )
        site.rt.remove_volume = real  # the container is gone: now it makes room
        (copy_b, _) = await service.volume_for("ann", "job-2", b, quiet)
        assert copy_b is not None and site.row(copy_a.docker_volume) is None
        assert [c.volume for c in site.copies.all()] == [copy_b.docker_volume]
        await hub.close()
        await service.close()

    run_async(test())


def test_the_cap_holds_over_both_processes_and_counts_stray_volumes(tmp_path):
    site = Site(tmp_path, cap="10")
    a = site.dataset("a", {"f": "aaaaaa"})
    b = site.dataset("b", {"f": "bbbbbb"})

    async def test():
        hub, service = site.cache("hub"), site.cache("service")
        site.rt.gate = asyncio.Event()
        pulling = asyncio.create_task(hub.volume_for("ann", "nb-1", a, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        # a's pull (6 bytes) holds its room: b (6) does not fit beside it, whoever asks
        assert await service.volume_for("ann", "job-1", b, quiet) == (None, None)
        site.rt.gate.set()
        await pulling
        await hub.release("nb-1")
        # a stray volume of the cache (no row: an older gpulab's) counts and goes first
        site.rt.add_volume("t-dataset-stray-4")
        (copy_b, _) = await service.volume_for("ann", "job-2", b, quiet)
        assert copy_b is not None
        assert ("t-dataset-stray-4", "") not in site.rt.volumes
        await hub.close()
        await service.close()

    run_async(test())


def test_a_failed_pull_an_empty_dataset_and_another_user_s_prefix_are_not_cached(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})
    (site.tmp / "store" / "data" / "empty").mkdir()
    empty = VolumeSync(
        parse_volume("data@local/empty:/e:ro", site.settings.storage.stores), "t-own-e", "e", ""
    )

    async def test():
        cache = site.cache("service")
        assert await cache.volume_for("bob", "job-b", vol, quiet) == (None, None)  # no grant
        assert await cache.volume_for("ann", "job-e", empty, quiet) == (None, None)
        assert site.pulls() == []
        site.rt.failing = True
        assert await cache.volume_for("ann", "job-1", vol, quiet) == (None, None)
        assert len(site.pulls()) == 1 and site.copies.all() == []
        assert [v for v, _ in site.rt.volumes if v.startswith("t-dataset-")] == []
        await cache.close()

    run_async(test())


def test_a_process_renews_its_pins_and_pulls_until_it_lets_them_go(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        cache.lease = 0.3  # renewed every 0.1 s
        (copy, _) = await cache.volume_for("ann", "job-1", vol, quiet)
        first = site.row(copy.docker_volume).pins["job-1"]
        deadline = time.monotonic() + 5
        while site.row(copy.docker_volume).pins["job-1"] <= first:  # renewed, still pinned
            assert time.monotonic() < deadline, "the pin was not renewed"
            await asyncio.sleep(0.05)
        await cache.release("job-1")
        assert site.row(copy.docker_volume).pins == {}
        await cache.close()

    run_async(test())


# --- notebooks ---------------------------------------------------------------------------


def notebook_world(tmp_path) -> World:
    """alice's notebook with the cache on (the hub's process), bucket ``data`` granted to
    every user, and a 6-byte dataset under data/mnist."""
    w = World(tmp_path, workspace=True)
    w.s.volume_grants = [{"store": "local", "bucket": "data", "modes": ["ro"]}]
    w.s.__dict__.pop("storage", None)  # (read again with the grant)
    w.s.dataset_cache_max_bytes = "1K"
    data = tmp_path / "objects" / "data" / "mnist"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("1,2,3\n")
    for _ in range(4):
        w.rt.script_helper(0, [OK])
    w.nb.datasets = DatasetCache(DatasetCopies(w.records.db, "t"), w.s, w.rt, "hub")
    return w


def test_a_notebook_mounts_the_node_s_copy_read_only_and_lets_its_pin_go(tmp_path, monkeypatch):
    editor_answers(monkeypatch)
    w = notebook_world(tmp_path)
    # a job (the service's process) pulled it to this host first
    service = DatasetCache(DatasetCopies(w.records.db, "t"), w.s, w.rt, "service")
    spec = parse_volume("data@local/mnist:/data:ro", w.s.storage.stores)
    (copy, pulled) = run_async(
        service.volume_for("alice", "job-1", VolumeSync(spec, "t-j", str(spec), ""), quiet)
    )
    assert pulled.ok
    run_async(service.release("job-1"))
    w.start(volumes="data@local/mnist:/data:ro")
    mounts = w.rt.workloads[w.nb.container].spec.mounts
    assert [(m.volume, m.read_only, m.no_copy) for m in mounts if m.target == "/data"] == [
        (copy.docker_volume, True, True)  # never filled from the image if it went missing
    ]
    assert [m.no_copy for m in mounts if m.target != "/data"] == [False]  # the workspace
    pulls = [h for h in w.rt.helper_configs if h.command[0] == "pull"]
    assert [m.volume for h in pulls for m in h.mounts] == [copy.docker_volume]  # once
    assert any("the node's copy in the dataset cache" in m for _, m in w.events)
    assert DatasetCopies(w.records.db, "t").get("", copy.docker_volume).pins == {}
    assert w.disk.held("alice") == 6  # charged as if it held its own copy
    # at the stop only the workspace is pushed: a read-only volume never is
    run_async(life.stop(w.nb))
    pushes = [h for h in w.rt.helper_configs if h.command[0] == "push"]
    assert [m.volume for h in pushes for m in h.mounts] == [w.nb.volume]


def test_a_notebook_whose_start_fails_lets_its_pin_go(tmp_path, monkeypatch):
    editor_answers(monkeypatch)
    w = notebook_world(tmp_path)
    w.rt.fail("create_and_start", EngineError("could not select device driver"))
    w.refused(w.start, volumes="data@local/mnist:/data:ro")
    (row,) = DatasetCopies(w.records.db, "t").all()
    assert row.state == READY and row.pins == {} and w.nb.datasets.pinned == {}


def test_a_half_pulled_copy_whose_process_died_makes_room_and_is_never_trusted(tmp_path):
    site = Site(tmp_path, cap="10")
    a = site.dataset("a", {"f": "aaaaaa"})
    b = site.dataset("b", {"f": "bbbbbb"})

    async def test():
        dead, service = site.cache("dead"), site.cache("service")
        site.rt.gate = asyncio.Event()
        task = asyncio.create_task(dead.volume_for("ann", "job-1", a, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (half,) = site.pulls()
        await die(dead, task)  # mid-pull
        site.rt.gate = None
        # while its claim holds, the room it took is its own: b does not fit
        assert await service.volume_for("ann", "job-2", b, quiet) == (None, None)
        assert site.copies.change(site.row(half), lease_until=_at(time.time() - 1))
        (copy_b, pulled) = await service.volume_for("ann", "job-3", b, quiet)
        assert copy_b is not None and pulled.ok
        assert site.row(half) is None and (half, "") not in site.rt.volumes
        await service.close()

    run_async(test())


def test_an_eviction_cut_short_by_its_process_s_death_leaves_the_copy_ready(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        (copy, _) = await cache.volume_for("ann", "job-1", vol, quiet)
        await cache.release("job-1")
        row = site.row(copy.docker_volume)
        gone = _at(time.time() - 1)  # marked by a process that died before removing it
        assert site.copies.change(row, state=EVICTING, holder="dead", lease_until=gone)
        (again, pulled) = await cache.volume_for("ann", "job-2", vol, quiet)
        assert again.docker_volume == copy.docker_volume and pulled is None
        row = site.row(copy.docker_volume)
        assert row.state == READY and row.holder == "" and set(row.pins) == {"job-2"}
        assert len(site.pulls()) == 1
        await cache.close()

    run_async(test())


# --- claims end whatever happens to the workload (review findings H1, M1, M2, M4, M5) -----


def test_a_workload_cancelled_mid_pull_leaves_the_pull_to_end_for_the_others(tmp_path):
    """A notebook's start cancelled by the hub (its start_timeout) while it pulls: the pull is
    the cache's, not the workload's; it ends, its claim with it, and the waiter shares it."""
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        hub, service = site.cache("hub"), site.cache("service")
        site.rt.gate = asyncio.Event()
        starting = asyncio.create_task(hub.volume_for("ann", "nb-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (name,) = site.pulls()
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await hub.release("nb-1")  # (the spawner's finally)
        waiting = asyncio.create_task(service.volume_for("ann", "job-1", vol, quiet))
        await asyncio.sleep(0.05)
        assert not waiting.done() and len(site.pulls()) == 1
        site.rt.gate.set()
        (copy, pulled) = await asyncio.wait_for(waiting, 5)
        assert copy.docker_volume == name and pulled is None  # the hub's pull, shared
        row = site.row(name)
        assert row.state == READY and row.holder == "" and set(row.pins) == {"job-1"}
        assert hub.claims == set() and hub.pulling == {} and hub.pinned == {}
        await hub.close()
        await service.close()

    run_async(test())


def test_an_error_after_the_claim_ends_it_and_the_workload_pulls_its_own(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        real = cache.copies.change

        def change(seen, **values):
            if values.get("state") == READY:
                raise RuntimeError("the database went away")
            return real(seen, **values)

        cache.copies.change = change
        assert await asyncio.wait_for(cache.volume_for("ann", "job-1", vol, quiet), 5) == (
            None,
            None,
        )
        (name,) = site.pulls()
        assert site.copies.all() == [] and (name, "") not in site.rt.volumes
        assert cache.claims == set() and cache.pulling == {}
        await cache.close()

    run_async(test())


def test_a_clean_stop_gives_its_pulls_claims_up(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        site.rt.gate = asyncio.Event()
        asking = asyncio.create_task(cache.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        await cache.close()  # (a service that lost its lease, or stops)
        assert await asyncio.wait_for(asking, 5) == (None, None)
        assert site.copies.all() == [] and cache.claims == set() and cache.pulling == {}

    run_async(test())


def test_a_late_failure_never_removes_the_copy_of_the_process_that_took_its_claim_over(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        slow, other = site.cache("slow"), site.cache("other")
        site.rt.gates["slow"] = asyncio.Event()
        first = asyncio.create_task(slow.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (name,) = site.pulls()
        # its renewals failed for a lease: the claim lapsed, another took it over and shared it
        assert site.copies.change(site.row(name), lease_until=_at(time.time() - 1))
        (copy, pulled) = await other.volume_for("ann", "nb-1", vol, quiet)
        assert copy.docker_volume == name and pulled.ok and site.row(name).state == READY
        site.rt.failing_for.add("slow")  # and now the first pull fails
        site.rt.gates["slow"].set()
        assert await asyncio.wait_for(first, 5) == (None, None)
        assert (name, "") in site.rt.volumes  # the other's copy stays
        row = site.row(name)
        assert row.state == READY and set(row.pins) == {"nb-1"}
        await slow.close()
        await other.close()

    run_async(test())


def test_a_renewal_landing_before_the_copy_is_marked_ready_does_not_lose_it(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        real = cache.copies.change
        renewed = []

        def change(seen, **values):
            if values.get("state") == READY and not renewed:
                # the renewal task read the row before and writes its lease now
                later = _at(time.time() + 60)
                renewed.append(real(site.row(seen.volume), lease_until=later))
            return real(seen, **values)

        cache.copies.change = change
        (copy, pulled) = await cache.volume_for("ann", "job-1", vol, quiet)
        assert renewed == [True] and copy is not None and pulled.ok
        row = site.row(copy.docker_volume)
        assert row.state == READY and set(row.pins) == {"job-1"} and cache.claims == set()
        await cache.close()

    run_async(test())


def test_the_engine_failing_inside_the_cache_is_not_cached_not_an_error(tmp_path):
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")

        async def down(*_):
            raise EngineError("the engine is down", status=500)

        site.rt.volumes_named = down  # a claim lists the node's cache volumes
        assert await cache.volume_for("ann", "job-1", vol, quiet) == (None, None)
        del site.rt.volumes_named
        (copy, _) = await cache.volume_for("ann", "job-2", vol, quiet)
        await cache.release("job-2")
        site.rt.volume_exists = down  # a ready copy's volume is looked at
        assert await cache.volume_for("ann", "job-3", vol, quiet) == (None, None)
        await cache.close()

    run_async(test())


def test_a_wait_for_another_s_pull_is_bounded_and_stops_when_asked(tmp_path, monkeypatch):
    from gpulab.data import datasets

    monkeypatch.setattr(datasets, "STOP_EVERY", 0.05)
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        stuck, patient, stopped = site.cache("stuck"), site.cache("p"), site.cache("s")
        site.rt.gates["stuck"] = asyncio.Event()  # a helper that never ends (renewed)
        pulling = asyncio.create_task(stuck.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        patient.wait_limit = 0.3
        assert await asyncio.wait_for(patient.volume_for("ann", "j2", vol, quiet), 5) == (
            None,
            None,
        )

        async def interrupt() -> bool:
            return True

        asked = stopped.volume_for("ann", "j3", vol, quiet, interrupt)
        assert await asyncio.wait_for(asked, 5) == (None, None)
        site.rt.gates["stuck"].set()
        assert (await pulling)[0] is not None
        for c in (stuck, patient, stopped):
            await c.close()

    run_async(test())


# --- what is cached, and how many (M6, L1) ---------------------------------------------


def test_only_what_the_owner_may_not_write_is_cached():
    from gpulab.data.datasets import owner_may_write
    from gpulab.volumes import Grant, VolumeSpec, WorkspaceLocation

    ws = WorkspaceLocation("s3", "home", "workspaces")

    def spec(bucket, prefix):
        return VolumeSpec(bucket=bucket, store="s3", prefix=prefix, mount="/d", mode="ro")

    ro = Grant("s3", "data", "", frozenset({"ro"}))
    rw_sub = Grant("s3", "data", "sets/mine", frozenset({"ro", "rw"}), frozenset({"ann"}))
    assert not owner_may_write("ann", spec("data", "sets"), [ro], ws)
    assert owner_may_write("ann", spec("data", "sets"), [ro, rw_sub], ws)  # inside it
    assert owner_may_write("ann", spec("data", "sets/mine/x"), [ro, rw_sub], ws)  # around it
    assert not owner_may_write("bob", spec("data", "sets"), [ro, rw_sub], ws)  # not bob's
    assert not owner_may_write("ann", spec("data", "sets/other"), [ro, rw_sub], ws)
    assert owner_may_write("ann", spec("home", "workspaces/ann/d"), [], ws)  # their own
    assert not owner_may_write("ann", spec("home", "shared"), [], ws)


def test_a_prefix_its_owner_may_write_is_never_cached(tmp_path):
    site = Site(tmp_path)
    site.settings.volume_grants = [
        {"store": "local", "bucket": "data", "modes": ["ro"]},
        {"store": "local", "bucket": "data", "prefix": "mine", "users": ["ann"]},
    ]
    site.settings.__dict__.pop("storage", None)  # (read again with the grants)
    mine = site.dataset("mine", {"f": "abc"})
    shared = site.dataset("shared", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        assert await cache.volume_for("ann", "job-1", mine, quiet) == (None, None)
        assert site.pulls() == []
        assert (await cache.volume_for("ann", "job-2", shared, quiet))[0] is not None
        await cache.close()

    run_async(test())


def test_a_node_holds_at_most_max_copies_whatever_their_size(tmp_path):
    from gpulab.data.datasets import evictions

    assert evictions({"a": 1, "b": 1}, {"a": 1.0, "b": 2.0}, 1, 100, max_count=2) == ["a"]
    assert evictions({"a": 1, "b": 1}, {}, 1, 100, frozenset({"a", "b"}), max_count=2) is None
    site = Site(tmp_path)
    a, b = site.dataset("a", {"f": "a"}), site.dataset("b", {"f": "b"})

    async def test():
        cache = site.cache("service")
        cache.max_copies = 1
        (copy_a, _) = await cache.volume_for("ann", "job-1", a, quiet)
        await cache.release("job-1")
        (copy_b, _) = await cache.volume_for("ann", "job-2", b, quiet)
        assert [c.volume for c in site.copies.all()] == [copy_b.docker_volume]
        await cache.close()

    run_async(test())


def test_a_copy_a_container_uses_is_not_tried_first_at_the_next_eviction(tmp_path):
    """a (in use by a container, the oldest) and b (pinned by a starting notebook) fill the
    cap: c finds no room, and a's refusal counts as a use. Once b's pin goes, c evicts b
    without asking the engine to remove a again."""
    site = Site(tmp_path, cap="12")
    a, b, c = (site.dataset(n, {"f": n * 6}) for n in "abc")

    async def test():
        hub, service = site.cache("hub"), site.cache("service")
        (copy_a, _) = await hub.volume_for("ann", "nb-a", a, quiet)
        await hub.release("nb-a")
        (copy_b, _) = await hub.volume_for("ann", "nb-b", b, quiet)
        real, tried = site.rt.remove_volume, []

        async def in_use(name, node=""):
            if name == copy_a.docker_volume:
                tried.append(name)
                raise EngineError("volume is in use", status=409)
            return await real(name, node)

        site.rt.remove_volume = in_use
        assert await service.volume_for("ann", "job-1", c, quiet) == (None, None)
        assert tried == [copy_a.docker_volume]
        await hub.release("nb-b")
        (copy_c, _) = await service.volume_for("ann", "job-2", c, quiet)
        assert copy_c is not None and site.row(copy_b.docker_volume) is None
        assert tried == [copy_a.docker_volume]  # not asked again
        await hub.close()
        await service.close()

    run_async(test())


def test_one_copy_mounted_at_two_paths_keeps_both_and_is_never_filled_from_the_image():
    """A workload mounting one prefix twice gets the one cache volume at both paths: the
    engine's binds are a list (a dict by volume kept only the last)."""
    from gpulab.runtime.base import Mount, WorkloadSpec
    from gpulab.runtime.objects import workload_container_config

    copy = "t-dataset-abc-6"
    spec = WorkloadSpec(
        name="j",
        image="i",
        command=["x"],
        runner=False,
        mounts=[Mount(copy, "/a", True, True), Mount(copy, "/b", True, True), Mount("w", "/w")],
    )
    binds = workload_container_config(spec, "env", "/r.sh")["host_config"]["binds"]
    assert binds == [f"{copy}:/a:ro,nocopy", f"{copy}:/b:ro,nocopy", "w:/w:rw"]
    # on a Swarm too: both paths, read-only, and a copy missing on the node is never filled
    # from the image
    from gpulab.runtime.swarm_specs import service_spec

    mounts = service_spec(spec, None, None)["TaskTemplate"]["ContainerSpec"]["Mounts"]
    assert [
        (m["Source"], m["Target"], m["ReadOnly"], m.get("VolumeOptions"))
        for m in mounts
        if m["Type"] == "volume"
    ] == [
        (copy, "/a", True, {"NoCopy": True}),
        (copy, "/b", True, {"NoCopy": True}),
        ("w", "/w", False, None),
    ]


def test_a_pull_helper_whose_process_holds_no_live_claim_is_reaped(tmp_path):
    """The helpers of cache pulls carry their process's holder: the hub's reconciliation and
    the service's recovery remove those of a process with no live claim (one that died:
    a takeover would otherwise find the volume in use until the helper ends)."""
    from gpulab.runtime.base import Labelled

    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        live, sweeper = site.cache("live"), site.cache("sweeper")
        site.rt.gates["live"] = asyncio.Event()
        pulling = asyncio.create_task(live.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (label,) = {h.labels["org.gpulab.workload"] for h in site.rt.helper_configs}
        assert label == "t/dataset/live"

        def helper(holder):
            labels = {"org.gpulab.workload": f"t/dataset/{holder}"}
            return Labelled(f"id-{holder}", f"h-{holder}", labels, True)

        removed = []

        async def remove(cid):
            removed.append(cid)
            return True

        site.rt.remove = remove
        assert await sweeper.reap_helpers([helper("live"), helper("dead")]) == ["dead"]
        assert removed == ["id-dead"]
        site.rt.gates["live"].set()
        await pulling
        # its claim is over: a helper still labelled with it is an orphan now
        assert await sweeper.reap_helpers([helper("live")]) == ["live"]
        await live.close()
        await sweeper.close()

    run_async(test())


def test_a_pull_s_end_leaves_a_later_claim_of_the_same_copy_alone(tmp_path):
    """A failed pull's row is gone before its task has finished ending: another workload of
    the same process claims the copy meanwhile. The first task's end must not take that
    claim's entry (unrenewed, and a clean stop would not end its pull)."""
    site = Site(tmp_path)
    vol = site.dataset("mnist", {"f": "abc"})

    async def test():
        cache = site.cache("service")
        real_drop = cache.copies.drop

        def slow_drop(seen):
            gone = real_drop(seen)
            if seen.state == PULLING:
                time.sleep(0.3)  # the row is gone; its task resumes late
            return gone

        cache.copies.drop = slow_drop
        site.rt.failing, site.rt.gate = True, asyncio.Event()
        first = asyncio.create_task(cache.volume_for("ann", "job-1", vol, quiet))
        while not site.pulls():
            await asyncio.sleep(0.01)
        (name,) = site.pulls()
        second = asyncio.create_task(cache.volume_for("ann", "job-2", vol, quiet))
        await asyncio.sleep(0.05)  # it waits for the first's pull
        gate, site.rt.gate = site.rt.gate, asyncio.Event()  # the next pull is held
        gate.set()  # the first pull fails
        assert await asyncio.wait_for(first, 5) == (None, None)
        assert len(site.pulls()) == 2  # the second's, under way
        task = cache.pulling.get(("", name))
        assert task is not None and not task.done() and ("", name) in cache.claims
        site.rt.failing = False
        site.rt.gate.set()
        (copy, pulled) = await asyncio.wait_for(second, 5)
        assert copy.docker_volume == name and pulled.ok
        await cache.close()

    run_async(test())
