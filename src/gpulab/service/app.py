"""The gpulab hub service: a tornado app under /services/gpulab/.

Browsers come through the hub's OAuth; API clients send a hub token. Users see only their own
notebooks; admins may read anyone's. Someone else's notebook is a 404, never a 403, so that its
existence is not revealed.
"""

from __future__ import annotations

import asyncio
import logging
import os

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from tornado import web

from ..db import Database
from ..jobs.spec import MAX_PRIORITY, job_spec_schema
from ..lifecycle import NotebookState
from ..logscrub import request_summary
from ..metrics import API_REQUESTS
from ..names import notebook_workload_id
from ..notebooks.data import NotebookData, PushRaced, retry_push
from ..notebooks.records import NotebookRecords
from ..runtime import make_runtime
from ..secrets import store_for
from ..settings import GpulabSettings
from .admin_page import AdminPage
from .app_base import (
    METRICS,
    NB_MANAGE,
    NB_READ,
    ApiError,
    BaseHandler,
    HealthHandler,
    NotFoundHandler,
    ScrubbedLogs,
    authenticated,
    read,
)
from .bodylimit import BoundedApplication
from .exec_api import JobExecHandler, JobShellHandler
from .jobs_api import (
    JobActionHandler,
    JobEventsHandler,
    JobHandler,
    JobsHandler,
    UsageHandler,
)
from .logs_api import JobLogsHandler
from .openapi import document
from .pages import (
    HomePage,
    JobActionPage,
    JobPage,
    JobsPage,
    StaticHandler,
    SubmitJobPage,
)
from .ports_proxy import JobPortHandler
from .secrets_api import SecretHandler, SecretsHandler, SecretsPage

log = logging.getLogger("gpulab.service")


class NotebooksHandler(BaseHandler):
    @authenticated
    async def get(self):
        """The caller's notebooks; admins may ask for ?user=NAME or ?all=true."""
        me = self.require(NB_READ)
        user = self.get_argument("user", me["name"])
        want_all = self.flag("all")
        if (user != me["name"] or want_all) and not self.is_admin(me):
            raise ApiError(403, "only admins (custom:gpulab:admin) may list other users' notebooks")
        limit, offset = self.page_args()
        rows, total = await read(self.records.page, None if want_all else user, limit, offset)
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


class MetricsHandler(BaseHandler):
    """Prometheus metrics (gpulab/metrics.py), for tokens with ``custom:gpulab:metrics``."""

    @authenticated
    async def get(self):
        self.require(METRICS)
        body = await asyncio.to_thread(generate_latest, REGISTRY)  # the collector reads the DB
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)


class OpenAPIHandler(BaseHandler):
    """The OpenAPI document, with the job submission schema of this deployment (its catalog,
    flavors, GPUs and limits): the caller's with a valid token (their limits, quota and
    highest priority), else that of a user without overrides. No token is needed."""

    async def get(self):
        s: GpulabSettings = self.settings["gpulab"]
        me = self.current_user
        user, groups = (me["name"], list(me.get("groups") or [])) if me else ("", [])
        store = self.settings["secrets"]
        secret_names = (
            [i.name for i in await read(store.names, user)] if user and store.available else []
        )
        supervisor = self.settings.get("supervisor")
        quota = s.quota_for(user, groups)
        admin = bool(me) and self.is_admin(me)
        submission = job_spec_schema(
            catalog=s.catalog,
            flavors=s.flavor_map,
            limits=s.limits_for(user, groups),
            allowed_images=s.allowed_images,
            host_gpus=supervisor.ledger.gpu_home()[0] if supervisor else 0,
            quota_gpus=quota.gpus,
            quota_jobs=quota.jobs,
            max_timeout=s.job_max_timeout,
            max_priority=MAX_PRIORITY if admin else min(s.max_user_priority, MAX_PRIORITY),
            volumes=bool(s.storage.stores),
            secret_names=secret_names,
            git=s.job_git_sources,
            gang_slots=supervisor.ledger.gang_slots() if supervisor else {},
            max_workers=s.max_job_workers,
        )
        self.write_json(document(submission))


