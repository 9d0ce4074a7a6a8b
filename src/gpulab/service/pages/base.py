"""What every gpulab web page shares: the Jinja templates and their filters, the page
handler (HTML errors, the admin check), the static files.

The pages (HTML from Jinja templates) are served by the service beside its JSON API.

Pages call what the API calls: the same records, the same job submission and job actions
(:mod:`gpulab.jobs.actions`), so a page can never accept what the API refuses. Identity is the
hub's OAuth cookie; JupyterHub's ``HubOAuthenticated`` ignores that cookie on a POST (or a
script's fetch) whose ``_xsrf`` token is missing or wrong, so every form carries
``xsrf_form_html()`` and scripts send ``X-XSRFToken``. API clients with ``Authorization:
token`` are not affected.
"""

from __future__ import annotations

import os
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.utils import url_path_join
from tornado import web

from ...disk_quota import human
from ...durations import format_duration
from ...jobs.gang import workers_of
from ...jobs.records import ACTIVE, ENDED
from ...lifecycle import JobState
from ..base import ApiError, BaseHandler, read

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

_env = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)

JOB_STATES = [s.value for s in JobState]
ENDED_STATES = sorted(s.value for s in ENDED)
ACTIVE_STATES = sorted(s.value for s in ACTIVE)


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(value: str | None) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM:SS' (UTC)."""
    t = _parse_time(value)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "—"


def ago(value: str | None) -> str:
    """How long ago: '42 s', '5 min', '3 h 2 min', '4 d 1 h'."""
    t = _parse_time(value)
    if t is None:
        return ""
    s = max(0, int((datetime.now(UTC) - t).total_seconds()))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def state_class(state: str | None) -> str:
    """CSS class of a state badge: ok / run / wait / bad / off."""
    if state in ("DONE",):
        return "ok"
    if state in ("RUNNING",):
        return "run"
    if state in ("FAILED", "ERROR", "SYNC_FAILED", "TIMEOUT"):
        return "bad"
    if state in ("STOPPED", "INTERRUPTED", "DELETED"):
        return "off"
    return "wait"


def gpu_total(job: dict) -> str:
    """A job's GPUs in all: '1'; a distributed job's total, then how it is split:
    '4 (2 workers × 2)'."""
    gpus = ((job.get("spec") or {}).get("resources") or {}).get("gpus")
    if gpus is None:
        return "—"
    n = workers_of(job)
    return str(gpus) if n == 1 else f"{n * int(gpus)} ({n} workers × {gpus})"


_env.filters["when"] = when
_env.filters["workers"] = workers_of
_env.filters["gpu_total"] = gpu_total
_env.filters["ago"] = ago
_env.filters["bytes"] = human
_env.filters["state_class"] = state_class
_env.filters["shjoin"] = lambda words: shlex.join(str(w) for w in words)
_env.filters["duration"] = lambda s: format_duration(float(s)) if s is not None else "—"


def _service_prefix() -> str:
    return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")


def _hub_prefix() -> str:
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/")


def _users_prefix() -> str:
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "user/")


class PageHandler(BaseHandler):
    """Renders templates; errors are HTML pages (a clear 403/404), not JSON."""

    def page_url(self, *parts: str) -> str:
        return url_path_join(_service_prefix(), *parts)

    def _page_context(self) -> dict[str, Any]:
        """What every page's template is given besides its own context: worked out on the
        event loop (the XSRF token sets its cookie), so that a render may run elsewhere."""
        me = getattr(self, "_current_user", None)
        form_html = self.xsrf_form_html() if me else ""
        return {
            "me": me,
            "is_admin": bool(me) and self.is_admin(me),
            "prefix": _service_prefix(),
            "hub": _hub_prefix(),
            "users_prefix": _users_prefix(),
            "static": self.page_url("static") + "/",
            "xsrf_token": self.xsrf_token.decode("ascii") if me else "",
            "xsrf_form_html": lambda: form_html,
            "request_path": self.request.path,
        }

    def render_page(self, template: str, status: int = 200, **ctx: Any) -> None:
        html = _env.get_template(template).render(**self._page_context(), **ctx)
        self._send_page(html, status)

    async def render_big_page(self, template: str, status: int = 200, **ctx: Any) -> None:
        """:meth:`render_page` for a page of many rows (the jobs page's 200, the admin's
        users and notebooks): rendered on the API's read pool, not on the event loop, where
        it held every other request for 7 ms, and at times over 20 ms (bench/bench_loop.py)."""
        base = self._page_context()

        def render() -> str:  # the template's first compile off the loop too
            return _env.get_template(template).render(**base, **ctx)

        html = await read(render)
        self._send_page(html, status)

    def _send_page(self, html: str, status: int) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(html)

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, ApiError):
            message = exc.message
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if status_code == 403 and getattr(self, "_current_user", None) is None:
            # a form posted without (or with a stale) XSRF token is not authenticated
            message = (
                "You are not logged in here, or the form had expired. Reload the page "
                "(log in again if asked) and try once more."
            )
        titles = {
            403: "Not allowed",
            404: "Not found",
            400: "Not accepted",
            409: "Not possible now",
        }
        try:
            self.render_page(
                "error.html",
                status=status_code,
                code=status_code,
                title=titles.get(status_code, "Something went wrong"),
                message=message,
            )
        except Exception:  # never fail while reporting a failure
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"{status_code}: {message}\n")

    def require_admin(self) -> dict:
        me = self.current_user
        if not self.is_admin(me):
            raise ApiError(
                403,
                "This page is for gpulab administrators. Your own notebooks and jobs are on "
                "the gpulab home page.",
            )
        return me


class StaticHandler(web.StaticFileHandler):
    """The pages' CSS and JS, from the package (no CDN)."""

    def initialize(self, path: str = str(STATIC), default_filename: str | None = None) -> None:
        super().initialize(path=path, default_filename=default_filename)
