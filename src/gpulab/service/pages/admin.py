"""The admin page: every GPU and what holds it (whole, or the slots of a shared one), every
notebook and job, and a table of users with their limits, quotas and billed minutes
(:func:`gpulab.jobs.overview.admin_overview`); the catalog's images with their build (flavour,
the CUDA they need) and whether GPU workloads may use them here (:func:`.base.catalog_images`)."""

from __future__ import annotations

import asyncio

from ...jobs.overview import admin_overview
from ...resources import format_memory
from ..base import authenticated
from .base import PageHandler, catalog_images


class AdminPage(PageHandler):
    @authenticated
    async def get(self):
        self.require_admin()
        s = self.settings["gpulab"]
        overview = await asyncio.to_thread(admin_overview, self.supervisor, s, self.records)
        images = await catalog_images(s, self.supervisor.runtime)
        self.render_page(
            "admin.html", **overview, images=images, settings=s, format_memory=format_memory
        )
