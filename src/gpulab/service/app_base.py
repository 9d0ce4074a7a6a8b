"""What every handler of the gpulab service shares: identity, JSON answers, clear errors."""

from __future__ import annotations

import asyncio
import functools
import json

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from ..bounds import body_too_large
from ..notebooks import NotebookRecords
from .bodylimit import request_cap


class ApiError(web.HTTPError):
    """An error answered as JSON: {status, message, field?}. ``field`` names the bad input."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(status, "%s", message)
        self.message = message
        self.field = field


def authenticated(method):
    """Like tornado's, but an API client (anything that is not a browser page load) gets a JSON
    403 saying what is wrong instead of a redirect to the hub's log-in page."""

    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        if self.current_user is None:
            browser = "text/html" in self.request.headers.get("Accept", "")
            token = self.request.headers.get("Authorization")
            if self.request.method in ("GET", "HEAD") and browser and not token:
                self.redirect(self.get_login_url())
                return None
            why = "invalid or expired token" if token else "log in or send a hub API token"
            raise ApiError(403, f"not authenticated: {why} (Authorization: token ...)")
        return await method(self, *args, **kwargs)

    return wrapper


class NotFoundHandler(web.RequestHandler):
    """JSON 404 for any path the API does not serve."""

    def prepare(self):
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": 404, "message": f"no such path {self.request.path}"}))


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    @property
    def records(self) -> NotebookRecords:
        return self.settings["records"]

    def prepare(self):
        """Refuse an oversized body (JSON 413 naming the limit) before any handler parses it:
        a chunked one, read up to the server's limit (declared ones: bodylimit.py)."""
        why = body_too_large(len(self.request.body or b""), request_cap(self.settings))
        if why:
            raise ApiError(413, why, field="body")

    def is_admin(self, user: dict) -> bool:
        """Admins (users or services) are those whose token holds admin:servers."""
        scopes = user.get("scopes", ())
        return (
            bool(user.get("admin")) or "admin:servers" in scopes or "custom:gpulab:admin" in scopes
        )

    async def owned_notebook(self, user: str, server: str) -> dict:
        """The notebook, if the caller owns it or is an admin; else 404 (never 403)."""
        me = self.current_user
        nb = None
        if user == me["name"] or self.is_admin(me):
            nb = await asyncio.to_thread(self.records.get, user, server)
        if nb is None:
            raise ApiError(404, f"no notebook {server or '(default)'} for {user}")
        return nb

    def write_json(self, obj, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code: int, **kwargs) -> None:
        message = self._reason
        body: dict = {"status": status_code}
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if isinstance(exc, ApiError) and exc.field:
            body["field"] = exc.field
        body["message"] = message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class HealthHandler(web.RequestHandler):
    def get(self):
        self.finish({"status": "ok"})
