"""The notebook spawner's data: its workspace and volumes, pulled from object storage at the
start, pushed back at the stop, and purged when the notebook is deleted for good.

A mixin of :class:`~gpulab.spawner.NotebookSpawner` (it needs ``settings``, ``runtime``,
``records``, ``ledger``, ``node``, ``_progress``, ``_fail`` and ``_record`` from it): the
transfers themselves are :mod:`gpulab.data.sync`'s sync helper runs, on the node that holds
the volumes.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

from tornado import web

from .data.sync import (
    DiskAccount,
    VolumeSync,
    WorkloadData,
    notebook_volumes,
    progress_message,
)
from .disk_ledger import DiskLedger
from .lifecycle import NotebookState
from .runtime.docker import EngineError

S = NotebookState


class SpawnFailed(web.HTTPError):
    """A spawn that cannot go on; the message is what the user sees on the progress page."""

    def __init__(self, status: int, message: str):
        super().__init__(status, "%s", message)
        self.message = message
        self.jupyterhub_message = message


class NotebookDataMixin:
    """Workspace and volumes of one notebook."""

    @cached_property
    def disk_ledger(self) -> DiskLedger:
        return DiskLedger(self.gpulab_db, self.settings.instance)

    @cached_property
    def data(self) -> WorkloadData:
        s = self.settings
        disk = DiskAccount(self.disk_ledger, lambda: self._disk_owner_quota)
        return WorkloadData(
            self.runtime, s.storage.stores, s.sync_image, s.instance, self.workload_id, disk
        )

    def data_volumes(self, specs: list[str]) -> list[VolumeSync]:
        s = self.settings
        return notebook_volumes(
            s.storage,
            self.object_name,
            self.user.name,
            self.name,
            s.workspace_dir,
            specs,
            self.node,
        )

    async def _recorded_volume_specs(self) -> list[str]:
        nb = await self.runtime.run(self.records.get, self.user.name, self.name)
        return list(((nb or {}).get("options") or {}).get("volumes") or [])

    async def _pull(self, vols: list[VolumeSync]) -> None:
        s = self.settings
        if not vols:
            self._progress(45, f"Workspace {s.workspace_dir} is a local volume (no object store)")
            return
        if not await self.runtime.image_exists(self.engine_image(s.sync_image)):
            msg = f"sync helper image {s.sync_image} is missing (the admin builds it: make images)"
            await self._fail(S.ERROR, "IMAGE_MISSING", msg)
            raise SpawnFailed(503, msg)
        # the owner's disk quota, read here (the hub's user object is not read off its loop)
        name = self.user.name
        self._disk_owner_quota = (name, s.disk_quota_for(name, self._user_groups()))
        for vol in vols:
            store = vol.spec.store
            # the image's /workspace (uid 1000) populates a new workspace volume; on a cluster
            # the pull always runs: the node may hold an older copy (volume_exists cannot tell)
            skip = not vol.node and await self.data.nothing_to_pull(
                vol, image_provides_mount=vol.label == "workspace"
            )
            if skip:
                self._progress(45, f"{vol.label}: nothing stored yet in object store {store}")
                continue
            self._progress(40, f"Pulling {vol.label} from object store {store}")

            def on_progress(p: dict, label=vol.label) -> None:
                self._progress(45, progress_message("Pulling", label, p))

            outcome = await self.data.run("pull", vol, on_progress)
            if outcome.refused:  # the disk quota: nothing was fetched, nothing to push
                self._skip_push = True
                await self._fail(S.FAILED, "PULL_FAILED", outcome.reason)
                raise SpawnFailed(403, outcome.reason)
            if not outcome.ok:
                self._skip_push = True  # nothing to push from a half-pulled start
                msg = f"pull of volume {vol.label} failed: {outcome.reason}"
                await self._fail(S.FAILED, "PULL_FAILED", msg)
                raise SpawnFailed(500, msg)
            self._progress(50, "Pulled " + outcome.summary())

    async def _delete_forever(self) -> bool:
        await self._record(S.DELETING, reason="DELETE", message="notebook deleted by its owner")
        nb = await self.runtime.run(self.records.get, self.user.name, self.name) or {}
        self.node = nb.get("node") or self.node  # a cluster: where its volumes are
        vols = self.data_volumes(list((nb.get("options") or {}).get("volumes") or []))
        workspace = [v for v in vols if v.label == "workspace"]
        if workspace:
            # the purge talks to the store only: on a cluster it runs on any node (the
            # notebook's may be gone)
            outcome = await self.data.run("purge", replace(workspace[0], node=""))
            if not outcome.ok:
                msg = f"could not delete the remote workspace: {outcome.reason}; local copy kept"
                await self._record(S.ERROR, reason="DELETE_FAILED", message=msg)
                return False
        try:
            await self.runtime.remove(self.object_name)
            for name in {self.volume_name, *(v.docker_volume for v in vols)}:
                await self.runtime.remove_volume(name, self.node)
            await self.runtime.run(self.ledger.release, self.workload_id)
            await self.runtime.run(self.disk_ledger.release_workload, self.workload_id)
        except EngineError as e:
            await self._record(S.ERROR, reason="DELETE_FAILED", message=str(e))
            raise
        await self._release_user_network()
        await self._record(S.DELETED, reason="DELETED", message="workspace and volumes removed")
        return True
