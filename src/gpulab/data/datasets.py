"""The dataset cache: a read-only volume of the same store, bucket, prefix and content as one
another workload (a job or a notebook) pulled to a node is pulled once per node and shared,
read-only, by the workloads that use it at the same time and after.

- **Only what its owner may not write.** A prefix the owner may write (their workspace, a
  writable grant covering it, inside it or around it: :func:`owner_may_write`) is never
  cached: every change of theirs would be a new copy held by the node for one user.

- **Keyed by content.** Before a read-only volume is pulled, the store is listed and a key made
  of every object's key, size and change token (``WorkloadData.listed_content``). The cache
  volume is named after the store, bucket, prefix and that key, and carries its size in its
  name (``<instance>-dataset-<digest>-<bytes>``). A dataset that changed in the store gets a
  new volume; a running workload keeps the copy it started with, never one rewritten under it.
- **One cache per node, in the database.** The hub (notebooks) and the service (jobs) share
  it: each copy is a row of ``dataset_copies`` per (node, volume) with its size, its state
  (``pulling``, ``ready``, ``evicting``), its last use and its pins. Every write is a
  compare-and-set on the state (and the row's version) it read, so that of two processes (or
  two tasks) that race for one copy, one wins and the other reads again (a process settling
  its own claim reads again while only its own renewal, which bumps the version, came
  between: :meth:`DatasetCache._settle`). Leases are instants of each process's
  ``time.time()``: the hub and the service run on one host (or hosts whose clocks agree).
  A copy in ``ready`` was pulled complete and checked: a restart of either process keeps
  trusting it (its volume must still exist; a row whose volume is gone is forgotten and the
  copy pulled again).
- **Pulled once.** The process that claims a copy (a row in ``pulling``, inserted in the same
  transaction that checks the node's room) pulls it, in a task of the cache's own (never the
  workload's: a workload cancelled or interrupted while it waits leaves the pull to the
  others); the others wait, polling the row, at most ``WAIT`` seconds (or until ``stop``),
  then mount the same volume or pull their own. The claim is a lease (``LEASE`` seconds) that
  its process renews while it pulls, and the pull's task always ends it: ready, or given up
  (its volume removed only while the row still confirms the claim is its own). A process that
  died leaves a lapsed claim, which the next comer takes over (the half-pulled volume is
  removed first); its sync helper, labelled with its holder, is reaped
  (:meth:`DatasetCache.reap_helpers`). The pull is capped at the listed size and the store
  listed again after it: a dataset that changed meanwhile is not shared (the workload pulls its
  own). A volume with the cache's name but no row (one left by a process that died before its
  claim, or by an older gpulab) is never trusted: it is removed before the pull. An empty
  dataset is never cached (an engine fills an empty volume from the image of the first
  container that mounts it).
- **Pinned while a workload starts.** A copy handed to a workload is pinned (its row's
  ``pins``) until the workload's containers hold it (then the engine refuses its removal) or
  it gave up its start; its process renews the pin meanwhile, so a pin outlives no process by
  more than ``LEASE`` seconds. Workloads mount copies ``nocopy`` (on one Docker host; a Swarm
  service's mounts do not say it yet): a copy removed after a lapsed pin is an empty
  directory to the container, never filled from its image.
- **Bounded.** ``dataset_cache_max_bytes`` per node, over both processes: a claim counts every
  row on the node (and every cache volume without one), and at most ``MAX_COPIES`` copies,
  and is refused, or makes room, in one transaction. Room is made by moving the least
  recently used ready, unpinned copies to ``evicting`` (a compare-and-set: a pin that came
  first wins) and then removing their volumes; a volume some container still uses (a running
  job's or notebook's, a finished job's kept for ``job_container_retention``) is refused by
  the engine, its row goes back to ``ready`` as used now (the next eviction tries the others
  first), and it stays. A dataset that cannot fit is pulled into the workload's own volume,
  as without the cache.
- **Who pays.** Each workload's owner is charged the dataset's size against their disk quota as
  if the workload held a copy of its own (the caller books it under the workload's own volume
  before asking the cache; released with the workload's volumes): quotas mean what they
  meant, and a dataset beyond the owner's quota is refused as before. (The charge is the
  booking's listing: a dataset that grew before the cache's listing is charged the less.)
  The disk saved is the platform's; the cache's own cap bounds what it keeps.
- **Per node, on a Swarm too.** The runtime finds, lists and removes a node's volumes through
  that node's own engine (a manager sees none), and every row is keyed by its node.
- **Isolation.** A copy is handed out only to an owner whose grants allow its store, bucket and
  prefix, checked again here (``check_access``) beside the check at submission or spawn; it
  holds exactly what the store holds under that prefix, and workloads mount it read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import delete, select, update

from ..db import Database, DatasetCopy
from ..lifecycle import utcnow
from ..names import L_WORKLOAD
from ..runtime.base import EngineError
from ..volumes import VolumeError, WorkspaceLocation, check_access
from .sync import SyncOutcome, VolumeSync, WorkloadData

log = logging.getLogger("gpulab.datasets")

_SIZE = re.compile(r"-(\d{1,20})$")

PULLING, READY, EVICTING = "pulling", "ready", "evicting"
#: seconds a claim (a pull, an eviction) or a pin lasts unless its process renews it
LEASE = 60.0
#: seconds between two looks of a waiting workload at a copy another one pulls
POLL = 0.5
#: seconds a workload waits for a copy (pulled by another, or by its own process for it)
#: before it pulls its own volume, as without the cache
WAIT = 900.0
#: seconds between two looks at a waiting workload's interruption (``stop``)
STOP_EVERY = 1.0
#: copies one node's cache holds at most, whatever their sizes (each is a row and a volume)
MAX_COPIES = 200


def cache_prefix(instance: str) -> str:
    return f"{instance}-dataset-"


def cache_volume_name(instance: str, vol: VolumeSync, content_key: str, size: int) -> str:
    """The cache volume of ``vol``'s store, bucket and prefix with this content."""
    spec = vol.spec
    what = "\0".join((spec.store, spec.bucket, spec.prefix.strip("/"), content_key))
    return f"{cache_prefix(instance)}{hashlib.sha256(what.encode()).hexdigest()[:40]}-{size}"


