"""Billed minutes over the REST API: ``/api/usage`` (jobs and notebooks, per user, all time)
and ``/api/usage/report`` (jobs, per user, one month, from the kept totals)."""

from __future__ import annotations

from urllib.parse import urlencode

from ...bounds import page_window
from ...errors import FieldError
from ...jobs.overview import month_usage, usage_and_share
from ..base import JOBS_READ, ApiError, BaseHandler, answer_refusals, authenticated, read

#: the longest ``after`` (a user's name) the report takes
MAX_AFTER = 255


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
        the caller's own otherwise; a page of ``limit`` users by name after ``after``, with
        the URL of the next (``next``, None at the end)."""
        me = self.require(JOBS_READ)
        user = self.get_argument("user", None)
        if user is None and not self.is_admin(me):
            user = me["name"]
        if user is not None:
            self.whose(me, user, "only admins may read other users' usage")
        after = self.get_argument("after", None, strip=False)
        if after is not None and len(after) > MAX_AFTER:
            raise ApiError(400, f"after must be at most {MAX_AFTER} characters", field="after")
        if after is not None and any(ord(c) < 32 or ord(c) == 127 for c in after):
            # no user's name has one (and PostgreSQL refuses a NUL in a query: a 500)
            raise ApiError(400, "after must not contain control characters", field="after")
        try:
            limit, _ = page_window(self.get_argument("limit", None, strip=False), None)
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        month = self.get_argument("month", None)
        with answer_refusals():
            report = await read(month_usage, self.jobs, month, user, after, limit)
        nxt = report.pop("next_after")
        if nxt is not None:
            args = [("month", report["month"]), ("after", nxt), ("limit", str(limit))]
            if user is not None and self.get_argument("user", None) is not None:
                args.append(("user", user))
            nxt = f"{self.request.path}?{urlencode(args)}"
        self.write_json({**report, "limit": limit, "next": nxt})
