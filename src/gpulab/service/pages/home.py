"""The home page: the caller's notebooks, their recent jobs and job counts, their billed
minutes, and the free GPUs (:func:`gpulab.jobs.overview.home_overview`); a notebook's "Push
now" button (:meth:`gpulab.notebooks.live.NotebookLivePushes.push`)."""

from __future__ import annotations

import asyncio
import functools

from ...jobs.overview import home_overview
from ...lifecycle import NotebookState
from ...notebooks.life import NotebookRefused
from ..base import JOBS_READ, NB_MANAGE, NB_READ, ApiError, authenticated
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


class NotebookPushPage(PageHandler):
    """The home page's "Push now" of one of the caller's running notebooks (or "Retry push"
    of a SYNC_FAILED one), answered with a redirect to the home page."""

    @authenticated
    async def post(self, server: str):
        me = self.require(NB_MANAGE)
        nb = await self.owned_notebook(me["name"], server, NB_MANAGE)
        try:
            status, after = await self.settings["notebook_pushes"].push(nb, by=me["name"])
        except NotebookRefused as e:
            raise ApiError(e.status, e.message) from None
        if status == 502:
            raise ApiError(502, after.get("history", [{}])[-1].get("message", "push failed"))
        self.redirect(self.page_url("/"), status=303)