def pull_label_prefix(instance: str) -> str:
    """The start of the workload label of every process's cache pulls (their helpers)."""
    return f"{instance}/dataset/"


def cached_size(instance: str, name: str) -> int | None:
    """The bytes a cache volume's name says it holds (None: not a cache volume)."""
    if not name.startswith(cache_prefix(instance)):
        return None
    m = _SIZE.search(name)
    return int(m.group(1)) if m else None


def evictions(
    held: dict[str, int],
    last_used: dict[str, float],
    need: int,
    cap: int,
    in_use: frozenset[str] = frozenset(),
    max_count: int = MAX_COPIES,
) -> list[str] | None:
    """Which cache volumes to remove, least recently used first, so that ``need`` more bytes
    fit under ``cap`` beside the others, and one more copy under ``max_count`` (a pure rule).
    ``in_use``: volumes that cannot go (a container uses them, a workload was handed them, a
    pull or an eviction holds them): they stay and still count. Their names, or None when
    even removing every other one leaves no room."""
    if need > cap or max_count < 1:
        return None
    total, count = sum(held.values()), len(held)
    out: list[str] = []
    for name in sorted(set(held) - in_use, key=lambda n: (last_used.get(n, 0.0), n)):
        if total + need <= cap and count + 1 <= max_count:
            break
        out.append(name)
        total -= held[name]
        count -= 1
    return out if total + need <= cap and count + 1 <= max_count else None


