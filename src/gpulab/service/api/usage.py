"""Billed minutes over the REST API (``/api/usage``): jobs and notebooks, per user."""

from __future__ import annotations

from ...jobs.overview import usage_and_share
from ..base import JOBS_READ, BaseHandler, authenticated, read


class UsageHandler(BaseHandler):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user, and
        the user's place in the fair share."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", me["name"])
        self.whose(me, user, "only admins may read other users' usage")
        self.write_json(await read(usage_and_share, self.supervisor, self.records, user))
