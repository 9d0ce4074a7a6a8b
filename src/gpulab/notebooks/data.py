"""A notebook's data: its workspace, home and volumes, pulled from object storage at the start,
pushed back at the stop (and again by a push retry), purged when it is deleted for good.

The transfers are :mod:`gpulab.data.sync`'s sync helper runs, on the node that holds the
volumes; this module says which volumes a notebook has and what its pushes mean for its record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..data.sync import (
    HOME_LABEL,
    DiskAccount,
    HomeSync,
    SyncOutcome,
    VolumeSync,
    WorkloadData,
    notebook_volumes,
    push_all,
    push_verdict,
)
from ..lifecycle import InvalidTransition, NotebookState
from ..runtime.base import Runtime

S = NotebookState


@dataclass
class NotebookData:
    """One notebook's volumes and the helper runs that move them."""

    sync: WorkloadData
    volumes: list[VolumeSync]
    #: the volumes mounted from the nodes' dataset cache (in ``volumes``, in place of the
    #: notebook's own)
    cached: list[VolumeSync] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        settings,
        runtime: Runtime,
        container: str,
        user: str,
        server: str,
        workload_id: str,
        specs: list[str],
        node: str = "",
        disk: DiskAccount | None = None,
    ) -> NotebookData:
        """The workspace (when a workspace store is configured) and the volumes ``specs``
        (as the user wrote them) of a notebook whose container is ``container``, on
        ``node`` ("" on one host)."""
        s = settings
        vols = notebook_volumes(
            s.storage, container, user, server, s.workspace_dir, specs, node, home_sync(s)
        )
        sync = WorkloadData(runtime, s.storage.stores, s.sync_image, s.instance, workload_id, disk)
        return cls(sync, vols)

    @classmethod
    def of_record(
        cls, settings, runtime: Runtime, nb: dict, workload_id: str, disk=None
    ) -> NotebookData:
        """What a notebook's record says it holds, where its record says it ran."""
        return cls.of(
            settings,
            runtime,
            nb["container"],
            nb["user"],
            nb["server"],
            workload_id,
            recorded_volume_specs(nb),
            nb.get("node") or "",
            disk,
        )

    @property
    def workspace(self) -> VolumeSync | None:
        return next((v for v in self.volumes if v.label == "workspace"), None)

    @property
    def home(self) -> VolumeSync | None:
        return next((v for v in self.volumes if v.label == HOME_LABEL), None)

    async def push(self) -> tuple[bool, str]:
        """Push every volume that pushes: (ok, the verdict the record keeps). A failure
        deletes nothing local."""
        return push_verdict(await push_all(self.sync, self.volumes))

    async def purge_workspace(self) -> SyncOutcome | None:
        """Delete the remote workspace and home (None: there is none; else the first failure,
        or the workspace's outcome). It talks to the store only: on a cluster it runs on any
        node (the notebook's may be gone)."""
        first = None
        for vol in (self.workspace, self.home):
            if vol is None:
                continue
            outcome = await self.sync.run(
                "purge", VolumeSync(vol.spec, vol.docker_volume, vol.label, "")
            )
            if not outcome.ok:
                return outcome
            first = first or outcome
        return first


def home_sync(settings) -> HomeSync | None:
    """How the site keeps notebooks' homes (None: it does not, ``home_sync`` off)."""
    s = settings
    if not s.home_sync:
        return None
    return HomeSync(s.home_dir, tuple(s.home_exclude), s.home_max_bytes_value)


def recorded_volume_specs(nb: dict | None) -> list[str]:
    return list(((nb or {}).get("options") or {}).get("volumes") or [])


class PushRaced(Exception):
    """A push retry found the notebook changed: before the push (``during`` False: another
    retry or a start got there first) or during it."""

    def __init__(self, during: bool):
        super().__init__("during" if during else "before")
        self.during = during


async def retry_push(
    records, data: NotebookData, user: str, server: str, message: str
) -> tuple[bool, str, dict]:
    """Push a SYNC_FAILED notebook's volumes again: SYNC_FAILED -> STOPPING (PUSH_RETRY), the
    push, then STOPPED or SYNC_FAILED, each a compare-and-set. Returns (ok, verdict, record);
    raises PushRaced when the notebook changed meanwhile (of two retries, one pushes).

    The one push retry: the API's "retry the push" and a start on a Swarm (which pushes what
    the last stop left on a node before it may run elsewhere) both call it."""
    try:
        await asyncio.to_thread(
            records.transition,
            user,
            server,
            S.STOPPING,
            reason="PUSH_RETRY",
            message=message,
            expect=frozenset({S.SYNC_FAILED}),
        )
    except InvalidTransition:
        raise PushRaced(during=False) from None
    ok, verdict = await data.push()
    state, reason = (S.STOPPED, "STOPPED") if ok else (S.SYNC_FAILED, "PUSH_FAILED")
    try:
        record = await asyncio.to_thread(
            records.transition,
            user,
            server,
            state,
            reason=reason,
            message=verdict,
            expect=frozenset({S.STOPPING}),
        )
    except InvalidTransition:
        raise PushRaced(during=True) from None
    return ok, verdict, record