def owner_may_write(owner: str, spec, grants, workspace: WorkspaceLocation | None) -> bool:
    """Whether ``owner`` may change anything under ``spec``'s prefix, or under a prefix
    inside it (a pure rule): a grant of theirs with a writable mode (rw, rwd) whose prefix
    contains it or lies inside it, or their own workspace. Such a dataset is never cached:
    every change would be a new copy, held by the node for one user."""
    prefix = spec.prefix.strip("/")

    def overlaps(other: str) -> bool:
        other = other.strip("/")
        return _within(prefix, other) or _within(other, prefix)

    ours = workspace is not None and (spec.store, spec.bucket) == (
        workspace.store,
        workspace.bucket,
    )
    if ours and overlaps(f"{workspace.root.strip('/')}/{owner}"):
        return True
    for g in grants:
        if (g.store, g.bucket) != (spec.store, spec.bucket) or not g.modes - {"ro"}:
            continue
        if g.users is not None and owner not in g.users:
            continue
        if overlaps(g.prefix):
            return True
    return False


def _within(prefix: str, root: str) -> bool:
    return not root or prefix == root or prefix.startswith(root + "/")


def live_pins(pins: dict | None, now: float) -> dict[str, float]:
    """The pins not yet lapsed at ``now`` (epoch seconds)."""
    return {w: float(t) for w, t in (pins or {}).items() if float(t) > now}


