"""The dataset cache: a job's read-only volume of the same store, bucket, prefix and content
as another's is pulled once per node and shared, read-only, by the jobs that use it at the same
time and after.

- **Keyed by content.** Before a read-only volume is pulled, the store is listed and a key made
  of every object's key, size and change token (``WorkloadData.listed_content``). The cache
  volume is named after the store, bucket, prefix and that key, and carries its size in its
  name (``<instance>-dataset-<digest>-<bytes>``), so that the engine's list of volumes is the
  cache's index, after a restart too. A dataset that changed in the store gets a new volume;
  a running job keeps the copy it started with, never one rewritten under it.
- **Pulled once.** One pull per (node, volume) at a time (a lock per cache volume): the jobs
  that arrive meanwhile wait for it, then mount the same volume. The pull is capped at the
  listed size and the store listed again after it: a dataset that changed meanwhile is not
  shared (the job pulls its own). A copy this process did not pull and check (one a restart
  left, or one an engine made again) is removed before it is pulled anew, never trusted. An
  empty dataset is never cached (an engine fills an empty volume from the image of the first
  container that mounts it).
- **Pinned while a job starts.** A copy handed to a job cannot be evicted until the job's
  containers hold it (then the engine refuses its removal) or the job gave up its start.
- **Bounded.** ``dataset_cache_max_bytes`` per node: before a new dataset is pulled, the least
  recently used cache volumes are removed until it fits; a volume some container still uses
  (a running job's, a finished one's kept for ``job_container_retention``) is refused by the
  engine and stays. A dataset that cannot fit is pulled into the job's own volume, as without
  the cache.
- **Who pays.** Each job's owner is charged the dataset's size against their disk quota as if
  the job held a copy of its own (booked before the cache is asked, released with the job's
  volumes): quotas mean what they meant, and a dataset beyond the owner's quota is refused as
  before. The disk saved is the platform's; the cache's own cap bounds what it keeps.
- **One host.** On a Swarm the manager sees no node's volumes, so it could neither find nor
  evict a copy: there each job pulls its own, as before.
- **Isolation.** The cache changes nothing of who may read what: a volume spec is checked
  against the admin's grants at submission as before, and a cache volume holds exactly what the
  store holds under a prefix that every job mounting it was granted. Jobs mount it read-only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import deque

from ..runtime.base import EngineError
from .sync import SyncOutcome, VolumeSync, WorkloadData

log = logging.getLogger("gpulab.jobs")

_SIZE = re.compile(r"-(\d{1,20})$")


def cache_prefix(instance: str) -> str:
    return f"{instance}-dataset-"


def cache_volume_name(instance: str, vol: VolumeSync, content_key: str, size: int) -> str:
    """The cache volume of ``vol``'s store, bucket and prefix with this content."""
    spec = vol.spec
    what = "\0".join((spec.store, spec.bucket, spec.prefix.strip("/"), content_key))
    return f"{cache_prefix(instance)}{hashlib.sha256(what.encode()).hexdigest()[:40]}-{size}"


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
) -> list[str] | None:
    """Which cache volumes to remove, least recently used first, so that ``need`` more bytes
    fit under ``cap`` beside the others (a pure rule). ``in_use``: volumes the engine refused
    to remove (a container uses them): they stay and still count. Their names, or None when
    even removing every other one leaves no room."""
    if need > cap:
        return None
    total = sum(held.values())
    out: list[str] = []
    for name in sorted(set(held) - in_use, key=lambda n: (last_used.get(n, 0.0), n)):
        if total + need <= cap:
            break
        out.append(name)
        total -= held[name]
    return out if total + need <= cap else None


