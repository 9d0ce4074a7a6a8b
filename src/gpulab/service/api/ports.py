"""A running job's exposed ports, under the hub: ``/services/gpulab/jobs/ID/ports/NAME/...``.

HTTP and websockets are proxied to the job's container, behind the hub's login (the service's
OAuth cookie, or a hub token). Who gets through: the job's owner, admins (``custom:gpulab:
admin``), and the users and groups the port is shared with; anyone else gets the same 404 as
for a job that does not exist. The port is reachable no other way: jobs publish no port on any
host, and their network is their owner's alone (runtime/network.py).

The path is forwarded whole (the app is told its prefix in ``GPULAB_PORT_<NAME>_PATH``, as the
hub's proxy does for notebooks). On a Swarm the job's overlay address is reached through the
notebook gateway (``Runtime.reach``), on one engine through its bridge address.

An app behind a port shares the hub's origin (SECURITY.md says why), so what it may see and do
is narrowed here, for every viewer, its owner included:
- no credential of the viewer: cookies are forwarded by allow-list, not by deny-list. An app's
  ``Set-Cookie`` reaches the browser renamed into the port's own namespace
  (``gpulab.<job>.<port>.<name>``) with its ``Path`` confined to the port's prefix and no
  ``Domain``; a request carries to the app only the cookies of that namespace, under the names
  the app gave them. The hub's, the service's (whatever their names) and every other cookie
  stay behind. No ``Authorization`` header and no ``?token=`` / ``?access_token=`` either.
- for anyone but its owner (a user it is shared with, an admin), not the viewer's session: its
  pages are served with ``Content-Security-Policy: sandbox`` without ``allow-same-origin``, so
  that their scripts run in an opaque origin and cannot call the hub or the service as the
  viewer, and its ``Set-Cookie`` headers are dropped (no cookie planted on the hub's origin).
- a write from another site: a cookie-authenticated request other than GET/HEAD/OPTIONS must
  come from the same origin (``Sec-Fetch-Site`` or ``Origin``), else 403.

Every relay, HTTP or websocket, counts against a per-user and a total limit
(:data:`gpulab.jobs.ports.RELAYS`: the caps are the jobs domain's, with the largest answer and
message and the time-outs), and every byte goes through with back-pressure: an answer is read
from the app no faster than the viewer reads it, a websocket message is read from one side
only once the previous one was written to the other, so a relay that nobody reads holds at
most a few messages (:data:`gpulab.jobs.ports.MAX_WS_MESSAGE` each) and the service's memory
stays flat.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from urllib.parse import unquote_plus

from tornado import httpclient, httputil, web, websocket
from tornado.iostream import StreamClosedError

from ...jobs import ports
from ..base import JOBS_READ, ApiError, BaseHandler, answer_refusals

log = logging.getLogger("gpulab.ports")

#: headers that belong to one hop, never forwarded (RFC 9110 7.6.1)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
#: request headers that say where a request came from: never passed on as the client sent
#: them (the proxy sets X-Forwarded-For, -Host and -Proto itself, from what the service
#: believed: service.base.see_forwarded)
FORWARDING_HEADERS = frozenset(
    {
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-real-ip",
        "x-scheme",
    }
)
#: query arguments that carry a hub token: never forwarded
TOKEN_ARGS = frozenset({"token", "access_token"})
#: request headers never forwarded: the viewer's credentials (cookies are filtered on their own)
CREDENTIAL_HEADERS = frozenset({"authorization", "x-xsrftoken", "x-csrftoken"})
#: what a page served to someone other than its owner may do: everything but its own origin
SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"
#: response headers no app may send through the hub's origin (they act on the whole origin:
#: a service worker over the hub, its cookies cleared, HSTS for the hub and its subdomains)
ORIGIN_WIDE = frozenset({"service-worker-allowed", "clear-site-data", "strict-transport-security"})
#: and those only its owner may get (others: no cookie planted, no redirect off its prefix)
OWNER_ONLY = frozenset({"set-cookie", "refresh"})
_client: httpclient.AsyncHTTPClient | None = None


def _http_client() -> httpclient.AsyncHTTPClient:
    """A client of its own: one user's slow or hanging app never takes the connections that
    other users' ports (or anything else in the service) need."""
    global _client
    if _client is None:
        _client = httpclient.AsyncHTTPClient(
            force_instance=True,
            max_clients=ports.MAX_RELAYS,
            max_body_size=ports.MAX_ANSWER_BYTES,
        )
    return _client


