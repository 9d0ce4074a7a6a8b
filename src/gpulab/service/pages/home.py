"""The home page: the caller's notebooks, their recent jobs and job counts, their billed
minutes, and the free GPUs."""

from __future__ import annotations

import asyncio

from ...jobs.overview import usage_of
from ...lifecycle import NotebookState
from ..base import JOBS_READ, NB_READ, authenticated
from .base import PageHandler


class HomePage(PageHandler):
    @authenticated
    async def get(self):
        me = self.require(JOBS_READ)
        notebooks = (
            await asyncio.to_thread(self.records.list, me["name"]) if self.has(NB_READ) else []
        )
        recent, jobs_total = await asyncio.to_thread(
            self.jobs.page, me["name"], None, None, 5, 0, True
        )
        counts = await asyncio.to_thread(self.jobs.counts, me["name"])
        usage = await asyncio.to_thread(usage_of, self.jobs, self.records, me["name"])
        free, total = await self.gpu_counts()
        try:
            shared = await asyncio.to_thread(self.supervisor.ledger.shared_free)
        except Exception:
            shared = {}
        self.render_page(
            "home.html",
            notebooks=notebooks,
            recent_jobs=recent,
            job_counts=counts,
            jobs_total=jobs_total,
            usage=usage,
            gpus_free=free,
            gpus_total=total,
            shared=shared,
            running=NotebookState.RUNNING.value,
        )

    async def gpu_counts(self) -> tuple[int | None, int]:
        ledger = self.supervisor.ledger
        try:
            return await asyncio.to_thread(ledger.free_count), len(ledger.devices)
        except Exception:
            return None, len(ledger.devices)
