"""The web pages in a real headless Chromium: hub log-in, the spawn form and JupyterLab, the
gpulab pages (jobs submitted and followed to DONE with their logs), the admin GPU view and its
403 for others. Every page visited is kept as a screenshot in artifacts/screenshots/."""

from __future__ import annotations

import contextlib
import re

import pytest
import requests

from .conftest import login, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SERVICE = "/services/gpulab/"


def test_spawn_form_errors_then_jupyterlab(hub, new_page, shots):
    page = new_page()
    login(page, hub, "nora")
    page.goto(f"{hub.url}/hub/spawn/nora/lab1")
    page.wait_for_selector("#gpulab-framework")
    assert "2 of 2 free now" in page.inner_text("#gpulab-gpus-free")
    shots(page, "spawn-form")

    # a bad custom request: the hub's message is shown next to the memory field, and what was
    # typed is still there
    page.select_option("#gpulab-framework", "python")
    page.select_option("#gpulab-flavor", "custom")
    page.fill("#gpulab-cpus", "1")
    page.fill("#gpulab-memory", "-2G")
    page.fill("#gpulab-gpus", "0")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_selector(".spawn-error-msg")
    error = page.locator('[data-field="memory"] .gpulab-field-error')
    error.wait_for(state="visible")
    assert "memory must be" in error.inner_text()
    assert page.input_value("#gpulab-memory") == "-2G"
    assert page.input_value("#gpulab-flavor") == "custom"
    assert page.input_value("#gpulab-framework") == "python"
    shots(page, "spawn-form-field-error")

    # a good one: the progress page, then JupyterLab
    page.select_option("#gpulab-flavor", "cpu-small")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(r".*/(spawn-pending/nora/lab1|user/nora/lab1/).*"))
    if "spawn-pending" in page.url:
        page.wait_for_selector("#progress-message", state="attached")
        log = page.locator("details summary")  # the hub's event log: every step, data sync too
        if log.count():
            with contextlib.suppress(Exception):
                log.first.click(timeout=2000)
        shots(page, "spawn-progress")
    page.wait_for_url(re.compile(r".*/user/nora/lab1/lab.*"), timeout=120_000)
    page.wait_for_selector("#jp-main-dock-panel, .jp-LabShell", timeout=90_000)
    assert "JupyterLab" in page.title() or page.locator(".jp-LabShell").count() == 1
    page.wait_for_timeout(1500)  # let the launcher draw
    shots(page, "jupyterlab")

    # the gpulab home page lists the notebook as RUNNING, with its history
    page.goto(hub.url + SERVICE)
    row = page.locator('tr[data-notebook="lab1"]')
    row.wait_for()
    assert row.locator('td.state .badge[data-state="RUNNING"]').count() == 1
    row.locator("summary").click()
    assert "STARTING" in row.inner_text()
    assert page.locator("#usage-total").count() == 1
    shots(page, "home-with-notebook")


