"""The gpulab hub service: a tornado app under /services/gpulab/, and its route tables.

Browsers come through the hub's OAuth; API clients send a hub token. The REST API is in
``api/``, the pages in ``pages/``, what every handler shares in ``base.py``; the periodic
stops through the hub (``tasks/``) run beside the app (``__main__.py``).
"""

from __future__ import annotations

import logging
import os

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web

from ..jobs.actions import ACTIONS
from ..jobs.supervisor.supervisor import JobSupervisor
from ..logscrub import request_summary
from ..metrics import API_REQUESTS
from ..notebooks.live import NotebookLivePushes
from ..notebooks.records import NotebookRecords
from ..settings import GpulabSettings
from .api.exec import JobExecHandler, JobShellHandler
from .api.jobs import JobActionHandler, JobEventsHandler, JobHandler, JobsHandler
from .api.logs import JobLogsHandler
from .api.monitoring import HealthHandler, MetricsHandler
from .api.notebooks import (
    NotebookHandler,
    NotebookLogsHandler,
    NotebookPushHandler,
    NotebooksHandler,
)
from .api.openapi import OpenAPIHandler
from .api.ports import CUT_RELAYS, JobPortHandler
from .api.secrets import SecretHandler, SecretsHandler
from .api.snapshots import SnapshotHandler, SnapshotRestoreHandler, SnapshotsHandler
from .api.usage import UsageHandler, UsageReportHandler
from .base import BoundedApplication, NotFoundHandler, ScrubbedLogs
from .pages.admin import AdminPage
from .pages.base import StaticHandler
from .pages.home import HomePage, NotebookPushPage
from .pages.jobs import JobActionPage, JobPage, JobsPage, SubmitJobPage
from .pages.secrets import SecretsPage

log = logging.getLogger("gpulab.service")


#: the job actions a path may name (jobs.actions.ACTIONS)
_ACTIONS = "|".join(ACTIONS)

# path (relative to the service prefix, as in the OpenAPI document) -> handler
ROUTES: list[tuple[str, str, type]] = [
    ("/api/health", r"api/health", HealthHandler),
    ("/api/openapi.json", r"api/openapi.json", OpenAPIHandler),
    ("/api/notebooks", r"api/notebooks", NotebooksHandler),
    ("/api/notebooks/{user}/{server}", r"api/notebooks/([^/]+)/([^/]*)", NotebookHandler),
    (
        "/api/notebooks/{user}/{server}/logs",
        r"api/notebooks/([^/]+)/([^/]*)/logs",
        NotebookLogsHandler,
    ),
    (
        "/api/notebooks/{user}/{server}/push",
        r"api/notebooks/([^/]+)/([^/]*)/push",
        NotebookPushHandler,
    ),
    ("/api/snapshots/{user}", r"api/snapshots/([^/]+)", SnapshotsHandler),
    ("/api/snapshots/{user}/{name}", r"api/snapshots/([^/]+)/([^/]+)", SnapshotHandler),
    (
        "/api/snapshots/{user}/{name}/restore",
        r"api/snapshots/([^/]+)/([^/]+)/restore",
        SnapshotRestoreHandler,
    ),
    ("/api/jobs", r"api/jobs/?", JobsHandler),
    ("/api/jobs/{job_id}", r"api/jobs/([a-z0-9]+)", JobHandler),
    ("/api/jobs/{job_id}/events", r"api/jobs/([a-z0-9]+)/events", JobEventsHandler),
    ("/api/jobs/{job_id}/logs", r"api/jobs/([a-z0-9]+)/logs", JobLogsHandler),
    ("/api/jobs/{job_id}/exec", r"api/jobs/([a-z0-9]+)/exec", JobExecHandler),
    ("/api/jobs/{job_id}/shell", r"api/jobs/([a-z0-9]+)/shell", JobShellHandler),
    (
        "/api/jobs/{job_id}/{action}",
        rf"api/jobs/([a-z0-9]+)/({_ACTIONS})",
        JobActionHandler,
    ),
    ("/api/usage", r"api/usage", UsageHandler),
    ("/api/usage/report", r"api/usage/report", UsageReportHandler),
    ("/api/secrets", r"api/secrets/?", SecretsHandler),
    ("/api/secrets/{name}", r"api/secrets/([^/]+)", SecretHandler),
]

