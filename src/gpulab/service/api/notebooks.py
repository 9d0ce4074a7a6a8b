"""REST API of notebooks (under /services/gpulab/api/notebooks): read them, retry a push.

Users see only their own notebooks; admins may read anyone's. Someone else's notebook is a
404, never a 403, so that its existence is not revealed.
"""

from __future__ import annotations

from ...notebooks.life import NotebookRefused, push_again
from ..base import NB_MANAGE, NB_READ, ApiError, BaseHandler, authenticated, read


class NotebooksHandler(BaseHandler):
    @authenticated
    async def get(self):
        """The caller's notebooks; admins may ask for ?user=NAME or ?all=true."""
        me = self.require(NB_READ)
        user = self.get_argument("user", me["name"])
        user = self.whose(
            me,
            None if self.flag("all") else user,
            "only admins (custom:gpulab:admin) may list other users' notebooks",
        )
        limit, offset = self.page_args()
        rows, total = await read(self.records.page, user, limit, offset)
        self.write_page("notebooks", rows, total, limit, offset)


class NotebookHandler(BaseHandler):
    @authenticated
    async def get(self, user: str, server: str):
        """One notebook with its state and history. The default server is the empty name."""
        self.write_json(await self.owned_notebook(user, server))


class NotebookPushHandler(BaseHandler):
    """Retry the push of a notebook whose last push failed (SYNC_FAILED)."""

    @authenticated
    async def post(self, user: str, server: str):
        nb = await self.owned_notebook(user, server, NB_MANAGE)
        try:
            ok, result = await push_again(
                self.settings["gpulab"],
                self.settings["runtime"],
                self.records,
                nb,
                by=self.current_user["name"],
            )
        except NotebookRefused as e:
            raise ApiError(e.status, e.message) from None
        self.write_json(result, 200 if ok else 502)