# path (relative to the service prefix, as in the OpenAPI document) -> handler
ROUTES: list[tuple[str, str, type]] = [
    ("/api/health", r"api/health", HealthHandler),
    ("/api/openapi.json", r"api/openapi.json", OpenAPIHandler),
    ("/api/notebooks", r"api/notebooks", NotebooksHandler),
    ("/api/notebooks/{user}/{server}", r"api/notebooks/([^/]+)/([^/]*)", NotebookHandler),
    (
        "/api/notebooks/{user}/{server}/push",
        r"api/notebooks/([^/]+)/([^/]*)/push",
        NotebookPushHandler,
    ),
    ("/api/jobs", r"api/jobs/?", JobsHandler),
    ("/api/jobs/{job_id}", r"api/jobs/([a-z0-9]+)", JobHandler),
    ("/api/jobs/{job_id}/events", r"api/jobs/([a-z0-9]+)/events", JobEventsHandler),
    ("/api/jobs/{job_id}/logs", r"api/jobs/([a-z0-9]+)/logs", JobLogsHandler),
    ("/api/jobs/{job_id}/exec", r"api/jobs/([a-z0-9]+)/exec", JobExecHandler),
    ("/api/jobs/{job_id}/shell", r"api/jobs/([a-z0-9]+)/shell", JobShellHandler),
    (
        "/api/jobs/{job_id}/{action}",
        r"api/jobs/([a-z0-9]+)/(interrupt|resume|rerun|push)",
        JobActionHandler,
    ),
    ("/api/usage", r"api/usage", UsageHandler),
    ("/api/secrets", r"api/secrets/?", SecretsHandler),
    ("/api/secrets/{name}", r"api/secrets/([^/]+)", SecretHandler),
]

# Prometheus' endpoint (not JSON: kept out of ROUTES and the OpenAPI document, like
# JupyterHub's /hub/metrics)
OTHER_ROUTES: list[tuple[str, str, type]] = [
    ("/metrics", r"metrics", MetricsHandler),
    # a running job's ports (any content, HTTP and websockets: service/ports_proxy.py)
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
    ("/jobs/{job_id}/{action}", r"jobs/([a-z0-9]+)/(interrupt|resume|rerun|push)", JobActionPage),
    ("/admin", r"admin/?", AdminPage),
    ("/secrets", r"secrets/?", SecretsPage),
    ("/static/{path}", r"static/(.+)", StaticHandler),
]


class OAuthCallbackHandler(ScrubbedLogs, HubOAuthCallbackHandler):
    """JupyterHub's, whose refusals (a stale ``state``) are logged without the URI's ``code``
    and ``state``."""


def make_app(settings: GpulabSettings, supervisor=None) -> web.Application:
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")
    db = supervisor.records.db if supervisor else Database(settings.database_url)
    records = NotebookRecords(db, settings.instance)
    handlers = [
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
        (url_path_join(prefix, "oauth_callback"), OAuthCallbackHandler),
    ]
    handlers += [(url_path_join(prefix, pattern), handler) for _, pattern, handler in ROUTES]
    handlers += [(url_path_join(prefix, pattern), h) for _, pattern, h in PAGE_ROUTES]
    handlers += [(url_path_join(prefix, pattern), h) for _, pattern, h in OTHER_ROUTES]
    # BoundedApplication: a body declared over max_request_body is answered 413 unread
    return BoundedApplication(
        handlers,
        cookie_secret=os.urandom(32),
        records=records,
        gpulab=settings,
        # the notebooks' engine (their push retries): the same as the jobs' (one setting)
        runtime=supervisor.runtime if supervisor else make_runtime(settings),
        supervisor=supervisor,
        secrets=supervisor.secrets if supervisor else store_for(settings, db),
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
