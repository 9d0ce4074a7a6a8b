"""What every part of the supervisor is handed: :class:`JobContext`.

The supervisor (``supervisor.py``) builds one at start and hands it to the job's life
(``life.py``), its ending (``ending.py``), the engine calls (``engine.py``) and the
housekeeping: the records, the GPU and disk ledgers, the ``Runtime``, the settings, the
secrets store, where logs are kept, and how to carry a job on in a task of its own. No part
reads another part's attributes: what they share is here, explicit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...data.datasets import DatasetCache
from ...data.sync import DiskAccount, VolumeSync, WorkloadData
from ...disk_ledger import DiskLedger
from ...gpus.ledger import GpuLedger
from ...gpus.usage import DeviceUsage, busiest, keyed, usage_of
from ...lifecycle import JobState
from ...names import job_container_name, job_workload_id, rank_name, volume_name
from ...notices import Notify, job_event, job_notice
from ...notifier import Notifier
from ...runtime.base import Runtime
from ..gang import Rank
from ..records import JobRecords
from ..spec import JobSpec
from ..spec.ports import job_path
from .live import LivePushes

log = logging.getLogger("gpulab.jobs")


def _no_task(job_id: str, attach: bool) -> None:  # until the supervisor hands its own
    return None


@dataclass
class JobContext:
    settings: Any  # GpulabSettings
    records: JobRecords
    ledger: GpuLedger
    disk: DiskLedger
    runtime: Runtime
    secrets: Any  # the users' secrets store (revealed into a job's container only)
    logs_dir: Path
    #: carry a job on in a supervised task of its own (``attach``: from what the database and
    #: the engine say, not a fresh start); set by the supervisor, a no-op in standby
    spawn: Callable[[str, bool], None] = _no_task
    #: consecutive faults per job, for the backoff (reset once its command runs)
    fault_streak: dict[str, int] = field(default_factory=dict)
    #: ended jobs whose removal the engine refused: (failures, not tried again before this
    #: time.monotonic()), for the cleanup's backoff (housekeeping.py)
    cleanup_backoff: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: sends the notices a job's owner asked for (its spec's ``notify``); None: none sent
    notifier: Notifier | None = None
    #: the live pushes of running jobs' volumes (one task per job at most)
    live: LivePushes = field(default_factory=LivePushes)
    #: read-only datasets pulled once per node and shared with the hub's notebooks
    #: (gpulab/data/datasets.py); None: not cached (contexts built for a test of one part)
    datasets: DatasetCache | None = None

    async def db(self, fn, *args, **kw):
        """A blocking database call, off the event loop."""
        return await asyncio.to_thread(fn, *args, **kw)

    def container_name(self, job_id: str) -> str:
        return job_container_name(self.settings.instance, job_id)

    def workload(self, job_id: str) -> str:
        return job_workload_id(self.settings.instance, job_id)

    def gang(self, job_id: str, job: dict) -> list[Rank]:
        """The job's workers from its record (one for a one-container job)."""
        name = self.container_name(job_id)
        return [
            Rank(w["rank"], rank_name(name, w["rank"]), w["node"], tuple(w["devices"]))
            for w in job["workers"]
        ]

    def volumes(self, job_id: str, spec: JobSpec, node: str = "") -> list[VolumeSync]:
        """The job's volumes, on ``node`` (where its workload runs; "" on one host)."""
        name = self.container_name(job_id)
        return [VolumeSync(v, volume_name(name, v), str(v), node) for v in spec.volumes]

    def data(self, job_id: str) -> WorkloadData:
        s = self.settings
        disk = DiskAccount(self.disk, lambda: self.disk_quota_of(job_id), s.git_max_bytes_value)
        return WorkloadData(
            self.runtime, s.storage.stores, s.sync_image, s.instance, self.workload(job_id), disk
        )

    def disk_quota_of(self, job_id: str) -> tuple[str, int | None]:
        """The job's owner and their disk quota (with the groups they had at submission)."""
        job = self.records.get(job_id, False)
        if job is None:
            raise KeyError(job_id)
        return job["owner"], self.settings.disk_quota_for(job["owner"], job["groups"])

    def log_file(self, job_id: str, rank: int | None = None) -> Path:
        """The saved output: of the job (a distributed job's: every rank, prefixed), or of
        one ``rank`` of a distributed job."""
        return self.logs_dir / (f"{job_id}.log" if rank is None else f"{job_id}.r{rank}.log")

    def saved_logs(self, job_id: str) -> list[Path]:
        """Every saved log file of the job (a distributed job's ranks too)."""
        return [self.log_file(job_id), *self.logs_dir.glob(f"{job_id}.r*.log")]

    async def gpu_readings(self) -> list[DeviceUsage]:
        """What every GPU does now, named as the ledger names it (``Runtime.gpu_usage``: this
        host's NVML, or each cluster node's agent); [] when nothing can be read. Hang
        detection, the idle-GPU policy, the pages and /metrics all read here."""
        try:
            return keyed(await self.runtime.gpu_usage())
        except Exception as e:  # a reading is a hint: never a fault of a job or a page
            log.warning("GPU activity not read: %s", e)
            return []

    async def gpu_activity(self, gang: list[Rank]) -> int | None:
        """The highest utilization (percent) of the job's GPUs now, over its workers; None when
        it cannot be read (no GPU booked; no reading of its devices: no NVML, a cluster node
        whose agent's reading is missing or stale; MIG devices)."""
        devices = [d for r in gang for d in r.devices]
        if not devices:
            return None
        return busiest(usage_of(await self.gpu_readings(), devices))

    async def move(self, job_id: str, state: JobState, **kw) -> dict:
        """A compare-and-set transition of the job's record (``expect``: the state seen),
        then the notice its owner asked for, if it is one (:meth:`announce`); for a task of
        an array, its array's (a task's spec asks for none)."""
        arrays: list[dict] = []  # a task's array whose state changed with it
        job = await self.db(self.records.transition, job_id, state, array_changes=arrays, **kw)
        self.announce(job)
        for array in arrays:  # a task is never told of itself: its array's end is
            self.announce(array)
        return job

    def announce(self, job: dict) -> None:
        """Hand the notice of ``job``'s transition (its record, just written) to the
        notifier, when it is an event its spec's ``notify`` asks for: the one place a job's
        end, failure or preemption is told. Never waits for the sending, never raises."""
        if self.notifier is None:
            return
        try:
            notify = Notify.from_json((job.get("spec") or {}).get("notify"))
            event = job_event(job["state"], job["reason"])
            if notify is None or not notify.wants(event):
                return
            s = self.settings
            url = f"{(s.public_url or s.bind_url).rstrip('/')}{job_path(job['id'])}"
            self.notifier.post(job_notice(job, str(event), url), notify)
        except Exception as e:  # a notice is a courtesy: never a fault of the job
            log.warning("notice of job %s not sent: %s", job.get("id"), e)

    async def requested(self, job_id: str) -> str:
        """What the job's owner or the scheduler asked of it ("interrupt", "preempt", "")."""
        job = await self.db(self.records.get, job_id, False)
        return job["request"] if job else ""