class DatasetCache:
    """The supervisor's cache of read-only datasets, per node (see the module)."""

    def __init__(self) -> None:
        self.last_used: dict[tuple[str, str], float] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        #: cache volumes pulled complete, and checked, by this process (node, name)
        self.ready: set[tuple[str, str]] = set()
        #: copies handed to jobs whose containers do not hold them yet: never evicted
        self.pinned: dict[tuple[str, str], set[str]] = {}
        #: the last pulls made (node, name): what the benchmark and the tests count
        self.pulls: deque[tuple[str, str]] = deque(maxlen=1000)

    def release(self, job_id: str) -> None:
        """The job's containers hold its copies now (the engine refuses their removal), or
        it will not start: its pins go."""
        for where in list(self.pinned):
            self.pinned[where].discard(job_id)
            if not self.pinned[where]:
                del self.pinned[where]

    async def volume_for(
        self, ctx, job_id: str, vol: VolumeSync, on_progress
    ) -> tuple[VolumeSync | None, SyncOutcome | None]:
        """``vol`` (a read-only volume of job ``job_id``) through the cache: (the cache volume
        to mount, ready and pinned for the job until :meth:`release`, and the outcome of the
        pull that filled it now, or None when it was there), or (None, None) when it is not
        cached: the cache is off, the dataset is empty or does not fit, the store cannot be
        listed, the pull failed or the dataset changed during it. The job then pulls its own
        volume as without the cache, and that pull says what is wrong."""
        s = ctx.settings
        cap = s.dataset_cache_max_size
        if not cap or vol.spec.mode != "ro" or ctx.runtime.clustered:
            # a Swarm's manager sees no node's volumes: it could neither find nor evict a copy
            return None, None
        data = WorkloadData(ctx.runtime, s.storage.stores, s.sync_image, s.instance, "dataset")
        try:
            size, key = await asyncio.to_thread(data.listed_content, vol)
        except Exception as e:  # noqa: BLE001 - the job's own pull then says what is wrong
            log.info("dataset %s not cached: cannot list it (%s)", vol.label, e)
            return None, None
        if size == 0 or size > cap:
            # an empty volume is filled by the engine from its first container's image at the
            # mount: never one that other users' jobs mount
            return None, None
        name = cache_volume_name(s.instance, vol, key, size)
        cached = VolumeSync(vol.spec, name, vol.label, vol.node)
        where = (vol.node, name)
        async with self._locks.setdefault(where, asyncio.Lock()):
            self.last_used[where] = time.time()
            if where in self.ready and await ctx.runtime.volume_exists(name, vol.node):
                self.pinned.setdefault(where, set()).add(job_id)
                return cached, None
            self.ready.discard(where)
            # a copy this process did not pull and check (a restart's, one removed and made
            # again by an engine) is not trusted: it goes first; in use, the job pulls its own
            if not await self._remove(ctx, vol.node, name):
                return None, None
            if not await self._make_room(ctx, vol.node, name, size, cap):
                return None, None
            self.pulls.append(where)
            outcome = await data.run("pull", cached, on_progress, max_bytes=size)
            if outcome.ok:
                try:
                    again = await asyncio.to_thread(data.listed_content, vol)
                except Exception:  # noqa: BLE001 - unchecked: not shared
                    again = None
                if again != (size, key):  # changed while it was pulled: not the named content
                    log.info("dataset %s changed during its pull: not cached", vol.label)
                    outcome = None
            if outcome is None or not outcome.ok:
                await self._remove(ctx, vol.node, name)
                return None, None
            self.ready.add(where)
            self.last_used[where] = time.time()
            self.pinned.setdefault(where, set()).add(job_id)
            return cached, outcome

    async def _make_room(self, ctx, node: str, name: str, size: int, cap: int) -> bool:
        """Room for ``size`` more bytes on ``node`` under ``cap``, by removing the least
        recently used cache volumes that no container uses and no starting job was handed;
        False when there is none."""
        instance = ctx.settings.instance
        async with self._locks.setdefault((node, ""), asyncio.Lock()):  # one node's room
            held = {}
            for vol, at in await ctx.runtime.volumes_named(cache_prefix(instance)):
                got = cached_size(instance, vol)
                if at == node and got is not None and vol != name:
                    held[vol] = got
            used = {n: t for (at, n), t in self.last_used.items() if at == node}
            in_use = {n for (at, n) in self.pinned if at == node}
            while True:
                plan = evictions(held, used, size, cap, frozenset(in_use))
                if plan is None:
                    where = f"node {node}" if node else "this host"
                    log.info("dataset cache on %s: no room for %d bytes", where, size)
                    return False
                if not plan:
                    return True
                victim = plan[0]
                if await self._remove(ctx, node, victim):
                    log.info("dataset cache: removed %s (least recently used)", victim)
                    held.pop(victim)
                else:
                    in_use.add(victim)

    async def _remove(self, ctx, node: str, name: str) -> bool:
        """Remove a copy (True, also when there was none); False when a container uses it."""
        if (node, name) in self.pinned:
            return False
        try:
            await ctx.runtime.remove_volume(name, node)
        except EngineError as e:  # in use by a container: never evicted
            log.info("dataset cache: %s stays (%s)", name, e)
            return False
        self.ready.discard((node, name))
        self.last_used.pop((node, name), None)
        lock = self._locks.get((node, name))
        if lock is not None and not lock.locked():
            del self._locks[(node, name)]
        return True
