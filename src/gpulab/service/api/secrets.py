"""REST API of users' secrets (under /services/gpulab/api/secrets): names in, values never out.

``PUT /api/secrets/NAME`` with ``{"value": "..."}`` stores (or replaces) one, ``GET
/api/secrets`` lists names and times, ``DELETE /api/secrets/NAME`` removes one. A job refers to
a secret from its environment (``{"secret": NAME}``) and gets its value in its container only.
Each user sees and touches only their own: no API or page reads a value back, admins
included. (A running job's environment holds it: whoever may exec into that job, its owner and
admins, can see it there; each exec is recorded in the job's events.) The scopes are the
jobs' (secrets exist for jobs): read to list, manage to change.
"""

from __future__ import annotations

import asyncio
import json

from ...secrets import SecretError, SecretMissing, SecretStore, SecretsUnavailable, check_name
from ..base import JOBS_MANAGE, JOBS_READ, ApiError, BaseHandler, authenticated, read


class SecretsBase(BaseHandler):
    @property
    def store(self) -> SecretStore:
        try:
            return self.settings["secrets"].enabled()
        except SecretsUnavailable as e:
            raise ApiError(503, str(e)) from None

    def secret_name(self, name: str) -> str:
        try:
            return check_name(name)
        except SecretError as e:
            raise ApiError(400, str(e), field="name") from None


class SecretsHandler(SecretsBase):
    @authenticated
    async def get(self):
        """Your secrets' names, with when each was created and last set (never the values)."""
        me = self.require(JOBS_READ)
        infos = await read(self.store.names, me["name"])
        self.write_json({"secrets": [i.to_json() for i in infos]})


class SecretHandler(SecretsBase):
    @authenticated
    async def get(self, name: str):
        me = self.require(JOBS_READ)
        name = self.secret_name(name)
        try:
            info = await read(self.store.info, me["name"], name)
        except SecretMissing as e:
            raise ApiError(404, str(e)) from None
        self.write_json(info.to_json())

    @authenticated
    async def put(self, name: str):
        """Store or replace a secret: 201 when new, 200 when replaced; the answer has no value."""
        me = self.require(JOBS_MANAGE)
        name = self.secret_name(name)
        try:
            body = json.loads(self.request.body or b"")
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict) or set(body) != {"value"}:
            raise ApiError(400, 'the body must be {"value": "..."}', field="body")
        store = self.store
        try:
            info, new = await asyncio.to_thread(store.put, me["name"], name, body["value"])
        except SecretError as e:
            raise ApiError(400, str(e), field=e.field) from None
        except SecretsUnavailable as e:
            raise ApiError(503, str(e)) from None
        self.write_json(info.to_json(), 201 if new else 200)

    @authenticated
    async def delete(self, name: str):
        me = self.require(JOBS_MANAGE)
        name = self.secret_name(name)
        try:
            await asyncio.to_thread(self.store.remove, me["name"], name)
        except SecretMissing as e:
            raise ApiError(404, str(e)) from None
        self.set_status(204)
        self.finish()
