"""A distributed job through the web pages in a real headless Chromium: the submit form's
Workers field (its errors next to it, the form kept), the job page's workers (rank, container,
GPUs) and its logs of every rank or one, the jobs list's GPUs in all. Each of the two workers
gets one of the hub's two fake GPUs (gpu_mode "env"). Screenshots in artifacts/screenshots/."""

from __future__ import annotations

import re

import pytest

from .conftest import login

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SERVICE = "/services/gpulab/"
COMMAND = (
    'echo "rank $RANK of $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT"; sleep 6; '
    'echo "rank $RANK finished"'
)


def fill_form(page, workers: str) -> None:
    page.fill("#f-name", "ddp-browser")
    page.fill("#f-command", COMMAND)
    page.fill("#f-gpus", "1")
    page.fill("#f-cpus", "0.5")
    page.fill("#f-memory", "512M")
    page.fill("#f-workers", workers)


def submit(page) -> None:
    """Post the form and wait for the page it answers (an error page has the same URL)."""
    with page.expect_navigation():
        page.click("#submit-job")


def logs_of(page, rank: str) -> str:
    """The log panel's text once it shows ``rank`` ("all" or a number) complete."""
    page.wait_for_function(
        "r => document.getElementById('logs').dataset.rank === r && "
        "document.getElementById('log-status').textContent === 'complete'",
        arg=rank,
        timeout=30_000,
    )
    return page.inner_text("#logs")


def test_submit_a_distributed_job_and_read_each_ranks_log(hub, new_page, shots):
    page = new_page()
    login(page, hub, "gina")
    page.goto(f"{hub.url}{SERVICE}jobs/new")
    page.wait_for_selector("#submit-form")
    assert page.input_value("#f-workers") == "1"  # one container unless asked
    hint = page.inner_text("#workers-hint")
    assert "containers of a distributed job, each with these resources" in hint
    assert "placed all together" in hint

    # out of range: the API's refusal comes back next to the field, the form kept
    for bad in ("65", "0"):
        fill_form(page, bad)
        submit(page)
        assert "workers must be from 1 to 64" in page.inner_text("#error-workers"), bad
        assert page.input_value("#f-workers") == bad
        assert page.input_value("#f-command") == COMMAND
        assert page.input_value("#f-memory") == "512M"
        assert page.locator('#form-errors a[href="#f-workers"]').count() == 1
    shots(page, "submit-form-workers-error")
    # more workers than the GPUs can ever hold: refused at submission, on the field
    fill_form(page, "3")
    submit(page)
    assert "3 workers of 1 GPU(s) each" in page.inner_text("#error-workers")

    fill_form(page, "2")
    submit(page)
    assert re.fullmatch(r".*/services/gpulab/jobs/j[a-z0-9]+", page.url), page.url
    job_id = page.url.rsplit("/", 1)[1]
    rows = page.locator("#workers tbody tr")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-rank") for i in range(2)] == ["0", "1"]
    assert page.inner_text("#job-workers").startswith("2")
    assert "per worker" in page.inner_text("#job-resources")
    assert "2 GPU in all" in page.inner_text("#job-resources")

    # while it runs, the table (kept current by the page) shows each rank's container and GPU
    page.wait_for_selector('#job-state .badge[data-state="RUNNING"]', timeout=120_000)
    page.wait_for_function(
        "[...document.querySelectorAll('#workers .w-devices')].every(td => td.textContent !== '—')",
        timeout=30_000,
    )
    job = page.request.get(f"{hub.url}{SERVICE}api/jobs/{job_id}").json()
    for w in job["workers"]:
        row = page.locator(f'#workers tr[data-rank="{w["rank"]}"]')
        assert row.locator(".w-container").inner_text() == w["container"]
        assert row.locator(".w-devices").inner_text() == ", ".join(w["devices"])
    assert job["workers"][1]["container"] == job["workers"][0]["container"] + "-r1"
    devices = [w["devices"] for w in job["workers"]]
    assert sorted(sum(devices, [])) == ["0", "1"], devices  # one GPU each, different ones
    shots(page, "job-two-workers-running")

    # every rank's output, each line prefixed with its rank
    page.wait_for_selector('#job-state .badge[data-state="DONE"]', timeout=120_000)
    both = logs_of(page, "all")
    assert "[rank 0] rank 0 of 2, master worker-0:29500" in both, both
    assert "[rank 1] rank 1 of 2, master worker-0:29500" in both, both
    assert "[rank 1] rank 1 finished" in both, both
    shots(page, "job-two-workers-done-all-ranks")

    # one rank's, as it wrote it
    page.select_option("#log-rank", "1")
    one = logs_of(page, "1")
    assert "rank 1 of 2" in one and "rank 1 finished" in one, one
    assert "rank 0" not in one and "[rank" not in one, one
    shots(page, "job-two-workers-rank-1")
    # the workers table's link shows rank 0's
    page.click('#workers a.rank-logs[data-rank="0"]')
    zero = logs_of(page, "0")
    assert "rank 0 of 2" in zero and "rank 1" not in zero, zero
    assert page.input_value("#log-rank") == "0"

    # the jobs list: GPUs in all, and how they are split
    page.goto(f"{hub.url}{SERVICE}jobs")
    cell = page.locator(f'tr[data-job="{job_id}"] td.gpus')
    assert cell.get_attribute("data-gpus") == "2 (2 workers × 1)"
    assert cell.inner_text().startswith("2 (2 workers × 1)")
    shots(page, "jobs-list-gpus-in-all")
