"""Running notebooks' periodic live pushes (:mod:`gpulab.notebooks.live`): a look every few
seconds, while this service leads, starts each one whose interval has passed (jobs' live
pushes run from the job supervisor's watch of each job)."""

from __future__ import annotations

import asyncio
import logging

from ...jobs.supervisor.supervisor import JobSupervisor
from ...notebooks.live import NotebookLivePushes
from ...settings import GpulabSettings

log = logging.getLogger(__name__)


def look_every(settings: GpulabSettings) -> float:
    """Seconds between two looks: a tenth of the shortest interval a notebook may have (the
    site's floor), from 1 to 30 s, so a push starts at most that late."""
    return min(30.0, max(1.0, settings.sync_interval_floor / 10))


async def live_push_loop(
    settings: GpulabSettings, supervisor: JobSupervisor, pushes: NotebookLivePushes
) -> None:
    """Every :func:`look_every` seconds, while this service leads and some interval is set
    (the site's or a flavor's): :meth:`NotebookLivePushes.look`."""
    flavors = [f.sync_interval for f in settings.flavor_map.values()]
    if not settings.sync_interval and not any(flavors):
        return  # no notebook is ever pushed live on this site (its owners' "push now" is)
    while True:
        await asyncio.sleep(look_every(settings))
        if not supervisor.leading.is_set():
            continue  # a service in standby acts on nothing
        try:
            await pushes.look()
        except Exception:
            log.exception("notebooks' live push look failed")
