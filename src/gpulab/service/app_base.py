"""What every handler of the gpulab service shares: identity, JSON answers, clear errors."""

from __future__ import annotations

import json

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from ..notebooks import NotebookRecords


class ApiError(web.HTTPError):
    """An error answered as JSON: {status, message, field?}. ``field`` names the bad input."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(status, "%s", message)
        self.message = message
        self.field = field


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    @property
    def records(self) -> NotebookRecords:
        return self.settings["records"]

    def is_admin(self, user: dict) -> bool:
        """Admins (users or services) are those whose token holds admin:servers."""
        scopes = user.get("scopes", ())
        return (
            bool(user.get("admin")) or "admin:servers" in scopes or "custom:gpulab:admin" in scopes
        )

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
