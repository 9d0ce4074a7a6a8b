"""Stops notebooks that reached the maximum run time, and restarts those that asked for it."""

from __future__ import annotations

import asyncio
import logging

from ...jobs.supervisor.supervisor import JobSupervisor
from ...notebooks.records import NotebookRecords
from ...settings import GpulabSettings
from .hub import HubClient

log = logging.getLogger(__name__)


class RunTimeWatchdog:
    def __init__(self, records: NotebookRecords, hub: HubClient, max_run_time: float):
        self.records = records
        self.hub = hub
        self.max_run_time = max_run_time

    async def check(self) -> list[tuple[str, str]]:
        """One pass; returns the (user, server) pairs it stopped."""
        acted = []
        # the records' reads and writes off the event loop (blocking database calls)
        late = await asyncio.to_thread(self.records.running_longer_than, self.max_run_time)
        for nb in late:
            user, server = nb["user"], nb["server"]
            hours = self.max_run_time / 3600
            await asyncio.to_thread(
                self.records.set_stop_reason,
                user,
                server,
                "MAX_RUN_TIME",
                f"maximum run time reached ({hours:g} h)"
                + ("; restarting as it was" if nb["auto_restart"] else ""),
            )
            try:
                await self.hub.stop_server(user, server)
                if nb["auto_restart"]:
                    log.info("restarting %s/%s after its maximum run time", user, server)
                    await self.hub.start_server(user, server, nb["user_options"])
            except Exception:
                log.exception("could not stop/restart %s/%s", user, server)
                continue
            acted.append((user, server))
        return acted


async def watchdog_loop(settings: GpulabSettings, supervisor: JobSupervisor) -> None:
    """Every ``watchdog_interval`` seconds, while this service leads: stop notebooks past
    their maximum run time (and restart those that asked for it)."""
    records = NotebookRecords(supervisor.records.db, settings.instance)  # the service's one
    dog = RunTimeWatchdog(records, HubClient(), settings.max_run_time)
    while True:
        await asyncio.sleep(settings.watchdog_interval)
        if not supervisor.leading.is_set():
            continue  # a service in standby acts on nothing
        try:
            await dog.check()
        except Exception:
            log.exception("run-time watchdog pass failed")
