"""No credential in a log line: URIs, free text, records, whichever logger writes them."""

from __future__ import annotations

import io
import logging

import pytest
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.testing import bind_unused_port

from gpulab.logscrub import (
    SECRET,
    ScrubFilter,
    install,
    request_summary,
    scrub_text,
    scrub_uri,
    secret_key,
)
from gpulab.service.app import log_request
from gpulab.service.base import ApiError, JsonErrors

from ..conftest import run_async

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "uri, scrubbed",
    [
        ("/api/jobs/j1/shell?token=" + TOKEN, "/api/jobs/j1/shell?token=[secret]"),
        (f"/x?cols=80&token={TOKEN}&rows=24", "/x?cols=80&token=[secret]&rows=24"),
        (f"/x?access_token={TOKEN}", "/x?access_token=[secret]"),
        # tornado decodes a key: "%74oken" is "token" to it (and to JupyterHub's HubAuth)
        (f"/x?%74oken={TOKEN}", "/x?%74oken=[secret]"),
        (f"/x?TOKEN={TOKEN}", "/x?TOKEN=[secret]"),
        (f"/x?_xsrf={TOKEN}&code=abc&state=def", "/x?_xsrf=[secret]&code=[secret]&state=[secret]"),
        (f"/x?X-Amz-Signature={TOKEN}&password=p", "/x?X-Amz-Signature=[secret]&password=[secret]"),
        (f"/hub/api/authorizations/token/{TOKEN}", "/hub/api/authorizations/token/[secret]"),
        ("/x?limit=5&offset=10&flag", "/x?limit=5&offset=10&flag"),
        ("/api/jobs", "/api/jobs"),
    ],
)
def test_scrub_uri(uri, scrubbed):
    assert scrub_uri(uri) == scrubbed
    assert TOKEN not in scrub_uri(uri)


def test_secret_keys_are_compared_decoded_and_in_lower_case():
    assert secret_key("token") and secret_key("Access_Token") and secret_key("%74oken")
    assert secret_key("to%6Ben") and secret_key("api+key")
    assert not secret_key("limit") and not secret_key("cols")


@pytest.mark.parametrize(
    "text",
    [
        f"404 GET /services/gpulab/api/jobs/j1/shell?token={TOKEN} (127.0.0.1): no job j1",
        f"HTTPServerRequest(uri='/x?a=1&token={TOKEN}', version='HTTP/1.1')",
        f"fetching http://10.0.0.2:8765/app/?next=/&access_token={TOKEN}#frag",
        f"headers: {{'Authorization': 'token {TOKEN}', 'Host': 'hub'}}",
        f"Authorization: Bearer {TOKEN}",
        f"authorization={TOKEN}",
        f"Cookie: service-gpulab={TOKEN}; _xsrf=abc",
        f"{{'Set-Cookie': 'jupyterhub-session-id={TOKEN}; Path=/'}}",
    ],
)
def test_scrub_text_takes_the_credential_out_of_a_message(text):
    scrubbed = scrub_text(text)
    assert TOKEN not in scrubbed and SECRET in scrubbed, scrubbed


def test_scrub_text_keeps_the_rest():
    plain = "job j1 owner=alice QUEUED->RUNNING reason=SCHEDULED; GET /x?limit=5 (1.2.3.4)"
    assert scrub_text(plain) == plain
    line = scrub_text(f"Authorization: token {TOKEN} from 1.2.3.4")
    assert line == "Authorization: token [secret] from 1.2.3.4"
    hint = "not authenticated: log in or send a hub API token (Authorization: token ...)"
    assert scrub_text(hint) == hint


def test_request_summary_is_tornados_without_the_secret():
    uri = f"/services/gpulab/api/jobs/j1/shell?cols=80&token={TOKEN}"
    request = HTTPServerRequest(
        start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "hub", "Authorization": f"token {TOKEN}"}),
    )
    request.remote_ip = "10.1.2.3"

    class Handler:
        pass

    handler = Handler()
    handler.request = request
    assert request_summary(handler) == (
        "GET /services/gpulab/api/jobs/j1/shell?cols=80&token=[secret] (10.1.2.3)"
    )
    # the service's handlers all write theirs so (tornado's access log and error lines use it)
    assert JsonErrors._request_summary.__qualname__ == "ScrubbedLogs._request_summary"


def _capture(logger_name: str) -> tuple[logging.Logger, io.StringIO, logging.Handler]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, out, handler


