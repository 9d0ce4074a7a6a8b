"""The job page's terminal panel in a real headless Chromium: xterm.js (vendored) over the
service's shell WebSocket, authenticated by the hub's OAuth cookie and the page's XSRF token."""

from __future__ import annotations

import pytest

from ..support.api import Api
from .conftest import login, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SERVICE = "/services/gpulab/"
#: whether the page's browser can open a WebSocket to this path (then closes it)
OPENS = """path => new Promise(done => {
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host
                           + path);
  ws.onopen = () => { ws.close(); done(true); };
  ws.onerror = () => done(false);
})"""


def test_terminal_panel_runs_a_command_and_shows_its_output(hub, new_page, shots):
    api = Api(hub, "tara")
    job = api.submit(command=["sleep", "900"])
    try:
        api.wait(job["id"], {"RUNNING"})
        page = new_page()
        login(page, hub, "tara")
        page.goto(f"{hub.url}{SERVICE}jobs/{job['id']}")
        page.click("#terminal-open")
        page.wait_for_selector('#terminal-card[data-connected="true"]')
        rows = page.locator("#terminal .xterm-rows")
        wait_until(lambda: "$" in rows.inner_text(), timeout=30, what="the shell's prompt")
        page.click("#terminal")
        page.keyboard.type("echo $((6*7)) done")
        page.keyboard.press("Enter")
        wait_until(lambda: "42 done" in rows.inner_text(), timeout=30, what="the output")
        shots(page, "job-terminal")
        page.keyboard.type("exit 4")
        page.keyboard.press("Enter")
        page.wait_for_selector('#terminal-card[data-connected="false"]')
        # xterm.js draws what it is given at its next frame, after the card said so
        wait_until(lambda: "exit code 4" in rows.inner_text(), timeout=10, what="the exit code")
        events = api.call("GET", f"/jobs/{job['id']}/events").json()["events"]
        assert "shell opened by tara" in [e["message"] for e in events]
        # the cookie alone does not open a shell: the page's XSRF token must come with it
        assert page.evaluate(OPENS, f"{SERVICE}api/jobs/{job['id']}/shell") is False
        xsrf = page.get_attribute("#job-page", "data-xsrf")
        assert page.evaluate(OPENS, f"{SERVICE}api/jobs/{job['id']}/shell?_xsrf={xsrf}") is True
    finally:
        api.call("POST", f"/jobs/{job['id']}/interrupt")


def test_no_terminal_panel_once_the_job_has_ended(hub, new_page):
    api = Api(hub, "tom")
    job = api.submit(command=["true"])
    api.wait(job["id"])
    page = new_page()
    login(page, hub, "tom")
    page.goto(f"{hub.url}{SERVICE}jobs/{job['id']}")
    page.wait_for_selector("#events")
    assert page.locator("#terminal-card").count() == 0


def test_terminal_of_a_distributed_job_opens_in_the_chosen_rank(hub, new_page, shots):
    api = Api(hub, "rhea")
    job = api.submit(command=["sleep", "900"], workers=2)
    try:
        api.wait(job["id"], {"RUNNING"})
        page = new_page()
        login(page, hub, "rhea")
        page.goto(f"{hub.url}{SERVICE}jobs/{job['id']}")
        assert page.locator("#terminal-rank option").all_inner_texts() == ["0", "1"]
        page.select_option("#terminal-rank", "1")
        page.click("#terminal-open")
        page.wait_for_selector('#terminal-card[data-connected="true"]')
        assert "rank 1's container" in page.inner_text("#terminal-status")
        rows = page.locator("#terminal .xterm-rows")
        wait_until(lambda: "$" in rows.inner_text(), timeout=30, what="the shell's prompt")
        page.click("#terminal")
        page.keyboard.type('echo "on rank=$RANK of $WORLD_SIZE at $(hostname)"')
        page.keyboard.press("Enter")
        wait_until(
            lambda: "on rank=1 of 2 at worker-1" in rows.inner_text(), timeout=30, what="output"
        )
        shots(page, "job-terminal-rank-1")
        events = api.call("GET", f"/jobs/{job['id']}/events").json()["events"]
        opened = [e["message"] for e in events if e["message"].startswith("shell opened")]
        assert opened and "rank 1" in opened[-1], opened
    finally:
        api.call("POST", f"/jobs/{job['id']}/interrupt")
