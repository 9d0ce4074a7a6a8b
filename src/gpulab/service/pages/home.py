"""The home page: the caller's notebooks, their recent jobs and job counts, their billed
minutes, and the free GPUs (:func:`gpulab.jobs.overview.home_overview`)."""

from __future__ import annotations

import asyncio
import functools

from ...jobs.overview import home_overview
from ...lifecycle import NotebookState
from ..base import JOBS_READ, NB_READ, authenticated
from .base import PageHandler


class HomePage(PageHandler):
    @authenticated
    async def get(self):
        me = self.require(JOBS_READ)
        home = await asyncio.to_thread(
            functools.partial(
                home_overview,
                self.supervisor,
                self.records,
                me["name"],
                with_notebooks=self.has(NB_READ),
            )
        )
        self.render_page("home.html", **home, running=NotebookState.RUNNING.value)