def test_the_filter_scrubs_any_record_on_a_handler_and_drops_none():
    logger, out, handler = _capture("gpulab.test.scrub.handler")
    try:
        install([handler], loggers=())
        install([handler], loggers=())  # idempotent
        assert sum(isinstance(f, ScrubFilter) for f in handler.filters) == 1
        logger.warning("%d %s: %s", 404, f"GET /x?token={TOKEN} (1.2.3.4)", "no job")
        logger.info("plain %s", "line")
        logger.error("Authorization: %s", f"token {TOKEN}")
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == [
        "gpulab.test.scrub.handler 404 GET /x?token=[secret] (1.2.3.4): no job",
        "gpulab.test.scrub.handler plain line",
        "gpulab.test.scrub.handler Authorization: token [secret]",
    ]


def test_the_filter_on_a_logger_scrubs_what_it_logs():
    logger, out, handler = _capture("gpulab.test.scrub.logger")
    try:
        install(loggers=["gpulab.test.scrub.logger"])
        logger.warning("403 GET %s (1.2.3.4)", f"/hub/api/users/x?token={TOKEN}")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue() == (
        "gpulab.test.scrub.logger 403 GET /hub/api/users/x?token=[secret] (1.2.3.4)\n"
    )


class _Refuses(JsonErrors):
    """A handler of the service's: a 404 (an ApiError, logged by tornado as a warning) or an
    uncaught exception (logged as an error, tornado's with the request's repr)."""

    def get(self, what: str):
        if what == "missing":
            raise ApiError(404, "no job j1")
        raise RuntimeError("boom")


def test_the_service_handlers_log_no_token_without_any_filter(caplog):
    """The service's own handlers, in a real tornado server, with gpulab's access log: their
    lines name the request with its token scrubbed (no log filter installed here). On a loop
    of its own (run_async): in a full run Playwright's loop owns the main thread."""

    async def requests() -> None:
        app = web.Application([(r"/(missing|broken)", _Refuses)], log_function=log_request)
        sock, port = bind_unused_port()
        server = HTTPServer(app)
        server.add_sockets([sock])
        client = AsyncHTTPClient()
        try:
            for path in ("missing", "broken"):
                r = await client.fetch(
                    f"http://127.0.0.1:{port}/{path}?cols=80&token={TOKEN}", raise_error=False
                )
                assert r.code == (404 if path == "missing" else 500)
        finally:
            server.stop()

    with caplog.at_level(logging.INFO):
        run_async(requests())
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert TOKEN not in repr(lines), lines
    summary = "/{}?cols=80&token=[secret] (127.0.0.1)"
    assert ("tornado.general", f"404 GET {summary.format('missing')}: no job j1") in lines
    assert ("tornado.application", f"Uncaught exception GET {summary.format('broken')}") in lines
    access = [m for name, m in lines if name == "tornado.access"]
    assert [m.split("ms")[0].rsplit(" ", 1)[0] for m in access] == [
        f"404 GET {summary.format('missing')}",
        f"500 GET {summary.format('broken')}",
    ]


def test_in_the_hub_gpulabs_lines_are_scrubbed_on_the_hubs_handlers(monkeypatch):
    """gpulab's loggers send their lines to the hub's log (statelog.follow_hub_log): a
    filter on the JupyterHub logger does not see them (a logger's filters see only the
    records it makes), its handlers do: install_in_hub puts the filter there, for the
    handlers the hub has at its configuration and those it adds once it starts."""
    import asyncio
    from types import SimpleNamespace

    from gpulab import hub_process, logscrub

    hub_log = logging.getLogger("test-hub-scrub")
    hub_log.propagate = False
    early, late = io.StringIO(), io.StringIO()
    hub_log.addHandler(logging.StreamHandler(early))
    child = logging.getLogger("test-hub-scrub-gpulab.loop")
    child.parent = hub_log
    logscrub.install(loggers=("test-hub-scrub",))  # what the configuration did before
    secret = "http://hub/api/users?token=0123456789abcdef0123"

    async def hub_starts():
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(
            hub_process, "starting_hub", lambda: (SimpleNamespace(log=hub_log), loop)
        )
        logscrub.install_in_hub()
        hub_log.addHandler(logging.StreamHandler(late))  # its extra_log_file's, at start
        await asyncio.sleep(0)

    try:
        run_async(hub_starts())
        child.warning("held by %s", secret)
    finally:
        for h in list(hub_log.handlers):
            hub_log.removeHandler(h)
    for out in (early, late):
        assert "held by" in out.getvalue() and "0123456789abcdef" not in out.getvalue()
