"""REST API of notebooks (under /services/gpulab/api/notebooks): read them, retry a push.

Users see only their own notebooks; admins may read anyone's. Someone else's notebook is a
404, never a 403, so that its existence is not revealed.
"""

from __future__ import annotations

from ...lifecycle import NotebookState
from ...names import notebook_workload_id
from ...notebooks.data import NotebookData, PushRaced, retry_push
from ...settings import GpulabSettings
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
        me = self.current_user
        nb = await self.owned_notebook(user, server, NB_MANAGE)
        if nb["state"] != NotebookState.SYNC_FAILED.value:
            raise ApiError(
                409, f"only a SYNC_FAILED notebook's push can be retried; this one is {nb['state']}"
            )
        gpulab: GpulabSettings = self.settings["gpulab"]
        workload = notebook_workload_id(gpulab.instance, user, server)
        data = NotebookData.of_record(gpulab, self.settings["runtime"], nb, workload)
        try:  # compare-and-set: of two retries at once, one pushes, the other is a 409
            ok, _, result = await retry_push(
                self.records, data, user, server, f"push retried by {me['name']}"
            )
        except PushRaced as e:
            if e.during:
                raise ApiError(
                    409, "this notebook changed during the push: read its state"
                ) from None
            raise ApiError(
                409, "this notebook changed meanwhile (another push retry or a start): try again"
            ) from None
        self.write_json(result, 200 if ok else 502)
