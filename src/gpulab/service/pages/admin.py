"""The admin page: every GPU and what holds it (whole, or the slots of a shared one), every
notebook and job, a table of users with their limits, quotas and billed minutes, and the
catalog's images with their build (flavour, the CUDA they need) and whether GPU workloads may
use them here (:func:`gpulab.jobs.overview.admin_overview`)."""

from __future__ import annotations

from ...jobs.overview import admin_overview
from ...resources import format_memory
from ..base import authenticated
from .base import PageHandler


class AdminPage(PageHandler):
    @authenticated
    async def get(self):
        self.require_admin()
        s = self.settings["gpulab"]
        overview = await admin_overview(self.supervisor, s, self.records)
        self.render_page("admin.html", **overview, settings=s, format_memory=format_memory)
