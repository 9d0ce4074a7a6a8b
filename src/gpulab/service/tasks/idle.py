"""Stops idle notebooks through the hub, like a user stop (the decision is gpulab.idle).

Each pass reads gpulab's RUNNING notebooks that have an idle time, asks the hub for their
servers' recorded activity, and for each one :func:`gpulab.idle.idle_notebooks` calls idle:

1. records the stop's reason IDLE as a compare-and-set on the RUNNING life it judged
   (``NotebookRecords.ask_stop``): a notebook stopped or started again meanwhile is left alone;
2. reads the hub's server once more and withdraws if activity came in meanwhile;
3. asks the hub to stop the server (``DELETE``), the same path as a user's stop: the spawner
   records STOPPING with the reason, pushes the workspace and writable volumes, and releases
   the GPUs once the engine confirms that the container is gone.

The same pass stops the notebooks whose GPUs went unused for their time, where the admin
turned that policy on (:func:`gpulab.idle.unused_gpu_notebooks`): it reads the GPUs' utilization
(the reader the job supervisor's hang detection uses: this host's NVML, or a cluster's nodes'
GPU agents) for the devices each notebook holds in the ledger, and its last look before the
stop reads them once more.

Nothing is kept in memory but the first-seen times of reported activity and of unused GPUs
(gpulab.idle): after a restart of the hub and the service, the hub's recorded activity decides
as before, and the GPUs' clocks start again (a notebook gets more time, never less).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from urllib.parse import quote

from tornado.httpclient import HTTPClientError

from ...gpus.ledger import GpuLedger
from ...gpus.usage import DeviceUsage, busiest, usage_of
from ...idle import REASON, IdleStop, idle_notebooks, unused_gpu_notebooks
from ...jobs.supervisor.supervisor import JobSupervisor
from ...lifecycle import utcnow
from ...names import notebook_workload_id
from ...notebooks.records import NotebookRecords
from ...settings import GpulabSettings
from .hub import HubClient

log = logging.getLogger(__name__)


class IdleStopper:
    def __init__(
        self,
        records: NotebookRecords,
        hub: HubClient,
        clock: Callable[[], datetime] = utcnow,
        ledger: GpuLedger | None = None,
        gpu_usage: Callable[[], Awaitable[list[DeviceUsage]]] | None = None,
    ):
        self.records = records
        self.hub = hub
        self.clock = clock
        self.seen: dict = {}
        #: for the GPUs' policy: which devices a notebook holds, and what they do now (the
        #: supervisor's ``JobContext.gpu_readings``, named as the ledger names devices; None:
        #: nobody reads them, and no notebook is stopped for its GPUs)
        self.ledger = ledger
        self.gpu_usage = gpu_usage
        self.unused_since: dict = {}

    async def _gpu_readings(self, notebooks: list[dict]) -> dict[tuple[str, str], int | None]:
        """(user, server) -> the highest utilization of its GPUs now (None: not read)."""
        if not notebooks or self.gpu_usage is None or self.ledger is None:
            return {}
        try:
            usages = await self.gpu_usage()
        except Exception as e:  # a reading is a hint: never a reason to stop anyone
            log.warning("GPU activity not read: %s", e)
            return {}
        instance = self.records.instance
        out: dict[tuple[str, str], int | None] = {}
        for nb in notebooks:
            workload = notebook_workload_id(instance, nb["user"], nb["server"])
            devices = await asyncio.to_thread(self.ledger.held_by, workload)
            held = busiest(usage_of(usages, devices)) if devices else None
            out[(nb["user"], nb["server"])] = held
        return out

    async def _servers(self, users: set[str]) -> dict[tuple[str, str], dict | None]:
        out: dict[tuple[str, str], dict | None] = {}
        for user in sorted(users):
            try:
                model = await self.hub.request("GET", f"/users/{quote(user, safe='')}")
            except HTTPClientError as e:
                if e.code != 404:
                    raise
                model = None
            for name, server in ((model or {}).get("servers") or {}).items():
                out[(user, name)] = server
        return out

    async def check(self) -> list[tuple[str, str]]:
        """One pass; returns the (user, server) pairs it stopped."""
        running = await asyncio.to_thread(self.records.running)
        timed = [nb for nb in running if _positive(nb["options"].get("idle_timeout"))]
        gpu_timed = [nb for nb in running if _positive(nb["options"].get("gpu_unused_timeout"))]
        stops: list[IdleStop] = []
        if timed:
            servers = await self._servers({nb["user"] for nb in timed})
            stops, self.seen = idle_notebooks(timed, servers, self.clock(), self.seen)
        else:
            self.seen = {}
        readings = await self._gpu_readings(gpu_timed)
        gpu_stops, self.unused_since = unused_gpu_notebooks(
            gpu_timed, readings, self.clock(), self.unused_since
        )
        judged = {(s.user, s.server) for s in stops}
        stops += [s for s in gpu_stops if (s.user, s.server) not in judged]
        stopped = []
        for stop in stops:
            try:
                if await self._stop(stop, running):
                    stopped.append((stop.user, stop.server))
            except Exception:
                log.exception("idle stop of %s/%s failed", stop.user, stop.server)
                await asyncio.to_thread(self.records.withdraw_stop, stop.user, stop.server, REASON)
        return stopped

    async def _stop(self, stop: IdleStop, running: list[dict]) -> bool:
        user, server = stop.user, stop.server
        asked = await asyncio.to_thread(
            self.records.ask_stop, user, server, stop.running_since, REASON, stop.message
        )
        if not asked:
            return False  # stopped, or started again, meanwhile
        # the last look before the stop: activity (or GPU use) since the decision wins
        record = [nb for nb in running if (nb["user"], nb["server"]) == (user, server)]
        if stop.kind == "gpu":
            readings = await self._gpu_readings(record)
            still, _ = unused_gpu_notebooks(record, readings, self.clock(), self.unused_since)
        else:
            again = await self._servers({user})
            still, _ = idle_notebooks(record, again, self.clock(), self.seen)
        if not still:
            await asyncio.to_thread(self.records.withdraw_stop, user, server, REASON)
            return False
        log.info("stopping idle notebook %s/%s: %s", user, server, stop.message)
        await self.hub.stop_server(user, server)
        return True


async def idle_loop(settings: GpulabSettings, supervisor: JobSupervisor) -> None:
    """Stop notebooks idle for their idle time (gpulab.idle), through the hub like a user."""
    stopper = IdleStopper(
        NotebookRecords(supervisor.records.db, settings.instance),
        HubClient(),
        ledger=supervisor.ledger,
        gpu_usage=supervisor.ctx.gpu_readings,
    )
    while True:
        await asyncio.sleep(settings.idle_check_interval)
        if not supervisor.leading.is_set():
            continue  # a service in standby acts on nothing
        try:
            stopped = await stopper.check()
            if stopped:
                log.info("stopped idle notebooks: %s", ", ".join(f"{u}/{s}" for u, s in stopped))
        except Exception:
            log.exception("idle notebook pass failed")


def _positive(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
