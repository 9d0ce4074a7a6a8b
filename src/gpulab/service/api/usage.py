"""Billed minutes over the REST API: ``/api/usage`` (jobs and notebooks, per user, all time)
and ``/api/usage/report`` (jobs, per user, one month, from the kept totals)."""

from __future__ import annotations

from ...jobs.overview import month_usage, usage_and_share
from ..base import JOBS_READ, BaseHandler, answer_refusals, authenticated, read


class UsageHandler(BaseHandler):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user, and
        the user's place in the fair share."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", me["name"])
        self.whose(me, user, "only admins may read other users' usage")
        self.write_json(await read(usage_and_share, self.supervisor, self.records, user))


class UsageReportHandler(BaseHandler):
    @authenticated
    async def get(self):
        """One month's billed job minutes by user: everyone's for an admin (or ``user``'s),
        the caller's own otherwise."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", None)
        if user is None and not self.is_admin(me):
            user = me["name"]
        if user is not None:
            self.whose(me, user, "only admins may read other users' usage")
        with answer_refusals():
            report = await read(month_usage, self.jobs, self.get_argument("month", None), user)
        self.write_json(report)
