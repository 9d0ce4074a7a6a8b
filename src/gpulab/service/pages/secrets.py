"""The secrets page: your secrets' names, a form to set one, a button to delete one (the
values are never shown; the REST API is :mod:`gpulab.service.api.secrets`)."""

from __future__ import annotations

import asyncio

from ...secrets import SecretError, SecretMissing, SecretsUnavailable
from ..base import JOBS_MANAGE, JOBS_READ, ApiError, authenticated, read
from .base import PageHandler


class SecretsPage(PageHandler):
    """Your secrets: their names, a form to set one, a button to delete one."""

    @authenticated
    async def get(self):
        await self.show({})

    async def show(self, errors: dict[str, str], status: int = 200, saved: str = "") -> None:
        me = self.require(JOBS_READ)
        store = self.settings["secrets"]
        names = await read(store.names, me["name"]) if store.available else []
        self.render_page(
            "secrets.html",
            status=status,
            secrets=[i.to_json() for i in names],
            enabled=store.available,
            errors=errors,
            saved=saved,
        )

    @authenticated
    async def post(self):
        me = self.require(JOBS_MANAGE)
        store = self.settings["secrets"]
        name = self.get_body_argument("name", "").strip()
        if self.get_body_argument("action", "set") == "delete":
            try:
                await asyncio.to_thread(store.remove, me["name"], name)
            except SecretMissing as e:
                raise ApiError(404, str(e)) from None
            return self.redirect(self.page_url("secrets"), status=303)
        try:
            await asyncio.to_thread(
                store.put, me["name"], name, self.get_body_argument("value", "")
            )
        except SecretError as e:
            return await self.show({e.field: str(e)}, status=400)
        except SecretsUnavailable as e:
            return await self.show({"form": str(e)}, status=503)
        await self.show({}, saved=name)
