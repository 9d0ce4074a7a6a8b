"""Stops idle notebooks through the hub, like a user stop (the decision is gpulab.idle).

Each pass reads gpulab's RUNNING notebooks that have an idle time, asks the hub for their
servers' recorded activity, and for each one :func:`gpulab.idle.idle_notebooks` calls idle:

1. records the stop's reason IDLE as a compare-and-set on the RUNNING life it judged
   (``NotebookRecords.ask_stop``): a notebook stopped or started again meanwhile is left alone;
2. reads the hub's server once more and withdraws if activity came in meanwhile;
3. asks the hub to stop the server (``DELETE``), the same path as a user's stop: the spawner
   records STOPPING with the reason, pushes the workspace and writable volumes, and releases
   the GPUs once the engine confirms that the container is gone.

Nothing is kept in memory but the first-seen times of reported activity (gpulab.idle): after
a restart of the hub and the service, the hub's recorded activity decides as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

from tornado.httpclient import HTTPClientError

from ...idle import REASON, IdleStop, idle_notebooks
from ...jobs.supervisor.supervisor import JobSupervisor
from ...lifecycle import utcnow
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
    ):
        self.records = records
        self.hub = hub
        self.clock = clock
        self.seen: dict = {}

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
        running = [
            nb
            for nb in await asyncio.to_thread(self.records.running)
            if isinstance(nb["options"].get("idle_timeout"), int | float)
            and nb["options"]["idle_timeout"] > 0
        ]
        if not running:
            self.seen = {}
            return []
        servers = await self._servers({nb["user"] for nb in running})
        stops, self.seen = idle_notebooks(running, servers, self.clock(), self.seen)
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
        # the last look before the stop: activity that came in since the decision wins
        again = await self._servers({user})
        record = [nb for nb in running if (nb["user"], nb["server"]) == (user, server)]
        still, _ = idle_notebooks(record, again, self.clock(), self.seen)
        if not still:
            await asyncio.to_thread(self.records.withdraw_stop, user, server, REASON)
            return False
        log.info("stopping idle notebook %s/%s: %s", user, server, stop.message)
        await self.hub.stop_server(user, server)
        return True


async def idle_loop(settings: GpulabSettings, supervisor: JobSupervisor) -> None:
    """Stop notebooks idle for their idle time (gpulab.idle), through the hub like a user."""
    stopper = IdleStopper(NotebookRecords(supervisor.records.db, settings.instance), HubClient())
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
