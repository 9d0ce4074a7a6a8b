"""What every handler of the gpulab service shares: identity and scopes, JSON answers and
clear errors, the request body cap, and "someone else's is a 404".

The body cap, from the cheapest layer:

- a body that declares (Content-Length) more than ``max_request_body`` is routed, as soon as
  its headers are read, to :class:`BodyTooLargeHandler`, which reads and discards it chunk by
  chunk (nothing is buffered or parsed) and answers 413. Reading it to the end, rather than
  closing the connection at once, is what lets the hub's proxy relay the 413: a connection
  closed under a request that is still being sent reaches the client as a 503;
- a body without a declared length (chunked) is buffered up to the HTTP server's limit, four
  times the cap (``__main__.py``), and refused by ``BaseHandler.prepare`` with the same 413;
- beyond that (a chunked body over four times the cap, or a declared one over
  :data:`DISCARD_FACTOR` times) tornado stops reading and closes the connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
from urllib.parse import urlencode

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import httputil, web
from tornado.log import app_log

from ..bounds import MAX_REQUEST_BODY, body_too_large, page_window, shown
from ..checks import json_object
from ..errors import FieldError
from ..forwarded import DEFAULT_TRUSTED_PROXIES, forwarded_origin, trusted_networks
from ..jobs.exec import MAX_SHELLS
from ..jobs.logs import MAX_LOG_STREAMS
from ..jobs.refusals import JobRefused, engine_refusal
from ..logscrub import request_summary
from ..notebooks.records import NotebookRecords
from ..runtime.base import EngineError

# JupyterHub custom scopes (declared in jupyterhub_config.py). Each handler requires the one
# its action needs; ADMIN acts on everyone's workloads.
JOBS_READ, JOBS_MANAGE = "custom:gpulab:jobs:read", "custom:gpulab:jobs:manage"
NB_READ, NB_MANAGE = "custom:gpulab:notebooks:read", "custom:gpulab:notebooks:manage"
ADMIN = "custom:gpulab:admin"
METRICS = "custom:gpulab:metrics"  # Prometheus' scrape of /services/gpulab/metrics
#: scope -> the scopes that imply it (besides ADMIN, which implies all)
IMPLIED_BY: dict[str, tuple[str, ...]] = {JOBS_READ: (JOBS_MANAGE,), NB_READ: (NB_MANAGE,)}
#: the API's reads run on a pool of their own, kept small on purpose: reads are short, and every
#: thread more fights the event loop for the GIL (under 50 clients, 2 threads gave a lower p99
#: and more requests/s than the default 6: bench/bench_api.py). Writes and the supervisor use
#: asyncio's default pool, so a write waiting for SQLite's lock never holds up a read.
API_READ_THREADS = 2
#: the service's thread pools, by what runs on them, and their sizes (the engine's calls have
#: the Runtime's own pool, writes and the supervisor asyncio's default one)
POOL_SIZES = {
    "reads": API_READ_THREADS,
    # a job log stream each (jobs.logs caps them): followers never take the engine's threads
    "logs": MAX_LOG_STREAMS,
    # per open shell, one reads its terminal and one writes its input (which waits while the
    # shell's input is full) or resizes it
    "shell": 2 * MAX_SHELLS + 8,
}
_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}


def pool(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """The service's pool ``name`` (:data:`POOL_SIZES`), made on first use."""
    if name not in _pools:
        _pools[name] = concurrent.futures.ThreadPoolExecutor(
            POOL_SIZES[name], thread_name_prefix=f"gpulab-{name}"
        )
    return _pools[name]


async def read(fn, *args):
    """Run the blocking database read ``fn(*args)`` on the API's read pool."""
    return await asyncio.get_running_loop().run_in_executor(pool("reads"), fn, *args)


#: query arguments never echoed back (in a page's ``next`` link): credentials
_SECRET_ARGS = frozenset({"token", "access_token"})


