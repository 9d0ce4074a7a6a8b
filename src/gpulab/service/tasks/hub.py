"""A small client of the hub's REST API, with the service's own token."""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError


class HubClient:
    def __init__(self, api_url: str | None = None, token: str | None = None):
        self.api_url = (api_url or os.environ["JUPYTERHUB_API_URL"]).rstrip("/")
        self._token = token or os.environ["JUPYTERHUB_API_TOKEN"]
        self.http = AsyncHTTPClient()

    async def request(self, method: str, path: str, body: dict | None = None) -> dict | None:
        resp = await self.http.fetch(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self._token}"},
            body=json.dumps(body)
            if body is not None
            else (None if method in ("GET", "DELETE") else ""),
            allow_nonstandard_methods=True,
            request_timeout=60,
        )
        return json.loads(resp.body) if resp.body else None

    @staticmethod
    def server_path(user: str, server: str) -> str:
        u = quote(user, safe="")
        return f"/users/{u}/servers/{quote(server, safe='')}" if server else f"/users/{u}/server"

    async def server_model(self, user: str, server: str) -> dict | None:
        model = await self.request("GET", f"/users/{quote(user, safe='')}")
        return (model or {}).get("servers", {}).get(server)

    async def stop_server(self, user: str, server: str, timeout: float = 120) -> None:
        try:
            await self.request("DELETE", self.server_path(user, server))
        except HTTPClientError as e:
            if e.code != 400:  # 400: not running
                raise
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if await self.server_model(user, server) is None:
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{user}/{server} did not stop within {timeout:g} s")

    async def start_server(self, user: str, server: str, user_options: dict) -> None:
        await self.request("POST", self.server_path(user, server), {"user_options": user_options})
