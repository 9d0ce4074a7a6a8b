"""Billed minutes over the REST API (``/api/usage``): jobs and notebooks, per user."""

from __future__ import annotations

from ...billing import user_usage
from ..base import JOBS_READ, BaseHandler, authenticated, read


class UsageHandler(BaseHandler):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", me["name"])
        self.whose(me, user, "only admins may read other users' usage")

        def both() -> dict[str, int]:  # one hop to a thread, not two
            jobs = self.jobs.usage(user)["jobs_billed_minutes"]
            return user_usage(jobs, self.records.billed_minutes(user))

        self.write_json({"user": user, **await read(both)})
