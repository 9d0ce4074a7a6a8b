"""REST API of notebooks (under /services/gpulab/api/notebooks): read them and their output,
push a running one's data now, retry a failed push.

Users see only their own notebooks; admins may read anyone's. Someone else's notebook is a
404, never a 403, so that its existence is not revealed.
"""

from __future__ import annotations

import asyncio

from ... import checks
from ...errors import FieldError
from ...notebooks.life import NotebookRefused
from ...notebooks.output import NoOutput, read_output, tail_lines
from ...notebooks.records import notebook_cursor, parse_notebook_cursor
from ..base import (
    NB_MANAGE,
    NB_READ,
    ApiError,
    BaseHandler,
    answer_refusals,
    authenticated,
    pool,
    read,
)


class NotebooksHandler(BaseHandler):
    @authenticated
    async def get(self):
        """The caller's notebooks; admins may ask for ?user=NAME or ?all=true; ?label=k=v
        (repeatable) keeps those with every one of these labels; a page (?limit=), after
        ?cursor= (the previous page's ``next`` carries it) or ?offset=."""
        me = self.require(NB_READ)
        user = self.get_argument("user", me["name"])
        user = self.whose(
            me,
            None if self.flag("all") else user,
            "only admins (custom:gpulab:admin) may list other users' notebooks",
        )
        try:
            labels = checks.label_filters(FieldError, self.get_arguments("label"))
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        limit, offset = self.page_args()
        cursor = self.get_argument("cursor", None, strip=False)
        after = None
        if cursor is not None:
            try:
                after = parse_notebook_cursor(cursor)
            except ValueError as e:
                raise ApiError(400, str(e), field="cursor") from None
        # one more than the page: whether a next one exists, wherever the cursor stands
        rows, total = await read(self.records.page, user, limit + 1, offset, labels, after)
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = notebook_cursor(rows[-1]) if more else None
        self.write_page("notebooks", rows, total, limit, offset, nxt)


class NotebookHandler(BaseHandler):
    @authenticated
    async def get(self, user: str, server: str):
        """One notebook with its state and history. The default server is the empty name."""
        self.write_json(await self.owned_notebook(user, server))


class NotebookLogsHandler(BaseHandler):
    """The tail of a notebook's output (?tail=N lines), scrubbed of credentials: its owner's
    and admins' (anyone else: 404); 409 while it has no container."""

    @authenticated
    async def get(self, user: str, server: str):
        nb = await self.owned_notebook(user, server)
        try:
            lines = tail_lines(self.get_argument("tail", None, strip=False))
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        loop = asyncio.get_running_loop()
        with answer_refusals():  # an engine that fails: 502, or 503 naming it
            try:
                text = await loop.run_in_executor(
                    pool("logs"), read_output, self.settings["runtime"], nb, lines
                )
            except NoOutput as e:
                raise ApiError(409, str(e)) from None
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(text)


class NotebookPushHandler(BaseHandler):
    """Push a RUNNING notebook's workspace, home and writable volumes now (a live push, 202),
    or retry the push of a notebook whose last push failed (SYNC_FAILED: 200, or 502)."""

    @authenticated
    async def post(self, user: str, server: str):
        nb = await self.owned_notebook(user, server, NB_MANAGE)
        try:
            status, result = await self.settings["notebook_pushes"].push(
                nb, by=self.current_user["name"]
            )
        except NotebookRefused as e:
            raise ApiError(e.status, e.message) from None
        self.write_json(result, status)
