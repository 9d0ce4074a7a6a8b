"""Billed minutes over the REST API (``/api/usage``): jobs and notebooks, per user."""

from __future__ import annotations

from ..base import JOBS_READ, BaseHandler, authenticated, read


class UsageHandler(BaseHandler):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", me["name"])
        self.whose(me, user, "only admins may read other users' usage")

        def both() -> tuple[dict, int]:  # one hop to a thread, not two
            return self.jobs.usage(user), self.records.billed_minutes(user)

        jobs, notebooks = await read(both)
        self.write_json(
            {
                "user": user,
                "jobs_billed_minutes": jobs["jobs_billed_minutes"],
                "notebooks_billed_minutes": notebooks,
                "billed_minutes": jobs["jobs_billed_minutes"] + notebooks,
            }
        )
