"""The admin page: every GPU and what holds it (whole, or the slots of a shared one), a page
of notebooks, the newest jobs and the counts of each state, a page of users (by name) with
their limits, quotas and billed minutes, and the catalog's images with their build (flavour,
the CUDA they need) and whether GPU workloads may use them here
(:func:`gpulab.jobs.overview.admin_overview`). Its cost does not grow with the records kept:
counts and pages only, the next page of users (``?users_after=NAME``) and of notebooks
(``?nb_user=NAME&nb_server=SERVER``) named by where the last one ended."""

from __future__ import annotations

from ...jobs.overview import admin_overview
from ...resources import format_memory
from ..base import ApiError, authenticated
from .base import PageHandler

#: the longest cursor accepted (a user's or a server's name)
MAX_CURSOR = 255


class AdminPage(PageHandler):
    @authenticated
    async def get(self):
        self.require_admin()
        s = self.settings["gpulab"]
        users_after = self._cursor("users_after")
        nb_user, nb_server = self._cursor("nb_user"), self._cursor("nb_server")
        overview = await admin_overview(
            self.supervisor,
            s,
            self.records,
            users_after=users_after,
            notebooks_after=(nb_user, nb_server) if nb_user else None,
        )
        await self.render_big_page(
            "admin.html", **overview, settings=s, format_memory=format_memory
        )

    def _cursor(self, name: str) -> str:
        raw = self.get_argument(name, "", strip=False)
        if len(raw) > MAX_CURSOR:
            raise ApiError(400, f"{name} must be at most {MAX_CURSOR} characters", field=name)
        if any(ord(c) < 32 or ord(c) == 127 for c in raw):  # no name has one (a database
            raise ApiError(400, f"{name} must not contain control characters", field=name)
        return raw