def unsafe_path(rest: str) -> bool:
    """Whether the part after /ports/NAME could leave it once a proxy normalizes the path
    (``..``, ``.``, an encoded ``/`` or a backslash in a segment, decoded or not)."""
    from urllib.parse import unquote

    for segment in rest.split("/"):
        decoded = unquote(segment)
        if decoded in (".", "..") or "/" in decoded or "\\" in decoded:
            return True
    return False


def port_prefix(service_prefix: str, job_id: str, name: str) -> str:
    return f"{service_prefix.rstrip('/')}/jobs/{job_id}/ports/{name}/"


def cookie_namespace(job_id: str, name: str) -> str:
    """The prefix of a port's cookies in the browser: job ids and port names have no dot, so
    no namespace is the start of another one."""
    return f"gpulab.{job_id}.{name}."


def app_cookies(header: str, namespace: str) -> str:
    """The ``Cookie`` header an app gets: only its own cookies (those in ``namespace``), under
    the names it gave them. Split as browsers write it (``; ``), not parsed strictly: a cookie
    the parser would refuse cannot make others slip through."""
    kept = []
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name.startswith(namespace) and len(name) > len(namespace):
            kept.append(f"{name[len(namespace) :]}={value}")
    return "; ".join(kept)


def app_set_cookie(header: str, namespace: str, prefix: str) -> str | None:
    """An app's ``Set-Cookie`` as the browser gets it: renamed into ``namespace``, its
    ``Path`` confined to the port's ``prefix`` (kept where it is below it), without
    ``Domain``. None for a header with no ``name=``."""
    first, _, attributes = header.partition(";")
    name, eq, value = first.strip().partition("=")
    name = name.strip()
    if not eq or not name:
        return None
    out = [f"{namespace}{name}={value.strip()}"]
    path = prefix
    for attribute in attributes.split(";"):
        key, _, val = attribute.strip().partition("=")
        low = key.strip().lower()
        if not low or low == "domain":
            continue
        if low == "path":
            wanted = val.strip()
            if wanted.startswith(prefix):
                path = wanted
            continue
        out.append(attribute.strip())
    out.append(f"Path={path}")
    return "; ".join(out)


def without_tokens(uri: str) -> str:
    """``uri`` without the query arguments that carry a hub token (the others as they came,
    in their order and their own encoding)."""
    path, mark, query = uri.partition("?")
    if not mark:
        return uri
    kept = [
        pair for pair in query.split("&") if unquote_plus(pair.partition("=")[0]) not in TOKEN_ARGS
    ]
    return path + ("?" + "&".join(kept) if kept else "")


