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
  that arrive meanwhile wait for it, then mount the same volume. A cache volume the engine
  already holds is pulled again through the sync's manifest, which transfers nothing when it
  is complete and finishes one a restart cut short.
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

from ...data.sync import SyncOutcome, VolumeSync, WorkloadData
from ...runtime.base import EngineError

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
        #: cache volumes pulled complete by this process (node, name)
        self.ready: set[tuple[str, str]] = set()
        #: pulls made (node, name): what the benchmark and the tests count
        self.pulls: list[tuple[str, str]] = []

    async def volume_for(
        self, ctx, vol: VolumeSync, on_progress
    ) -> tuple[VolumeSync | None, SyncOutcome | None]:
        """``vol`` (a read-only volume of a job) through the cache: (the cache volume to mount,
        ready, and the outcome of the pull that filled it now, or None when it was there),
        (None, None) when it is not cached (the cache is off, the dataset does not fit, the
        store cannot be listed: the job pulls its own volume as before), or (None, the failed
        pull's outcome)."""
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
        if size > cap:
            return None, None
        name = cache_volume_name(s.instance, vol, key, size)
        cached = VolumeSync(vol.spec, name, vol.label, vol.node)
        where = (vol.node, name)
        async with self._locks.setdefault(where, asyncio.Lock()):
            self.last_used[where] = time.time()
            if where in self.ready and await ctx.runtime.volume_exists(name, vol.node):
                return cached, None
            self.ready.discard(where)
            if not await self._make_room(ctx, vol.node, name, size, cap):
                return None, None
            self.pulls.append(where)
            outcome = await data.run("pull", cached, on_progress)
            if not outcome.ok:
                await self._remove(ctx, vol.node, name)
                return None, outcome
            self.ready.add(where)
            self.last_used[where] = time.time()
            return cached, outcome

    async def _make_room(self, ctx, node: str, name: str, size: int, cap: int) -> bool:
        """Room for ``size`` more bytes on ``node`` under ``cap``, by removing the least
        recently used cache volumes no container uses; False when there is none."""
        instance = ctx.settings.instance
        async with self._locks.setdefault((node, ""), asyncio.Lock()):  # one node's room
            held = {}
            for vol, at in await ctx.runtime.volumes_named(cache_prefix(instance)):
                got = cached_size(instance, vol)
                if at == node and got is not None:
                    held[vol] = got
            if name in held:
                return True  # there already (a restart cut its pull short): the pull ends it
            used = {n: t for (at, n), t in self.last_used.items() if at == node}
            in_use: set[str] = set()
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
        try:
            await ctx.runtime.remove_volume(name, node)
        except EngineError as e:  # in use by a container: never evicted
            log.info("dataset cache: %s stays (%s)", name, e)
            return False
        self.ready.discard((node, name))
        self.last_used.pop((node, name), None)
        return True
