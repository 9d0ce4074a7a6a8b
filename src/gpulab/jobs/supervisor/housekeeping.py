"""The supervisor's housekeeping: finished jobs' containers and volumes removed after the
retention delay, and, after a restart of the service, orphaned helpers, containers, volumes
and networks swept away. Functions handed a :class:`~.context.JobContext`."""

from __future__ import annotations

import asyncio
import logging
import time

from ...lifecycle import JobState, utcnow
from ...names import L_WORKLOAD, rank_name
from ...runtime.base import EngineError
from ..gang import spec_workers
from ..records import ACTIVE
from ..spec import JobSpec
from .context import JobContext
from .git_sources import git_volume_names, git_volume_prefix

log = logging.getLogger("gpulab.jobs.supervisor")
J = JobState
#: seconds between sweeps for containers whose job record is gone
ORPHAN_SWEEP_INTERVAL = 60.0
#: ended jobs (and a gang's ranks) removed at once by a cleanup pass
CLEANUP_AT_ONCE = 8
#: the longest wait before a job whose removal failed is tried again
CLEANUP_BACKOFF_MAX = 300.0


async def cleanup(ctx: JobContext, last_sweep: float) -> float:
    """Remove finished jobs' containers and data volumes after the retention delay (the
    records and saved logs stay). A SYNC_FAILED job keeps both: its volumes hold the
    output that is not pushed yet (a retried push, then the delay, removes them).

    Up to :data:`CLEANUP_AT_ONCE` jobs are removed at once, so that jobs on a node that does
    not answer hold the pass for one of its time-outs, not one per job. A job whose removal
    failed is tried again after a backoff (:func:`cleanup_delay`), logged at WARNING at its
    first failure only."""
    now = utcnow().timestamp()
    due = []
    clock = time.monotonic()
    for job_id, _container, updated, state, spec, node in await ctx.db(
        ctx.records.ended_with_container
    ):
        if state == J.SYNC_FAILED.value:
            continue
        if now - updated.timestamp() <= ctx.settings.job_container_retention:
            continue
        if ctx.cleanup_backoff.get(job_id, (0, 0.0))[1] > clock:
            continue
        due.append((job_id, spec, node))
    gate = asyncio.Semaphore(CLEANUP_AT_ONCE)

    async def one(job_id: str, spec: dict, node: str) -> bool:
        async with gate:
            try:
                await remove_from_engine(ctx, job_id, spec, node)
            except EngineError as e:  # in use (a push retry?), a node down: try again later
                failures = ctx.cleanup_backoff.get(job_id, (0, 0.0))[0] + 1
                wait = cleanup_delay(failures)
                if len(ctx.cleanup_backoff) < 10_000 or job_id in ctx.cleanup_backoff:
                    ctx.cleanup_backoff[job_id] = (failures, time.monotonic() + wait)
                level = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(
                    level,
                    "job %s: volumes not removed yet (tried %d times; again in %g s): %s",
                    job_id,
                    failures,
                    wait,
                    e,
                )
                return False
            ctx.cleanup_backoff.pop(job_id, None)
            await ctx.db(ctx.records.forget_container, job_id)
            return True

    removed = await asyncio.gather(*(one(*d) for d in due))
    if any(removed):
        await prune_networks(ctx)
    if now - last_sweep > ORPHAN_SWEEP_INTERVAL:
        last_sweep = now
        await remove_orphan_containers(ctx)
        await remove_helper_leftovers(ctx)
    return last_sweep


def cleanup_delay(failures: int) -> float:
    """Seconds before an ended job whose removal failed ``failures`` times is tried again:
    none after the first (the next pass), then doubling from 2 s up to 5 minutes."""
    if failures <= 1:
        return 0.0
    return min(CLEANUP_BACKOFF_MAX, 2.0 ** (failures - 1))


async def remove_from_engine(ctx: JobContext, job_id: str, spec: dict, node: str) -> None:
    """Remove an ended job's containers (every worker's, at once: each removal waits for
    its node's engine) and its volumes (on each node it ran on); the record and saved logs
    stay."""
    name = ctx.container_name(job_id)
    gate = asyncio.Semaphore(CLEANUP_AT_ONCE)

    async def rank(r: int) -> None:
        async with gate:
            await ctx.runtime.remove(rank_name(name, r))

    # every rank tried, the first failure raised once all are done
    ranks = range(spec_workers(spec))
    done = await asyncio.gather(*(rank(r) for r in ranks), return_exceptions=True)
    for res in done:
        if isinstance(res, BaseException):
            raise res
    await remove_volumes(ctx, job_id, JobSpec.from_json(spec), node)