def test_submit_job_follow_logs_until_done(hub, new_page, shots):
    page = new_page()
    login(page, hub, "jules")
    page.goto(hub.url + SERVICE)
    page.wait_for_selector("h1")
    assert "Hello, jules" in page.inner_text("h1")
    shots(page, "home")

    page.click("text=Submit a job >> nth=0")
    page.wait_for_selector("#submit-form")
    shots(page, "submit-form")

    # a refused field comes back next to that field, with the rest of the form kept
    page.fill("#f-name", "hello-browser")
    page.fill(
        "#f-command", "echo start; for i in 1 2 3; do echo step $i; sleep 1; done; echo finished-ok"
    )
    page.fill("#f-gpus", "0")
    page.fill("#f-cpus", "0.5")
    page.fill("#f-memory", "lots")
    page.fill("#f-env", "GREETING=hi")
    page.click("#submit-job")
    page.wait_for_selector("#error-memory")
    assert "memory" in page.inner_text("#error-memory")
    assert page.input_value("#f-command").startswith("echo start")
    assert page.input_value("#f-env") == "GREETING=hi"
    shots(page, "submit-form-field-error")

    page.fill("#f-memory", "512M")
    page.fill(
        "#f-command",
        'echo "$GREETING from the job"; for i in 1 2 3; do echo step $i; sleep 1; done; echo finished-ok',
    )
    page.click("#submit-job")
    page.wait_for_url(re.compile(r".*/services/gpulab/jobs/[a-z0-9]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    page.wait_for_selector("#logs")
    # the log streams in while the job runs
    page.wait_for_function(
        "document.getElementById('logs').textContent.includes('step')", timeout=90_000
    )
    shots(page, "job-running")
    page.wait_for_selector('#job-state .badge[data-state="DONE"]', timeout=120_000)
    page.wait_for_function(
        "document.getElementById('logs').textContent.includes('finished-ok')", timeout=30_000
    )
    page.wait_for_function(
        "document.getElementById('log-status').textContent === 'complete'", timeout=30_000
    )
    assert page.locator("#action-interrupt").count() == 0
    logs = page.inner_text("#logs")
    assert "hi from the job" in logs and "step 3" in logs
    events = page.inner_text("#events")
    for state in ("QUEUED", "RUNNING", "DONE"):
        assert state in events, (state, events)
    shots(page, "job-done")

    # a form post without the XSRF token (a cross-site request) is refused, nothing submitted
    forged = page.request.post(
        f"{hub.url}{SERVICE}jobs/new", form={"command": "echo forged"}, max_redirects=0
    )
    assert forged.status == 403, forged.status
    assert "forged" not in page.request.get(f"{hub.url}{SERVICE}api/jobs").text()

    # the jobs list, filtered on DONE
    page.goto(f"{hub.url}{SERVICE}jobs")
    page.select_option("#state-filter", "DONE")
    page.wait_for_url(re.compile(r".*state=DONE.*"))
    row = page.locator(f'tr[data-job="{job_id}"]')
    assert row.locator('.badge[data-state="DONE"]').count() == 1
    shots(page, "jobs-filtered")
    page.goto(f"{hub.url}{SERVICE}jobs?state=RUNNING")
    assert page.locator(f'tr[data-job="{job_id}"]').count() == 0


def test_admin_gpu_view_and_403_for_others(hub, new_page, shots):
    # a job holding GPU 0, submitted with the API (a token: no XSRF needed there)
    token = hub.create_user("gail")
    api = f"{hub.url}{SERVICE}api"
    r = requests.post(
        f"{api}/jobs",
        headers={"Authorization": f"token {token}"},
        json={
            "name": "holds-a-gpu",
            "command": "echo holding; sleep 120",
            "resources": {"gpus": 1, "cpus": 0.5, "memory": "256M"},
        },
        timeout=30,
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    def running():
        j = requests.get(
            f"{api}/jobs/{job_id}", headers={"Authorization": f"token {token}"}, timeout=30
        ).json()
        return j["state"] == "RUNNING"

    wait_until(running, timeout=90, what=f"job {job_id} RUNNING")

    admin = new_page()
    login(admin, hub, "admin", admin=True)
    admin.goto(f"{hub.url}{SERVICE}admin")
    admin.wait_for_selector("#gpu-table")
    held = admin.locator('#gpu-table tr[data-device="0"]')
    assert job_id in held.inner_text() and "gail" in held.inner_text()
    assert "whole device" in held.inner_text()
    assert admin.locator('#gpu-table tr.free[data-device="1"]').count() == 1
    assert admin.locator('#user-table tr[data-user="gail"]').count() == 1
    shots(admin, "admin-gpus")
    # everyone's jobs, and the hub's own admin panel still answers
    admin.goto(f"{hub.url}{SERVICE}jobs?all=true")
    assert admin.locator(f'tr[data-job="{job_id}"]').count() == 1
    shots(admin, "admin-all-jobs")
    admin.goto(f"{hub.url}/hub/admin")
    admin.wait_for_selector("text=gail", timeout=30_000)
    shots(admin, "hub-admin-panel")

    # gail may not see it: a clear 403 page
    user = new_page()
    login(user, hub, "gail")
    resp = user.goto(f"{hub.url}{SERVICE}admin")
    assert resp.status == 403
    assert "Not allowed" in user.inner_text("h1")
    assert user.locator('a[href$="/admin"]').count() == 0  # no Admin link in the menu
    shots(user, "non-admin-403")

    # interrupt the job from its page (a form post with the XSRF token)
    user.goto(f"{hub.url}{SERVICE}jobs/{job_id}")
    user.click("#action-interrupt")
    user.wait_for_selector('#job-state .badge[data-state="INTERRUPTED"]', timeout=60_000)
    shots(user, "job-interrupted")
