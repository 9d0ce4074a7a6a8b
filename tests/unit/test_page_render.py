"""A big page (the jobs page's 200 rows, the admin's) is rendered off the service's event loop
(pages/base.py ``render_big_page``): rendered on it, it held every other request for 7 ms and
at times over 20 ms (bench/bench_loop.py)."""

from __future__ import annotations

import threading
from unittest import mock

from tornado import httputil, web

from gpulab.service.pages import base as pages
from tests.conftest import run_async


def test_a_big_page_is_rendered_off_the_event_loop(monkeypatch):
    rendered: dict = {}

    class Template:
        def render(self, **ctx):
            rendered["thread"] = threading.current_thread().name
            rendered["ctx"] = ctx
            return "<p>jobs</p>"

    monkeypatch.setattr(pages._env, "get_template", lambda name: Template())
    request = httputil.HTTPServerRequest(
        connection=mock.Mock(),
        start_line=httputil.RequestStartLine("GET", "/jobs", "HTTP/1.1"),
        headers=httputil.HTTPHeaders({"Host": "127.0.0.1"}),
    )
    handler = pages.PageHandler(web.Application(), request)
    sent: list = []
    handler._send_page = lambda html, status: sent.append((html, status))

    async def render():
        loop_thread = threading.current_thread().name
        await handler.render_big_page("jobs.html", jobs=[1, 2])
        return loop_thread

    loop_thread = run_async(render())
    assert sent == [("<p>jobs</p>", 200)]
    assert rendered["thread"] != loop_thread and rendered["thread"].startswith("gpulab-reads")
    assert rendered["ctx"]["jobs"] == [1, 2] and rendered["ctx"]["request_path"] == "/jobs"
    assert rendered["ctx"]["xsrf_form_html"]() == ""  # nobody logged in: no form token


def test_the_jobs_and_admin_pages_render_off_the_loop():
    import inspect

    from gpulab.service.pages.admin import AdminPage
    from gpulab.service.pages.jobs import JobsPage

    for page in (JobsPage, AdminPage):
        source = inspect.getsource(page.get)
        assert "render_big_page" in source and "self.render_page(" not in source, page