class ApiError(web.HTTPError):
    """An error answered as JSON: {status, message, field?}. ``field`` names the bad input."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(status, "%s", message)
        self.message = message
        self.field = field


@contextlib.contextmanager
def answer_refusals():
    """A refusal of a job action (:mod:`gpulab.jobs.actions`) answered as its JSON error; an
    engine's failure that came up through the domain too (503 while the engine does not
    answer, naming it; else 502: :func:`gpulab.jobs.refusals.engine_refusal`), never a 500."""
    try:
        yield
    except JobRefused as e:
        raise ApiError(e.status, e.message, field=e.field) from None
    except EngineError as e:
        refused = engine_refusal(e)
        app_log.warning("engine call failed: %s", e)
        raise ApiError(refused.status, refused.message) from None


#: declared bodies up to this many times the cap are read and discarded for a clean 413
DISCARD_FACTOR = 64


def request_cap(settings: dict) -> int:
    """``GpulabSettings.max_request_body`` of the application (the default without one)."""
    gpulab = settings.get("gpulab")
    return gpulab.max_request_body if gpulab is not None else MAX_REQUEST_BODY


@web.stream_request_body
class BodyTooLargeHandler(web.RequestHandler):
    """Discards a body declared over the cap, then answers 413 (any method)."""

    def initialize(self, cap: int, size: int) -> None:
        self.cap, self.size = cap, size

    def data_received(self, chunk: bytes) -> None:
        pass  # discarded: never buffered, never parsed

    def _refuse(self, *args, **kwargs) -> None:
        self.set_status(413)
        self.set_header("Content-Type", "application/json")
        why = body_too_large(self.size, self.cap)
        self.finish(json.dumps({"status": 413, "field": "body", "message": why}))

    get = head = post = put = patch = delete = options = _refuse


class BoundedApplication(web.Application):
    """A tornado Application that routes over-cap declared bodies to
    :class:`BodyTooLargeHandler` before their body is read."""

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs):
        see_forwarded(request, self.settings)
        cap = request_cap(self.settings)
        declared = request.headers.get("Content-Length", "")
        if declared.isdigit() and len(declared) < 19 and cap < int(declared):
            size = int(declared)
            if size <= cap * DISCARD_FACTOR and request.connection is not None:
                # read it all (discarding) so that the 413 reaches the client through the proxy
                request.connection.set_max_body_size(size)  # type: ignore[attr-defined]
                return self.get_handler_delegate(
                    request, BodyTooLargeHandler, {"cap": cap, "size": size}
                )
        return super().find_handler(request, **kwargs)


_DEFAULT_NETWORKS = trusted_networks(DEFAULT_TRUSTED_PROXIES)


def see_forwarded(request: httputil.HTTPServerRequest, settings: dict) -> None:
    """The request as the browser made it: the scheme, host and client that the trusted
    proxies (``GpulabSettings.trusted_proxies``) forwarded, never what a client claimed
    (:func:`gpulab.forwarded.forwarded_origin`). Its ``protocol`` then says ``https`` for a
    browser on the TLS front door (what a job's port app is told, what marks cookies
    Secure), its ``remote_ip`` names that browser."""
    gpulab = settings.get("gpulab")
    networks = gpulab.trusted_proxy_networks if gpulab is not None else _DEFAULT_NETWORKS
    origin = forwarded_origin(
        request.remote_ip or "", request.protocol, request.host, request.headers, networks
    )
    request.protocol, request.remote_ip = origin.scheme, origin.client
    if origin.host != request.host:
        request.host = origin.host
        request.host_name = httputil.split_host_and_port(origin.host.lower())[0]


def authenticated(method):
    """Like tornado's, but an API client (anything that is not a browser page load) gets a JSON
    answer instead of a redirect to the hub's log-in page: 401 when no valid credentials came
    (none, or an unknown or expired token), 403 when a valid token lacks the scope to use the
    gpulab service at all (``access:services!service=gpulab``)."""

    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        if self.current_user is None:
            denied = self.refused_caller
            if denied is not None:
                raise ApiError(
                    403,
                    f"{denied.get('kind', 'user')} {denied.get('name')} may not use gpulab: "
                    "the token lacks the scope access:services!service=gpulab",
                )
            browser = "text/html" in self.request.headers.get("Accept", "")
            token = self.request.headers.get("Authorization")
            if self.request.method in ("GET", "HEAD") and browser and not token:
                self.redirect(self.get_login_url())
                return None
            if not token and self.get_cookie(self.hub_auth.cookie_name):
                # a browser session whose request was refused anyway: a form posted without
                # its XSRF token (from another site, or an old page). Known, yet not allowed
                raise ApiError(
                    403,
                    "request refused: it lacks this page's XSRF token (reload the page and "
                    "try again)",
                )
            why = "invalid or expired token" if token else "log in or send a hub API token"
            raise ApiError(401, f"not authenticated: {why} (Authorization: token ...)")
        return await method(self, *args, **kwargs)

    return wrapper


class SecureCookies(web.RequestHandler):
    """Every cookie the service sets (its OAuth cookie, the XSRF cookie, an OAuth state) is
    ``Secure`` when the browser came over https (the scheme :func:`see_forwarded` believed):
    JupyterHub marks its own OAuth cookie so, not the XSRF cookie it sets beside it."""

    def set_cookie(self, name, value, *args, **kwargs) -> None:
        if self.request.protocol == "https":
            kwargs["secure"] = True
        super().set_cookie(name, value, *args, **kwargs)


class ScrubbedLogs(SecureCookies):
    """Tornado's log lines about a request (the access log, an HTTPError's warning, an
    uncaught exception's error) with no credential of its URI: JupyterHub takes ``?token=`` on
    WebSocket handshakes, so a refused one would put a live token in the log."""

    def _request_summary(self) -> str:
        return request_summary(self)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, web.HTTPError):
            super().log_exception(typ, value, tb)  # its line uses _request_summary
            return
        # tornado's own adds repr(self.request): the raw URI
        app_log.error("Uncaught exception %s", self._request_summary(), exc_info=(typ, value, tb))


class JsonErrors(ScrubbedLogs):
    """Errors answered as JSON ``{status, message, field?}`` (the OpenAPI document's Error),
    never tornado's HTML page: a 405 names the methods its path serves in ``Allow``, a 401 the
    credentials it wants in ``WWW-Authenticate``."""

    @classmethod
    def allowed_methods(cls) -> list[str]:
        """The methods this handler implements (those it does not are a 405)."""
        base = web.RequestHandler
        return [
            m
            for m in cls.SUPPORTED_METHODS
            if getattr(cls, m.lower(), None) is not getattr(base, m.lower(), None)
        ]

    def write_error(self, status_code: int, **kwargs) -> None:
        message = self._reason
        body: dict = {"status": status_code}
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if isinstance(exc, ApiError) and exc.field:
            body["field"] = exc.field
        if status_code == 405:
            allowed = self.allowed_methods()
            self.set_header("Allow", ", ".join(allowed))
            message = f"{self.request.method} is not served here; this path takes " + (
                ", ".join(allowed) or "no method"
            )
        body["message"] = message
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'token realm="gpulab"')
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class NotFoundHandler(JsonErrors):
    """JSON 404 for any path the API does not serve."""

    def prepare(self):
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": 404, "message": f"no such path {self.request.path}"}))


class BaseHandler(HubOAuthenticated, JsonErrors):
    #: the hub's model of a caller whose valid token lacks the scope to use gpulab at all
    #: (``access:services!service=gpulab``), set by :meth:`identify`; None for anyone else
    refused_caller: dict | None = None

    @property
    def records(self) -> NotebookRecords:
        return self.settings["records"]

    @property
    def supervisor(self):
        return self.settings["supervisor"]

    @property
    def jobs(self):
        return self.supervisor.records

    def compute_etag(self) -> None:
        """No ETag: tornado would hash every answer for a conditional GET that API clients
        polling a job's state never send (and the state changes under them anyway)."""
        return None

    async def prepare(self):
        """Refuse an oversized body (JSON 413 naming the limit) before any handler parses it:
        a chunked one, read up to the server's limit (declared ones: BoundedApplication). Then
        identify the caller without blocking the event loop."""
        why = body_too_large(len(self.request.body or b""), request_cap(self.settings))
        if why:
            raise ApiError(413, why, field="body")
        await self.identify()

    async def identify(self) -> None:
        """Resolve the caller once, asynchronously, into the cache that JupyterHub's
        ``get_current_user`` reads. Its synchronous path blocks the event loop on a round
        trip through HubAuth's own thread for every request, cached token or not: under 50
        clients that hand-off was half of the loop's time (measured, bench/bench_api.py)."""
        if hasattr(self, "_hub_auth_user_cache"):
            return
        # "nobody" while the lookup runs: anything that reads current_user meanwhile (an XSRF
        # check that renews its cookie) must not fall back to the synchronous lookup
        self._hub_auth_user_cache = None
        model = await self.hub_auth.get_user(self, sync=False)
        if model:
            try:
                self._hub_auth_user_cache = self.check_hub_user(model)
            except UserNotAllowed:
                pass  # check_hub_user noted who (refused_caller), for the 403
            else:
                self.hub_auth._persist_url_token_if_set(self)  # as JupyterHub's own path does
        self.current_user = self._hub_auth_user_cache

    def check_hub_user(self, model):
        """JupyterHub's check, remembering who was refused for lack of the access scope (so
        that the answer is a 403 that says so, not a 401 for a valid token)."""
        try:
            return super().check_hub_user(model)
        except UserNotAllowed:
            self.refused_caller = model
            raise

    @staticmethod
    def scopes_of(user: dict) -> frozenset[str]:
        return frozenset(user.get("scopes") or ())

    def is_admin(self, user: dict) -> bool:
        """A gpulab admin is a token that carries ``custom:gpulab:admin``: the scopes decide,
        never the hub user's ``admin`` flag (an admin's token narrowed to fewer scopes acts
        with those scopes only)."""
        return ADMIN in self.scopes_of(user)

    def has(self, scope: str) -> bool:
        """Whether the caller's token carries ``scope`` (or one that implies it)."""
        me = self.current_user
        return bool(me) and bool(self.scopes_of(me) & {scope, ADMIN, *IMPLIED_BY.get(scope, ())})

    def may_read(self, me: dict, owner: str | None) -> bool:
        """The one "owner or admin" rule: the caller ``me`` may read the workloads of ``owner``
        (None: everyone's) if they are their own or the caller is an admin. :meth:`whose`
        (403) and :meth:`owned_notebook` / :meth:`own_job` (404) all ask it."""
        return owner == me["name"] or self.is_admin(me)

    def whose(self, me: dict, user: str | None, refusal: str) -> str | None:
        """``user`` (None: everyone), whose workloads the caller ``me`` asks to read: their
        own, or anyone's for an admin; else 403 with ``refusal`` (each door's wording)."""
        if not self.may_read(me, user):
            raise ApiError(403, refusal)
        return user

    def require(self, scope: str) -> dict:
        """The caller, if their token carries ``scope`` (manage implies read; the admin scope
        implies both); else 403 naming the missing scope."""
        if self.has(scope):
            return self.current_user
        raise ApiError(403, f"your token lacks the scope {scope}")

    async def owned_notebook(self, user: str, server: str, scope: str = NB_READ) -> dict:
        """The notebook, if the caller owns it or is an admin; else 404 (never 403), with the
        same answer as for a notebook that does not exist."""
        me = self.require(scope)
        nb = None
        if self.may_read(me, user):
            nb = await read(self.records.get, user, server)
        if nb is None:
            raise ApiError(404, f"no notebook {server or '(default)'} for {user}")
        return nb

    async def own_job(self, job_id: str, scope: str = JOBS_READ) -> dict:
        """The job, if the caller owns it or is an admin; else 404 (never 403), with the same
        answer as for a job that does not exist."""
        me = self.require(scope)
        job = await read(self.jobs.get, job_id)
        if job is None or not self.may_read(me, job["owner"]):
            raise ApiError(404, f"no job {job_id}")
        return job

    def body(self) -> dict:
        """The request's JSON object (an empty body is ``{}``); else 400."""
        try:
            return json_object(self.request.body)
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None

    def page_query(self) -> tuple[str | None, str | None]:
        """The text of ``?limit=`` and ``?offset=`` (None where absent), as sent."""
        return (
            self.get_argument("limit", None, strip=False),
            self.get_argument("offset", None, strip=False),
        )

    def page_args(self) -> tuple[int, int]:
        """``?limit=`` (1 to MAX_PAGE, default DEFAULT_PAGE) and ``?offset=`` (0 or more):
        :func:`gpulab.bounds.page_window`, else 400."""
        try:
            return page_window(*self.page_query())
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean query argument: ``true`` or ``false`` (any case); else 400."""
        raw = self.get_argument(name, None, strip=False)
        if raw is None:
            return default
        if raw.lower() not in ("true", "false"):
            raise ApiError(400, f"{name} must be true or false, not {shown(raw)}", field=name)
        return raw.lower() == "true"

    def write_page(
        self,
        key: str,
        rows: list,
        total: int,
        limit: int,
        offset: int,
        cursor: str | bool = False,
    ) -> None:
        """A page of a list, with the total and the URL of the next page (None at the end):
        ``cursor`` (a list read by cursor: the next page's, None at the end) in it, else the
        next ``offset``."""
        nxt = None
        more = bool(cursor) if cursor is not False else offset + len(rows) < total
        if more:
            args = {
                k: self.get_arguments(k) for k in self.request.arguments if k not in _SECRET_ARGS
            }
            if cursor is not False:
                args.pop("offset", None)
                args["cursor"] = [cursor]
            else:
                args["offset"] = [str(offset + len(rows))]
            args["limit"] = [str(limit)]
            query = urlencode([(k, v) for k, vs in args.items() for v in vs])
            nxt = f"{self.request.path}?{query}"
        self.write_json({key: rows, "total": total, "limit": limit, "offset": offset, "next": nxt})

    def write_json(self, obj, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))