class JobPortHandler(BaseHandler, websocket.WebSocketHandler):
    """One handler for both: a GET with ``Upgrade: websocket`` becomes a websocket relay."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    # --- who, and where to ---------------------------------------------------------------

    def check_xsrf_cookie(self) -> None:
        """The apps behind a port do not know the hub's XSRF token: a cookie-authenticated
        request that may change something must come from this origin instead (the browser
        says so in Sec-Fetch-Site, or Origin). Reads pass, as for any page."""
        site = self.request.headers.get("Sec-Fetch-Site")
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            # a page load, or a read from this origin (another site's page may not read an
            # owner's app with their cookie: script inclusion, JSON)
            mode = self.request.headers.get("Sec-Fetch-Mode")
            if site in (None, "same-origin", "none") or mode == "navigate":
                return
            raise web.HTTPError(403, "a cross-site read of a job's port is refused")
        origin = self.request.headers.get("Origin")
        if site == "same-origin" or (
            site is None and origin and origin.split("://", 1)[-1] == self.request.host
        ):
            return
        raise web.HTTPError(403, "a cross-site request to a job's port is refused")

    async def _resolve(self, job_id: str, name: str) -> ports.PortTarget:
        """Where to forward to, and whether the caller owns the job
        (:func:`gpulab.jobs.ports.open_port`: a 404 for anyone who may not open it, as for a
        job that does not exist)."""
        if unsafe_path(self.request.path):
            raise ApiError(400, "a port's path may not contain '.' or '..' segments")
        self._prefix = port_prefix(self._service_prefix(), job_id, name)
        self._port_key = (job_id, name)
        me = self.current_user
        if me is None:
            browser = "text/html" in self.request.headers.get("Accept", "")
            if self.request.method in ("GET", "HEAD") and browser and not self._websocket():
                self.redirect(self.get_login_url())
                raise _Redirected
            if self.refused_caller is not None:
                raise ApiError(403, "the token lacks the scope access:services!service=gpulab")
            raise ApiError(401, "not authenticated: log in, or send a hub API token")
        self.require(JOBS_READ)
        with answer_refusals():
            return await ports.open_port(
                self.supervisor,
                self.settings["gpulab"],
                job_id,
                name,
                viewer=me["name"],
                groups=me.get("groups"),
                admin=self.is_admin(me),
                path=self._prefix,
            )

    def _under(self, location: str) -> bool:
        """Whether a redirect stays on this port (this host, below its prefix)."""
        from urllib.parse import urljoin, urlsplit

        target = urlsplit(urljoin(self.request.full_url(), location))
        return target.netloc == self.request.host and target.path.startswith(self._prefix)

    def _service_prefix(self) -> str:
        return self.request.path.split("/jobs/", 1)[0] + "/"

    def _websocket(self) -> bool:
        return self.request.headers.get("Upgrade", "").lower() == "websocket"

    def _upstream_headers(self) -> httputil.HTTPHeaders:
        out = httputil.HTTPHeaders()
        namespace = cookie_namespace(*self._port_key)
        cookies = []
        for k, v in self.request.headers.get_all():
            low = k.lower()
            if low in HOP_BY_HOP or low.startswith("sec-websocket-") or low == "content-length":
                continue
            if low in CREDENTIAL_HEADERS or low in FORWARDING_HEADERS:
                continue
            if low == "cookie":  # (HTTP/2 may split them over several headers)
                if mine := app_cookies(v, namespace):
                    cookies.append(mine)
                continue
            if low == "referer":  # the page the viewer came from: its query may hold a token
                v = without_tokens(v)
            out.add(k, v)
        if cookies:
            out["Cookie"] = "; ".join(cookies)
        out["X-Forwarded-Host"] = self.request.host
        out["X-Forwarded-Proto"] = self.request.protocol
        out["X-Forwarded-For"] = self.request.remote_ip or ""
        return out

    def _upstream_uri(self) -> str:
        return without_tokens(self.request.uri)

    # --- HTTP ---------------------------------------------------------------------------------

    async def get(self, job_id: str, name: str, rest: str | None = None):
        if self._websocket():
            try:
                target = await self._resolve(job_id, name)
            except _Redirected:
                return
            self._host, self._port = target.host, target.port
            user = self.current_user["name"]
            with answer_refusals():  # a 429 past the caps
                ports.RELAYS.take(user)  # given back when the relay closes (or never opened)
            self._counted = user
            try:
                await websocket.WebSocketHandler.get(self, job_id, name, rest)
            finally:
                # refused in the handshake (a 400, 403, 426): tornado calls no on_close, and
                # may have set ws_connection already (a 400 for a missing key)
                if self.get_status() != 101:
                    self._release()
            return
        await self._proxy(job_id, name, rest)

    async def head(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def post(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def put(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def delete(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def patch(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def options(self, job_id, name, rest=None):
        await self._proxy(job_id, name, rest)

    async def _proxy(self, job_id: str, name: str, rest: str | None) -> None:
        try:
            target = await self._resolve(job_id, name)
        except _Redirected:
            return
        if rest is None:  # /ports/NAME -> /ports/NAME/ (relative links resolve below it)
            self.redirect(self.request.path + "/", permanent=False)
            return
        if self.request.headers.get("Service-Worker") == "script":
            raise ApiError(403, "a job's app may not install a service worker on the hub")
        with answer_refusals():  # a 429 past the caps
            ports.RELAYS.take(self.current_user["name"])
        try:
            await self._relay(job_id, name, target)
        finally:
            ports.RELAYS.give(self.current_user["name"])

    async def _relay(self, job_id: str, name: str, target: ports.PortTarget) -> None:
        owner = target.owner
        method = self.request.method
        # tornado wants a body (maybe empty) for POST, PUT and PATCH, and none for GET
        body = self.request.body if method in ("POST", "PUT", "PATCH", "DELETE") else None
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = b""
        started = False

        def on_header(line: str) -> None:
            nonlocal started
            line = line.rstrip("\r\n")
            if line.startswith("HTTP/"):
                first = httputil.parse_response_start_line(line)
                if first.code == 100:
                    return
                self.set_status(first.code, first.reason)
                self._headers = httputil.HTTPHeaders()  # none of tornado's defaults
                if not owner:  # before the first chunk flushes the headers
                    self._headers["Content-Security-Policy"] = SANDBOX
                return
            if not line:
                return
            k, _, v = line.partition(":")
            low = k.strip().lower()
            if low in HOP_BY_HOP or low in ORIGIN_WIDE or (low in OWNER_ONLY and not owner):
                return
            if low == "location" and not owner and not self._under(v.strip()):
                return  # no redirect off the port for a viewer (an open redirect on the hub)
            if low == "set-cookie":  # (the owner's only) into the port's own namespace
                v = app_set_cookie(v, cookie_namespace(job_id, name), self._prefix) or ""
                if not v:
                    return
            self._headers.add(k.strip(), v.strip())

        def on_chunk(chunk: bytes):
            nonlocal started
            started = True
            self.write(chunk)
            return self.flush()  # the client reads the app no faster than the viewer reads

        req = httpclient.HTTPRequest(
            f"http://{target.host}:{target.port}{self._upstream_uri()}",
            method=method,
            headers=self._upstream_headers(),
            body=body
            if body is not None
            else (b"" if method in ("POST", "PUT", "PATCH") else None),
            follow_redirects=False,
            decompress_response=False,
            allow_nonstandard_methods=True,
            connect_timeout=ports.CONNECT_TIMEOUT,
            request_timeout=ports.REQUEST_TIMEOUT,
            header_callback=on_header,
            streaming_callback=on_chunk,
        )
        try:
            await _http_client().fetch(req, raise_error=False)
        except Exception as e:
            ports.forget(job_id, name)
            if started and _cut_off(e):
                # half an answer sent, and the viewer went away or the app closed its end:
                # drop the viewer's connection (a cut answer must never look whole), quietly
                log.info("job %s port %s: relay cut off: %s", job_id, name, e)
                self.request.connection.close()
                return
            if started:
                raise
            log.info("job %s port %s: %s", job_id, name, e)
            self._headers = httputil.HTTPHeaders({"Content-Type": "application/json"})
            raise ApiError(502, f"job {job_id}: nothing answers on its port {name}") from None
        self.finish()

    # --- websockets ---------------------------------------------------------------------------

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        self._subprotocols = subprotocols
        return subprotocols[0] if subprotocols else None

    @property
    def max_message_size(self) -> int:
        return ports.MAX_WS_MESSAGE

    @property
    def ping_interval(self) -> float:
        """A viewer that reads nothing answers no ping: its relay closes (and gives its place
        back) after WS_PING_INTERVAL + WS_PING_TIMEOUT seconds at most."""
        return ports.WS_PING_INTERVAL

    @property
    def ping_timeout(self) -> float:
        return ports.WS_PING_TIMEOUT

    async def open(self, job_id: str, name: str, rest: str | None = None):
        url = f"ws://{self._host}:{self._port}{self._upstream_uri()}"
        headers = self._upstream_headers()
        for k in ("Host", "Origin"):  # the upstream's own; its origin check sees the hub's
            headers.pop(k, None)
        headers["Origin"] = f"{self.request.protocol}://{self.request.host}"
        req = httpclient.HTTPRequest(url, headers=headers, connect_timeout=ports.CONNECT_TIMEOUT)
        try:
            # no callback: messages are read one at a time (below), so the app is read no
            # faster than the viewer takes them
            self._upstream = await websocket.websocket_connect(
                req,
                max_message_size=ports.MAX_WS_MESSAGE,
                subprotocols=getattr(self, "_subprotocols", None) or None,
            )
        except Exception as e:
            ports.forget(job_id, name)
            log.info("job %s port %s websocket: %s", job_id, name, e)
            self.close(1011, "nothing answers on that port")
            return
        if self.ws_connection is None or self.ws_connection.is_closing():
            self._upstream.close()  # the viewer left while it connected
            return
        asyncio.ensure_future(self._from_upstream(self._upstream))

    async def _from_upstream(self, upstream: websocket.WebSocketClientConnection) -> None:
        """The app's messages to the viewer, each written before the next is read."""
        try:
            while (message := await upstream.read_message()) is not None:
                if self.ws_connection is None or self.ws_connection.is_closing():
                    break
                await self.write_message(message, binary=isinstance(message, bytes))
        except (websocket.WebSocketClosedError, StreamClosedError):
            pass  # the viewer went away
        finally:
            upstream.close()
            self.close()

    async def on_message(self, message: str | bytes) -> None:
        """The viewer's message to the app; tornado reads the next one only after this (the
        viewer is read no faster than the app takes its messages)."""
        upstream = getattr(self, "_upstream", None)
        if upstream is not None:
            try:
                await upstream.write_message(message, binary=isinstance(message, bytes))
            except (websocket.WebSocketClosedError, StreamClosedError):
                self.close()  # the app went away

    def on_close(self) -> None:
        upstream = getattr(self, "_upstream", None)
        if upstream is not None:
            upstream.close()
        self._release()

    def _release(self) -> None:
        user = getattr(self, "_counted", None)
        if user is not None:
            self._counted = None
            ports.RELAYS.give(user)


class CutRelays(logging.Filter):
    """Keeps out of tornado's application log the one "Uncaught exception" that is a relay's
    end: when the viewer of a streamed answer leaves, :meth:`JobPortHandler._relay`'s flush
    fails with StreamClosedError, which is how the HTTP client learns to stop reading the app
    (the relay then ends quietly); tornado's client logs that failure as uncaught before it
    ends the fetch. Only a StreamClosedError out of a body's delivery is kept out."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, StreamClosedError) or error.__traceback__ is None:
            return True
        frames = traceback.extract_tb(error.__traceback__)
        return not any(f.name == "_deliver_body" for f in frames)


#: the filter make_app puts on tornado's application log (one, however many apps)
CUT_RELAYS = CutRelays()


def _cut_off(error: Exception) -> bool:
    """Whether a relay's failure is one of its two ends closing (the viewer's connection, or
    the app's, or the app's answer running past ports.REQUEST_TIMEOUT): the end of that relay,
    not the service's error."""
    if isinstance(error, StreamClosedError):
        return True
    return isinstance(error, httpclient.HTTPClientError) and error.code == 599


class _Redirected(Exception):
    """The caller was sent to the hub's log-in page: nothing else to answer."""