# Prometheus' endpoint (not JSON: kept out of ROUTES and the OpenAPI document, like
# JupyterHub's /hub/metrics)
OTHER_ROUTES: list[tuple[str, str, type]] = [
    ("/metrics", r"metrics", MetricsHandler),
    # a running job's ports (any content, HTTP and websockets: service/api/ports.py)
    (
        "/jobs/{job_id}/ports/{name}/{path}",
        r"jobs/([a-z0-9]+)/ports/([a-z][a-z0-9-]{0,31})(/.*)?",
        JobPortHandler,
    ),
]

# the web pages (HTML, not API: kept out of ROUTES and the OpenAPI document)
PAGE_ROUTES: list[tuple[str, str, type]] = [
    ("/", r"", HomePage),
    ("/jobs", r"jobs/?", JobsPage),
    ("/jobs/new", r"jobs/new", SubmitJobPage),
    ("/jobs/{job_id}", r"jobs/([a-z0-9]+)", JobPage),
    ("/jobs/{job_id}/{action}", rf"jobs/([a-z0-9]+)/({_ACTIONS})", JobActionPage),
    ("/notebooks/{server}/push", r"notebooks/([^/]*)/push", NotebookPushPage),
    ("/admin", r"admin/?", AdminPage),
    ("/secrets", r"secrets/?", SecretsPage),
    ("/static/{path}", r"static/(.+)", StaticHandler),
]


class OAuthCallbackHandler(ScrubbedLogs, HubOAuthCallbackHandler):
    """JupyterHub's, whose refusals (a stale ``state``) are logged without the URI's ``code``
    and ``state``."""


def make_app(settings: GpulabSettings, supervisor: JobSupervisor) -> web.Application:
    """The service's app: its routes, and what its handlers are handed (the settings, the job
    supervisor with its records, ledger, runtime and secrets, the notebooks' records)."""
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")
    records = NotebookRecords(supervisor.records.db, settings.instance)
    handlers = [
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        (url_path_join(prefix, "oauth_callback"), OAuthCallbackHandler),
    ]
    handlers += [(url_path_join(prefix, pattern), handler) for _, pattern, handler in ROUTES]
    handlers += [(url_path_join(prefix, pattern), h) for _, pattern, h in PAGE_ROUTES]
    handlers += [(url_path_join(prefix, pattern), h) for _, pattern, h in OTHER_ROUTES]
    # a job port's relay cut by its viewer is its end, not an uncaught error (api/ports.py)
    logging.getLogger("tornado.application").addFilter(CUT_RELAYS)
    # BoundedApplication (base.py): a body declared over max_request_body is answered 413 unread
    return BoundedApplication(
        handlers,
        cookie_secret=os.urandom(32),
        records=records,
        gpulab=settings,
        # the notebooks' engine (their push retries): the same as the jobs' (one setting)
        runtime=supervisor.runtime,
        # running notebooks' live pushes (their periodic look: service/tasks/live_push.py)
        notebook_pushes=NotebookLivePushes(settings, supervisor.runtime, records),
        supervisor=supervisor,
        secrets=supervisor.secrets,
        default_handler_class=NotFoundHandler,
        log_function=log_request,
    )


_METHODS = frozenset(web.RequestHandler.SUPPORTED_METHODS)


def log_request(handler: web.RequestHandler) -> None:
    """Tornado's access log, with successful reads at DEBUG: a line per poll of a job's state
    cost 8 % of the event loop under 50 clients (bench/bench_api.py). Writes, refusals and
    errors stay at INFO, WARNING and ERROR."""
    status = handler.get_status()
    if status >= 500:
        level = logging.ERROR
    elif status >= 400:
        level = logging.WARNING
    elif handler.request.method in ("GET", "HEAD", "OPTIONS"):
        level = logging.DEBUG
    else:
        level = logging.INFO
    seconds = handler.request.request_time()
    # any token is a method to tornado's parser: an unknown one is labelled OTHER, so that
    # nobody can grow the metric's series (and the service's memory) by inventing methods
    method = handler.request.method if handler.request.method in _METHODS else "OTHER"
    API_REQUESTS.labels(method, type(handler).__name__, str(status)).observe(seconds)
    access = logging.getLogger("tornado.access")
    if access.isEnabledFor(level):
        # scrubbed whatever the handler's class (JupyterHub's OAuth callback's holds a code)
        summary = request_summary(handler)
        access.log(level, "%d %s %.2fms", status, summary, 1000.0 * seconds)