def default_holder() -> str:
    """host:pid:random: unique per process (and per cache object), readable in a query."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


# --- the records --------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """A row of ``dataset_copies``, as read."""

    node: str
    volume: str
    bytes: int
    state: str
    holder: str
    lease_until: float  # epoch seconds (0: none)
    pins: dict[str, float]
    last_used: float
    version: int

    def lapsed(self, now: float) -> bool:
        """A claim (pulling, evicting) whose process stopped renewing it."""
        return self.state != READY and self.lease_until <= now


@dataclass(frozen=True)
class Claim:
    """What :meth:`DatasetCopies.claim` did: ``claimed`` (a pulling row is ours), ``taken``
    (a row is there: read it), ``full`` (no room, whatever goes), or ``evict``: these
    volumes are ours to remove (their rows ``evicting``; those without a row are volumes the
    cache does not know), then claim again."""

    outcome: str
    evict: tuple[str, ...] = ()


class _Raced(Exception):
    """A compare-and-set inside a claim lost: its transaction is rolled back."""


def _epoch(at: datetime | None) -> float:
    return at.timestamp() if at is not None else 0.0


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _copy(r: DatasetCopy) -> Copy:
    return Copy(
        r.node,
        r.volume,
        int(r.bytes),
        r.state,
        r.holder,
        _epoch(r.lease_until),
        {w: float(t) for w, t in (r.pins or {}).items()},
        _epoch(r.last_used),
        r.version,
    )


class DatasetCopies:
    """The cache's rows: every change a compare-and-set on the state and version read."""

    def __init__(self, db: Database, instance: str):
        self.db = db
        self.instance = instance

    def _where(self, node: str, volume: str):
        return (
            DatasetCopy.instance == self.instance,
            DatasetCopy.node == node,
            DatasetCopy.volume == volume,
        )

    def get(self, node: str, volume: str) -> Copy | None:
        with self.db.read() as s:
            row = s.scalar(select(DatasetCopy).where(*self._where(node, volume)))
            return _copy(row) if row is not None else None

    def all(self, node: str | None = None) -> list[Copy]:
        with self.db.read() as s:
            q = select(DatasetCopy).where(DatasetCopy.instance == self.instance)
            if node is not None:
                q = q.where(DatasetCopy.node == node)
            return [_copy(r) for r in s.scalars(q.order_by(DatasetCopy.id))]

    def _cas(self, s, seen: Copy, **values) -> bool:
        """Change ``seen``'s row if it still is what was read (its state and version)."""
        result = s.execute(
            update(DatasetCopy)
            .where(
                *self._where(seen.node, seen.volume),
                DatasetCopy.state == seen.state,
                DatasetCopy.version == seen.version,
            )
            .values(version=DatasetCopy.version + 1, **values)
        )
        return result.rowcount == 1

    def change(self, seen: Copy, **values) -> bool:
        """A compare-and-set of ``seen``'s row (its state and version); False: it changed."""
        with self.db.session() as s:
            return self._cas(s, seen, **values)

    def _forget(self, s, seen: Copy) -> bool:
        result = s.execute(
            delete(DatasetCopy).where(
                *self._where(seen.node, seen.volume),
                DatasetCopy.state == seen.state,
                DatasetCopy.version == seen.version,
            )
        )
        return result.rowcount == 1

    def drop(self, seen: Copy) -> bool:
        """The row goes, if it still is ``seen`` (its state and version)."""
        with self.db.session() as s:
            return self._forget(s, seen)

    def claim(
        self,
        node: str,
        volume: str,
        size: int,
        cap: int,
        holder: str,
        strays: dict[str, int],
        refused: frozenset[str] = frozenset(),
        max_count: int = MAX_COPIES,
    ) -> Claim:
        """Claim the pull of ``volume`` (``size`` bytes) on ``node`` if the node's copies
        leave room under ``cap`` (one transaction, serialized per node: two processes cannot
        both take the last room); else mark what must go to make room. ``strays``: cache
        volumes on the node without a row (bytes by name); ``refused``: volumes the engine
        would not remove (in use); ``max_count``: the most copies the node may hold."""
        now = time.time()
        try:
            return self._claim(node, volume, size, cap, holder, strays, refused, now, max_count)
        except _Raced:  # rolled back: nothing of it was written
            return Claim("taken")

    def _claim(self, node, volume, size, cap, holder, strays, refused, now, max_count) -> Claim:
        with self.db.session() as s:
            self.db.serialize(s, "gpulab-datasets", self.instance, node)
            rows = [
                _copy(r)
                for r in s.scalars(
                    select(DatasetCopy).where(
                        DatasetCopy.instance == self.instance, DatasetCopy.node == node
                    )
                )
            ]
            if any(r.volume == volume for r in rows):
                return Claim("taken")
            held = {n: b for n, b in strays.items() if n != volume}
            held.update({r.volume: r.bytes for r in rows})
            used = {r.volume: r.last_used for r in rows}  # strays: 0, the oldest
            # what may go: ready copies nobody was handed, and claims whose process died (a
            # half-pulled copy, an eviction cut short)
            stay = set(refused) | {
                r.volume
                for r in rows
                if (r.state != READY and not r.lapsed(now)) or live_pins(r.pins, now)
            }
            plan = evictions(held, used, size, cap, frozenset(stay), max_count)
            if plan is None:
                return Claim("full")
            if plan:
                lease = _at(now + LEASE)
                for r in rows:
                    if r.volume not in plan:
                        continue
                    if r.state == PULLING:
                        # its puller died: the half-pulled volume becomes a stray (never
                        # trusted), which the caller removes
                        if not self._forget(s, r):
                            raise _Raced
                    elif not self._cas(s, r, state=EVICTING, holder=holder, lease_until=lease):
                        raise _Raced  # a pin came first: none of them is marked
                return Claim("evict", tuple(plan))
            s.add(
                DatasetCopy(
                    instance=self.instance,
                    node=node,
                    volume=volume,
                    bytes=size,
                    state=PULLING,
                    holder=holder,
                    lease_until=_at(now + LEASE),
                    pins={},
                    last_used=utcnow(),
                    version=1,
                )
            )
            return Claim("claimed")

    def unpin(self, workload: str) -> int:
        """``workload``'s pins go, from every copy (its containers hold them now, or it will
        not start); how many."""
        gone = 0
        for _ in range(20):
            conflicts = 0
            for c in self.all():
                if workload not in c.pins:
                    continue
                pins = {w: t for w, t in c.pins.items() if w != workload}
                if self.change(c, pins=pins):
                    gone += 1
                else:
                    conflicts += 1
            if not conflicts:
                return gone
        log.warning("dataset cache: the pins of %s kept changing; they lapse", workload)
        return gone


# --- the cache ----------------------------------------------------------------------------


