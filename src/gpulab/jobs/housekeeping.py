"""The supervisor's housekeeping: finished jobs' containers and volumes removed after the
retention delay, and, after a restart of the service, orphaned helpers, containers, volumes
and networks swept away. A mixin of :class:`~gpulab.jobs.supervisor.JobSupervisor`."""

from __future__ import annotations

import logging
from pathlib import Path

from ..lifecycle import JobState, utcnow
from ..names import L_WORKLOAD, rank_name
from ..runtime.base import EngineError
from .git_sources import git_volume_names, git_volume_prefix
from .records import ACTIVE
from .spec import JobSpec

log = logging.getLogger("gpulab.jobs.supervisor")
J = JobState
#: seconds between sweeps for containers whose job record is gone
ORPHAN_SWEEP_INTERVAL = 60.0


class JobHousekeeping:
    """Mixin of :class:`~gpulab.jobs.supervisor.JobSupervisor`: removing what is no longer
    needed."""

    async def cleanup(self) -> None:
        """Remove finished jobs' containers and data volumes after the retention delay (the
        records and saved logs stay). A SYNC_FAILED job keeps both: its volumes hold the
        output that is not pushed yet (a retried push, then the delay, removes them)."""
        now = utcnow().timestamp()
        removed_any = False
        for job_id, _container, updated, state, spec, node in await self.db(
            self.records.ended_with_container
        ):
            if state == J.SYNC_FAILED.value:
                continue
            if now - updated.timestamp() > self.s.job_container_retention:
                try:
                    await self.remove_from_engine(job_id, spec, node)
                except EngineError as e:  # in use (a push retry?): try again next pass
                    log.warning("job %s: volumes not removed yet: %s", job_id, e)
                    continue
                await self.db(self.records.forget_container, job_id)
                removed_any = True
        if removed_any:
            await self.prune_networks()
        if now - self._last_sweep > ORPHAN_SWEEP_INTERVAL:
            self._last_sweep = now
            await self.remove_orphan_containers()

    async def remove_from_engine(self, job_id: str, spec: dict, node: str) -> None:
        """Remove an ended job's containers (every worker's) and its volumes (on each node it
        ran on); the record and saved logs stay."""
        name = self.container_name(job_id)
        for rank in range(int(spec.get("workers") or 1)):
            await self.runtime.remove(rank_name(name, rank))
        await self.remove_volumes(job_id, JobSpec.from_json(spec), node)

    async def remove_volumes(self, job_id: str, spec: JobSpec, node: str) -> None:
        """Remove the job's data volumes and git clones on each node it was placed on
        (``node``: comma-separated), then give their bytes back to its owner's disk quota."""
        name = self.container_name(job_id)
        for where in dict.fromkeys((node or "").split(",")):
            for vol in self.volumes(job_id, spec, where):
                await self.runtime.remove_volume(vol.docker_volume, vol.node)
            for volume in git_volume_names(name, spec.git):
                await self.runtime.remove_volume(volume, where)
        await self.db(self.disk.release_workload, self.workload(job_id))

    async def discard_volumes(self, job_id: str, spec: JobSpec, node: str) -> None:
        """A job that fails before its command ran keeps nothing: its volumes (a half-pulled
        one, emptied clones) go at once, not after the retention delay; if the engine
        refuses now, the cleanup after the delay removes them."""
        try:
            await self.remove_volumes(job_id, spec, node)
        except EngineError as e:
            log.warning("job %s: volumes not removed yet: %s", job_id, e)

    def saved_logs(self, job_id: str) -> list[Path]:
        """Every saved log file of the job (a distributed job's ranks too)."""
        return [self.log_file(job_id), *self.logs_dir.glob(f"{job_id}.r*.log")]

    # --- restart safety ------------------------------------------------------------------

    async def recover(self) -> None:
        """Rebuild the world after a (possibly violent) restart: no job lost, none run twice.

        Sync helpers left by the previous holder are removed first (they hold store
        credentials and the volume's sync lock); every active job then gets a task that
        carries it on from what the database and the engine say; containers and volumes
        without a record, and GPUs held by no active job, are cleaned up."""
        await self.remove_orphan_helpers()
        active = await self.db(self.records.list, None, {s.value for s in ACTIVE})
        for j in active:
            self.spawn_task(j["id"], attach=True)
        live = [self.workload(j["id"]) for j in active]
        await self.db(self.ledger.reconcile, live, "job", 0)
        # disk bookings of jobs whose volumes are gone (a removal cut short by the restart)
        keep = {self.workload(i) for i in await self.db(self.records.with_volumes)}
        await self.db(self.disk.release_all_but, keep, self.workload(""))
        await self.remove_orphan_containers()
        await self.prune_networks()

    async def remove_orphan_helpers(self) -> None:
        """Remove the sync helpers of jobs (not notebooks': the hub runs those) that no task
        of this process started: at a new leadership, all of them."""
        # unreachable engine: the error ends this recovery, which is tried again next pass
        helpers = await self.runtime.labelled(self.s.instance, "sync-helper")
        prefix = self.workload("")
        for h in helpers:
            if not h.labels.get(L_WORKLOAD, "").startswith(prefix):
                continue
            log.warning("removing sync helper %s left by an earlier service", h.id[:12])
            await self.runtime.remove(h.id)

    async def remove_orphan_containers(self) -> None:
        """Containers (and their volumes) of jobs that have no record any more: a DELETE
        whose engine clean-up was cut short. Every container must have a record."""
        try:
            found = await self.runtime.labelled(self.s.instance, "job")
        except Exception as e:
            log.warning("job containers not checked: %s", e)
            return
        known = await self.db(self.records.ids)
        for c in found:
            job_id = c.labels.get("org.gpulab.job", "")
            if not job_id or job_id in known:
                continue
            log.warning("removing workload %s of deleted job %s", c.id[:12], job_id)
            await self.runtime.remove(c.id)
            await self.remove_job_volumes(job_id)

    async def remove_job_volumes(self, job_id: str) -> None:
        name = self.container_name(job_id)
        for prefix in (f"{name}-v-", git_volume_prefix(name)):  # data volumes and checkouts
            for vol, node in await self.runtime.volumes_named(prefix):
                await self.runtime.remove_volume(vol, node)
        await self.db(self.disk.release_workload, self.workload(job_id))

    async def prune_networks(self) -> None:
        """Best effort: remove users' networks that no container uses any more (notebooks'
        included), so that they do not hold the engine's address pools."""
        try:
            gone = await self.runtime.prune_user_networks(self.s.instance)
        except EngineError as e:
            log.warning("networks not pruned: %s", e)
            return
        if gone:
            log.info("removed the networks of %s (no container left)", ", ".join(gone))
