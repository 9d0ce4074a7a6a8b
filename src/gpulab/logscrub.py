"""No credential in a log line: URLs' secret query arguments, ``Authorization`` and cookie
values are replaced by ``[secret]`` before a line is written.

JupyterHub accepts a token in ``?token=`` on WebSocket handshakes (browsers cannot send an
``Authorization`` header there), so a URL in a log line may carry a live token: the access log
writes the URI of every write and of every refusal, and tornado's own lines (an HTTPError's
warning, an uncaught exception's error) write it again. JupyterHub scrubs its own access log
(``jupyterhub.log._scrub_uri``), not tornado's other lines. Here:

- :func:`scrub_uri` is JupyterHub's scrubbing of a request URI (reused: the same keys, the same
  ``[secret]``), hardened: a query key is compared decoded and in lower case (tornado takes
  ``?%74oken=`` as ``token``; JupyterHub's comparison of the raw key does not), and a few more
  credential-looking keys (password, secret, signature...) are scrubbed too.
- :func:`request_summary` is tornado's ``_request_summary`` with the URI scrubbed: what the
  gpulab service's handlers and its access log write.
- :class:`ScrubFilter` scrubs any URL query, ``Authorization`` or cookie value in a record's
  message, whoever logged it: :func:`install` puts it on tornado's loggers and on the given
  handlers, in the service and in the hub (jupyterhub_config.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit, urlunsplit

try:  # JupyterHub's own scrubbing, as its access log applies it
    from jupyterhub.log import SCRUB_PARAM_KEYS as _HUB_KEYS
    from jupyterhub.log import _scrub_uri as _hub_scrub_uri
except ImportError:  # pragma: no cover - jupyterhub is a dependency; its private API may move
    _HUB_KEYS = ("token", "auth", "key", "code", "state", "_xsrf")

    def _hub_scrub_uri(uri: str) -> str:
        return uri


SECRET = "[secret]"
#: a query argument whose (decoded, lower-case) name contains one of these has its value
#: scrubbed: JupyterHub's list, and more names that credentials go by
SCRUB_PARAM_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (*_HUB_KEYS, "password", "passwd", "secret", "credential", "signature", "session")
    )
)
#: tornado's loggers: their lines carry request URIs (the access log, HTTPErrors' warnings,
#: uncaught exceptions)
TORNADO_LOGGERS = ("tornado.access", "tornado.general", "tornado.application")

#: a query argument in free text: ``?`` or ``&``, a name, ``=``, a value up to a separator
_QUERY_ARG = re.compile(r"(?P<lead>[?&])(?P<key>[^\s=&#?'\"<>]+)=(?P<value>[^\s&#'\"<>]*)")
#: an Authorization header's credentials (its scheme is kept), with or without quotes
_AUTHORIZATION = re.compile(
    r"(?i)(?P<head>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
    r"(?P<scheme>(?:token|bearer|basic|digest)\s+)?(?P<value>[^\s'\",;()\[\]]+)"
)
#: a Cookie or Set-Cookie header's whole value
_COOKIE = re.compile(r"(?i)(?P<head>\b(?:set-)?cookie['\"]?\s*[:=]\s*['\"]?)[^'\"\r\n]+")


def secret_key(name: str) -> bool:
    """Whether a query argument named ``name`` (as sent: percent-encoded or not) holds a
    credential."""
    key = unquote_plus(name).lower()
    return any(part in key for part in SCRUB_PARAM_KEYS)


def _scrub_query(query: str) -> str:
    parts = query.split("&")
    for i, part in enumerate(parts):
        key, eq, _ = part.partition("=")
        if eq and secret_key(key):
            parts[i] = f"{key}={SECRET}"
    return "&".join(parts)


def scrub_uri(uri: str) -> str:
    """``uri`` with the value of every credential-looking query argument replaced by
    ``[secret]`` (and JupyterHub's token paths, ``/api/authorizations/token/...``)."""
    uri = _hub_scrub_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URL tornado would route: scrub what looks like arguments
        return scrub_text(uri)
    if not parts.query:
        return uri
    return urlunsplit(parts._replace(query=_scrub_query(parts.query)))


def scrub_text(text: str) -> str:
    """``text`` (a log message) with credentials in URL queries, ``Authorization`` headers and
    cookies replaced by ``[secret]``."""
    if "=" in text:
        text = _QUERY_ARG.sub(
            lambda m: f"{m['lead']}{m['key']}={SECRET}" if secret_key(m["key"]) else m[0], text
        )
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTHORIZATION.sub(_authorization, text)
    if "ookie" in text or "OOKIE" in text:
        text = _COOKIE.sub(lambda m: f"{m['head']}{SECRET}", text)
    return text


def _authorization(m: re.Match) -> str:
    if m["value"].strip(".") == "" or m["value"].lower() in ("token", "bearer", "basic"):
        return m[0]  # a placeholder ("Authorization: token ..."), or a scheme alone
    return f"{m['head']}{m['scheme'] or ''}{SECRET}"


def request_summary(handler) -> str:
    """Tornado's ``RequestHandler._request_summary`` with the URI scrubbed."""
    request = handler.request
    return f"{request.method} {scrub_uri(request.uri or '')} ({request.remote_ip})"


class ScrubFilter(logging.Filter):
    """Rewrites a record whose message holds a credential (see :func:`scrub_text`): its
    message becomes the scrubbed text, without arguments. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_gpulab_scrubbed", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the formatter's to report
            return True
        scrubbed = scrub_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        record._gpulab_scrubbed = True
        return True


_FILTER = ScrubFilter()


def install(
    handlers: Iterable[logging.Handler] = (), loggers: Iterable[str] = TORNADO_LOGGERS
) -> None:
    """Scrub every line of the named loggers (records they create) and every line the given
    handlers write (whichever logger it came from). Idempotent."""
    for name in loggers:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for handler in handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)


def install_in_hub() -> None:
    """In the hub's process (from its configuration file): every line its log's handlers
    write scrubbed, whichever logger it came from. A filter on the ``JupyterHub`` logger
    scrubs only the records that logger makes: gpulab's loggers (``gpulab.*``), sent to the
    hub's log (:func:`gpulab.statelog.follow_hub_log`), reach its handlers unfiltered. The
    handlers there now, and once the hub has set up its logging (its ``extra_log_file``'s
    handler among them). Elsewhere, nothing."""
    from .hub_process import starting_hub

    starting = starting_hub()
    if starting is None:
        return
    hub, loop = starting
    install(handlers=hub.log.handlers, loggers=())
    loop.call_soon(lambda: install(handlers=hub.log.handlers, loggers=()))