async def remove_volumes(ctx: JobContext, job_id: str, spec: JobSpec, node: str) -> None:
    """Remove the job's data volumes and git clones on each node it was placed on
    (``node``: comma-separated), then give their bytes back to its owner's disk quota."""
    name = ctx.container_name(job_id)
    for where in dict.fromkeys((node or "").split(",")):
        for vol in ctx.volumes(job_id, spec, where):
            await ctx.runtime.remove_volume(vol.docker_volume, vol.node)
        for volume in git_volume_names(name, spec.git):
            await ctx.runtime.remove_volume(volume, where)
    await ctx.db(ctx.disk.release_workload, ctx.workload(job_id))


async def discard_volumes(ctx: JobContext, job_id: str, spec: JobSpec, node: str) -> None:
    """A job that fails before its command ran keeps nothing: its volumes (a half-pulled
    one, emptied clones) go at once, not after the retention delay; if the engine
    refuses now, the cleanup after the delay removes them."""
    try:
        await remove_volumes(ctx, job_id, spec, node)
    except EngineError as e:
        log.warning("job %s: volumes not removed yet: %s", job_id, e)


# --- restart safety ------------------------------------------------------------------


async def recover(ctx: JobContext) -> None:
    """Rebuild the world after a (possibly violent) restart: no job lost, none run twice.

    Sync helpers left by the previous holder are removed first (they hold store
    credentials and the volume's sync lock); every active job then gets a task that
    carries it on from what the database and the engine say; containers and volumes
    without a record, and GPUs held by no active job, are cleaned up."""
    await remove_orphan_helpers(ctx)
    active = await ctx.db(ctx.records.list, None, {s.value for s in ACTIVE})
    for j in active:
        ctx.spawn(j["id"], True)
    live = [ctx.workload(j["id"]) for j in active]
    await ctx.db(ctx.ledger.reconcile, live, "job", 0)
    # disk bookings of jobs whose volumes are gone (a removal cut short by the restart)
    keep = {ctx.workload(i) for i in await ctx.db(ctx.records.with_volumes)}
    await ctx.db(ctx.disk.release_all_but, keep, ctx.workload(""))
    await remove_orphan_containers(ctx)
    await prune_networks(ctx)


async def remove_orphan_helpers(ctx: JobContext) -> None:
    """Remove the sync helpers of jobs (not notebooks': the hub runs those) that no task
    of this process started: at a new leadership, all of them."""
    # unreachable engine: the error ends this recovery, which is tried again next pass
    helpers = await ctx.runtime.labelled(ctx.settings.instance, "sync-helper")
    prefix = ctx.workload("")
    for h in helpers:
        if not h.labels.get(L_WORKLOAD, "").startswith(prefix):
            continue
        log.warning("removing sync helper %s left by an earlier service", h.id[:12])
        await ctx.runtime.remove(h.id)
    if ctx.datasets is not None:  # the dataset cache's pulls whose process holds no claim
        await ctx.datasets.reap_helpers(helpers)
    await remove_helper_leftovers(ctx)


async def remove_helper_leftovers(ctx: JobContext) -> None:
    """What dead helpers of this instance (jobs' and notebooks' alike) left in the engine
    apart from themselves, their secret files on a Swarm: at a new leadership, after the
    orphaned helpers, and with each sweep for orphans (what was too young at the first goes
    at a later one). The engine's refusal is tried again at the next sweep."""
    try:
        left = await ctx.runtime.remove_helper_leftovers(ctx.settings.instance)
    except EngineError as e:
        log.warning("what dead helpers left is not removed yet: %s", e)
        return
    if left:
        log.warning("removed what dead sync helpers left behind: %s", ", ".join(left))


async def remove_orphan_containers(ctx: JobContext) -> None:
    """Containers (and their volumes) of jobs that have no record any more: a DELETE
    whose engine clean-up was cut short. Every container must have a record."""
    try:
        found = await ctx.runtime.labelled(ctx.settings.instance, "job")
    except EngineError as e:
        log.warning("job containers not checked: %s", e)
        return
    known = await ctx.db(ctx.records.ids)
    for c in found:
        job_id = c.labels.get("org.gpulab.job", "")
        if not job_id or job_id in known:
            continue
        log.warning("removing workload %s of deleted job %s", c.id[:12], job_id)
        await ctx.runtime.remove(c.id)
        await remove_job_volumes(ctx, job_id)


async def remove_job_volumes(ctx: JobContext, job_id: str) -> None:
    name = ctx.container_name(job_id)
    for prefix in (f"{name}-v-", git_volume_prefix(name)):  # data volumes and checkouts
        for vol, node in await ctx.runtime.volumes_named(prefix):
            await ctx.runtime.remove_volume(vol, node)
    await ctx.db(ctx.disk.release_workload, ctx.workload(job_id))


async def prune_networks(ctx: JobContext) -> None:
    """Best effort: remove users' networks that no container uses any more (notebooks'
    included), so that they do not hold the engine's address pools."""
    try:
        gone = await ctx.runtime.prune_user_networks(ctx.settings.instance)
    except EngineError as e:
        log.warning("networks not pruned: %s", e)
        return
    if gone:
        log.info("removed the networks of %s (no container left)", ", ".join(gone))