class DatasetCache:
    """A process's handle on the dataset cache of every node (see the module): the hub's
    notebooks and the service's jobs each hold one, on the same database."""

    def __init__(self, copies: DatasetCopies, settings, runtime, holder: str | None = None):
        self.copies = copies
        self.settings = settings
        self.runtime = runtime
        self.holder = holder or default_holder()
        self.lease = LEASE
        self.poll = POLL
        self.wait_limit = WAIT
        self.max_copies = MAX_COPIES
        #: this process's pins, by copy (node, volume): renewed until released
        self.pinned: dict[tuple[str, str], set[str]] = {}
        #: this process's claims (pulls, evictions) under way: renewed until done
        self.claims: set[tuple[str, str]] = set()
        #: this process's pulls under way, each a task of the cache's own (never a
        #: workload's: a workload that stops waiting does not abort a pull others wait on)
        self.pulling: dict[tuple[str, str], asyncio.Task] = {}
        #: the last pulls made (node, name): what the benchmark and the tests count
        self.pulls: deque[tuple[str, str]] = deque(maxlen=1000)
        self._renewing: asyncio.Task | None = None
        self._news: asyncio.Event | None = None

    @property
    def pull_label(self) -> str:
        """The workload label of this process's cache pulls (their sync helpers): the
        holder's, so that a sweep can tell a live process's helper from a dead one's."""
        return f"{pull_label_prefix(self.settings.instance)}{self.holder}"

    async def _db(self, fn, *args, **kw):
        return await asyncio.to_thread(fn, *args, **kw)

    # --- pins -------------------------------------------------------------------------------

    async def release(self, workload: str) -> None:
        """The workload's containers hold its copies now (the engine refuses their removal),
        or it will not start: its pins go."""
        for where in list(self.pinned):
            self._unhold(where, workload)
        try:
            await self._db(self.copies.unpin, workload)
        except Exception as e:  # noqa: BLE001 - they lapse within a lease
            log.warning("dataset cache: pins of %s not released (%s); they lapse", workload, e)

    def _hold(self, where: tuple[str, str], workload: str) -> None:
        self.pinned.setdefault(where, set()).add(workload)
        self._keep_renewing()

    def _unhold(self, where: tuple[str, str], workload: str) -> None:
        held = self.pinned.get(where)
        if held is not None:
            held.discard(workload)
            if not held:
                del self.pinned[where]

    def _keep_renewing(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        """Renew this process's claims and pins every third of a lease, while it holds any."""
        while self.pinned or self.claims:
            await asyncio.sleep(self.lease / 3)
            held = {where: set(ws) for where, ws in self.pinned.items()}
            try:
                await self._db(self.renew_now, held, set(self.claims))
            except Exception as e:  # noqa: BLE001 - the next round tries again
                log.warning("dataset cache: leases not renewed (%s)", e)

    def renew_now(self, pinned: dict[tuple[str, str], set[str]], claims: set) -> None:
        """(Blocking.) Push the lease of these pins and claims (this process's)."""
        until = time.time() + self.lease
        for node, volume in set(pinned) | claims:
            for _ in range(5):
                c = self.copies.get(node, volume)
                if c is None:
                    break
                values: dict = {}
                mine = pinned.get((node, volume), set())
                if mine & set(c.pins):
                    values["pins"] = {w: (until if w in mine else t) for w, t in c.pins.items()}
                if c.state != READY and c.holder == self.holder:
                    values["lease_until"] = _at(until)
                if not values or self.copies.change(c, **values):
                    break

    def _told(self) -> None:
        """Wake this process's waiters (a copy changed): others' find out by polling."""
        if self._news is not None:
            self._news.set()
        self._news = None

    async def _wait(self) -> None:
        if self._news is None:
            self._news = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._news.wait(), self.poll)

    # --- handing a copy out -----------------------------------------------------------------

    async def volume_for(
        self, owner: str, workload: str, vol: VolumeSync, on_progress, stop=None
    ) -> tuple[VolumeSync | None, SyncOutcome | None]:
        """``vol`` (a read-only volume of ``owner``'s ``workload``) through the cache: (the
        cache volume to mount, ready and pinned for the workload until :meth:`release`, and
        the outcome of the pull that filled it now, or None when it was there), or (None,
        None) when it is not cached: the cache is off, the owner's grants do not cover it or
        let them write under it, the dataset is empty or does not fit, the store cannot be
        listed, the pull failed or the dataset changed during it, the wait for it passed
        ``wait_limit`` or ``stop`` (an async callable) said the workload is to stop, or
        anything failed on the way (the engine, the database). The workload then pulls its
        own volume as without the cache (or stops), and that pull says what is wrong."""
        s = self.settings
        cap = s.dataset_cache_max_size
        if not cap or vol.spec.mode != "ro":
            return None, None
        grants, workspace = s.storage.grants, s.storage.workspace
        try:  # the grants of today, not only of the submission: a copy is never a way round
            check_access(owner, vol.spec, grants, workspace)
        except VolumeError as e:
            log.info("dataset %s not cached for %s: %s", vol.label, owner, e)
            return None, None
        if owner_may_write(owner, vol.spec, grants, workspace):
            # the owner's own data (every change of theirs a new copy): only what the admin's
            # grants give them read-only is shared
            log.info("dataset %s not cached: %s may write under it", vol.label, owner)
            return None, None
        data = WorkloadData(
            self.runtime, s.storage.stores, s.sync_image, s.instance, self.pull_label
        )
        try:
            return await self._volume_for(workload, data, vol, on_progress, stop, cap)
        except Exception as e:  # noqa: BLE001 - the workload's own pull then says what is wrong
            log.warning("dataset %s not cached: %s", vol.label, e)
            return None, None

    async def _volume_for(self, workload, data, vol, on_progress, stop, cap):
        try:
            size, key = await asyncio.to_thread(data.listed_content, vol)
        except Exception as e:  # noqa: BLE001 - the workload's own pull then says what is wrong
            log.info("dataset %s not cached: cannot list it (%s)", vol.label, e)
            return None, None
        if size == 0 or size > cap:
            # an empty volume is filled by the engine from its first container's image at the
            # mount: never one that other users' workloads mount
            return None, None
        name = cache_volume_name(self.settings.instance, vol, key, size)
        cached = VolumeSync(vol.spec, name, vol.label, vol.node)
        until = time.monotonic() + self.wait_limit
        outcome = None
        while True:
            got = await self._ready_or_claimed(workload, vol.node, name, size, cap, until, stop)
            if got is None:
                return None, None
            if got == READY:
                return cached, outcome
            # claimed: pulled by a task of the cache's own, then pinned like a ready copy
            relay = [on_progress]
            task = self._start_pull(data, vol, cached, size, key, relay)
            try:
                outcome = await self._await_pull(task, until, stop)
            finally:  # a workload that stops waiting hears no more of the pull
                relay[0] = None
            if outcome is None:
                return None, None

    def _start_pull(self, data, vol, cached, size, key, relay) -> asyncio.Task:
        where = (cached.node, cached.docker_volume)

        def progress(p: dict) -> None:
            if relay[0] is not None:
                relay[0](p)

        task = asyncio.get_running_loop().create_task(
            self._pull(data, vol, cached, size, key, progress)
        )
        self.pulling[where] = task
        return task

    async def _await_pull(self, task: asyncio.Task, until: float, stop) -> SyncOutcome | None:
        """The pull's outcome, or None when it did not make a copy, ``until`` passed or
        ``stop`` said so (the pull goes on for the others: a cancelled caller, too, leaves
        it running)."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                log.warning("dataset cache: stopped waiting for the pull of its copy")
                return None
            done, _ = await asyncio.wait({task}, timeout=min(left, STOP_EVERY))
            if done:
                return None if task.cancelled() else task.result()
            if stop is not None and await stop():
                return None

    async def _ready_or_claimed(
        self, workload: str, node: str, name: str, size: int, cap: int, until: float, stop
    ) -> str | None:
        """READY: the copy is there, pinned for ``workload``; PULLING: this process claimed
        its pull (the caller starts it at once); None: not cached (no room, a stray volume
        in use, the wait passed ``until``, ``stop``)."""
        refused: set[str] = set()
        next_look = time.monotonic() + STOP_EVERY
        while True:
            c = await self._db(self.copies.get, node, name)
            now = time.time()
            if c is None:
                strays = await self._strays(node)
                claim = await self._db(
                    self.copies.claim,
                    node,
                    name,
                    size,
                    cap,
                    self.holder,
                    strays,
                    frozenset(refused),
                    self.max_copies,
                )
                if claim.outcome == "full":
                    where = f"node {node}" if node else "this host"
                    log.info("dataset cache on %s: no room for %d bytes", where, size)
                    return None
                if claim.outcome == "evict":
                    await self._evict(node, claim.evict, refused)
                    continue
                if claim.outcome == "claimed":
                    self.claims.add((node, name))
                    self._keep_renewing()
                    return PULLING
                continue  # taken meanwhile: read it
            if c.state == READY:
                pins = {**live_pins(c.pins, now), workload: now + self.lease}
                if not await self._db(self.copies.change, c, pins=pins, last_used=utcnow()):
                    continue  # changed meanwhile (a pin, an eviction): read it again
                self._hold((node, name), workload)
                if await self.runtime.volume_exists(name, node):
                    return READY
                # its volume is gone (removed by hand): the row is forgotten, pulled again
                log.warning("dataset cache: %s is gone from %s; pulled again", name, node or "")
                self._unhold((node, name), workload)
                c = await self._db(self.copies.get, node, name)
                if c is not None and c.state == READY:
                    await self._db(self.copies.drop, c)
                continue
            if c.lapsed(now) and (node, name) not in self.pulling:
                if c.state == EVICTING:  # its remover died: it was ready; the check above
                    await self._db(self.copies.change, c, state=READY, holder="", lease_until=None)
                    continue
                # its puller died: the half-pulled volume is ours to remove and pull again
                lease = _at(now + self.lease)
                if await self._db(self.copies.change, c, holder=self.holder, lease_until=lease):
                    self.claims.add((node, name))
                    self._keep_renewing()
                    return PULLING
                continue
            # pulled or evicted by another (or by this process for another workload): wait,
            # within bounds, then look again
            if time.monotonic() >= until:
                log.warning("dataset cache: %s not ready in time; pulled apart", name)
                return None
            if stop is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + STOP_EVERY
                if await stop():
                    return None
            await self._wait()

    async def _strays(self, node: str) -> dict[str, int]:
        """Cache volumes on ``node`` (with their sizes) that have no row."""
        instance = self.settings.instance
        known = {c.volume for c in await self._db(self.copies.all, node)}
        out = {}
        for vol, at in await self.runtime.volumes_named(cache_prefix(instance), node):
            size = cached_size(instance, vol)
            if at == node and size is not None and vol not in known:
                out[vol] = size
        return out

    async def _evict(self, node: str, names: tuple[str, ...], refused: set[str]) -> None:
        """Remove the copies :meth:`DatasetCopies.claim` marked ``evicting`` for this process
        (and the stray volumes it named); one a container uses goes back to ``ready``, as
        used now (the next eviction tries the others first)."""
        for name in names:
            where = (node, name)
            c = await self._db(self.copies.get, node, name)
            mine = c is not None and c.state == EVICTING and c.holder == self.holder
            if c is not None and not mine:
                continue
            if mine:
                self.claims.add(where)
            try:
                removed = await self._remove(node, name)
                if not mine:
                    if not removed:
                        refused.add(name)
                    continue
                if removed:
                    await self._settle(where, EVICTING, drop=True)
                    log.info("dataset cache: removed %s (least recently used)", name)
                else:
                    refused.add(name)
                    await self._settle(
                        where,
                        EVICTING,
                        state=READY,
                        holder="",
                        lease_until=None,
                        last_used=utcnow(),
                    )
            finally:
                self.claims.discard(where)
            self._told()

    async def _settle(self, where: tuple[str, str], expect: str, drop=False, **values) -> bool:
        """A compare-and-set (or with ``drop``, the removal) of this process's claim on
        ``where``, read anew while only a renewal of its own (which bumps the version) came
        between; False: the row is not this process's claim in ``expect`` any more."""
        for _ in range(10):
            c = await self._db(self.copies.get, *where)
            if c is None or c.state != expect or c.holder != self.holder:
                return False
            if (
                await self._db(self.copies.drop, c)
                if drop
                else await self._db(self.copies.change, c, **values)
            ):
                return True
        log.warning("dataset cache: %s kept changing; its claim lapses", where[1])
        return False

    async def _pull(
        self,
        data: WorkloadData,
        vol: VolumeSync,
        cached: VolumeSync,
        size: int,
        key: str,
        on_progress,
    ) -> SyncOutcome | None:
        """(A task of the cache's own.) Pull the copy this process claimed: ready (the
        outcome), else its claim ended, its volume removed while the claim was still
        confirmed this process's, and its row gone (None). Whatever happens (a failure, an
        error, a cancellation), the claim ends here: never left renewed by nobody's pull."""
        where = (cached.node, cached.docker_volume)
        ready = False
        try:
            # a volume by that name without a row is not trusted: it goes first
            if not await self._remove(*where):
                return None
            self.pulls.append(where)
            outcome = await data.run("pull", cached, on_progress, max_bytes=size)
            if not outcome.ok:
                return None
            try:
                again = await asyncio.to_thread(data.listed_content, vol)
            except Exception:  # noqa: BLE001 - unchecked: not shared
                again = None
            if again != (size, key):  # changed while it was pulled: not the named content
                log.info("dataset %s changed during its pull: not cached", vol.label)
                return None
            ready = await self._settle(
                where, PULLING, state=READY, holder="", lease_until=None, last_used=utcnow()
            )
            if not ready:
                # its claim lapsed and another process took it over (it removes what is there)
                log.warning("dataset cache: the pull of %s lost its claim; not shared", where[1])
                return None
            return outcome
        except Exception as e:  # noqa: BLE001 - not shared: the workloads pull their own
            log.warning("dataset cache: the pull of %s failed: %s", where[1], e)
            return None
        finally:
            if not ready:
                await self._give_up(*where)
            if self.pulling.get(where) is asyncio.current_task():  # (not a later claim's)
                del self.pulling[where]
                self.claims.discard(where)
            self._told()

    async def reap_helpers(self, helpers) -> list[str]:
        """Remove the cache pulls' sync helpers (``helpers``: the engine's, any process's)
        whose process holds no live claim: one that died, or whose claim lapsed and was taken
        over (its helper would still write into the volume). The holders reaped."""
        prefix = pull_label_prefix(self.settings.instance)
        pulls = [h for h in helpers if h.labels.get(L_WORKLOAD, "").startswith(prefix)]
        if not pulls:
            return []
        now = time.time()
        live = {
            c.holder
            for c in await self._db(self.copies.all)
            if c.state == PULLING and not c.lapsed(now)
        }
        if self.pulling:
            live.add(self.holder)
        reaped = []
        for h in pulls:
            holder = h.labels[L_WORKLOAD][len(prefix) :]
            if holder not in live and await self.runtime.remove(h.id):
                log.warning("dataset cache: removed the pull helper of %s (no live claim)", holder)
                reaped.append(holder)
        return reaped

    async def close(self) -> None:
        """Stop renewing and end this process's pulls (their claims given up): a process
        that stops, or a service that lost its lease. What it still holds lapses within a
        lease."""
        pulls = list(self.pulling.values())
        for task in pulls:
            task.cancel()
        for task in pulls:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _give_up(self, node: str, name: str) -> None:
        """This process's claim ends without a copy: its volume is removed only while the
        row confirms the claim is still this process's (its lease pushed first, so that no
        other takes it over meanwhile), then its row goes. A claim another process took
        over is left alone: the volume is the other's now."""
        where = (node, name)
        try:
            if not await self._settle(where, PULLING, lease_until=_at(time.time() + self.lease)):
                return
            if not await self._remove(node, name):  # its helper still runs: a stray now,
                log.info("dataset cache: %s left as a stray", name)  # removed before a pull
            await self._settle(where, PULLING, drop=True)
        except Exception as e:  # noqa: BLE001 - the claim lapses within a lease
            log.warning("dataset cache: the claim on %s not given up (%s); it lapses", name, e)

    async def _remove(self, node: str, name: str) -> bool:
        """Remove a volume (True, also when there was none); False when a container uses it."""
        try:
            await self.runtime.remove_volume(name, node)
        except EngineError as e:  # in use by a container: never evicted
            log.info("dataset cache: %s stays (%s)", name, e)
            return False
        return True
