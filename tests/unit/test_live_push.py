"""When a running workload's volumes are pushed (gpulab.live_push), as data: the interval's
bounds at every door (site, flavor, job spec), whose interval wins, and the decision."""

from __future__ import annotations

import pytest

from gpulab.errors import FieldError
from gpulab.jobs.spec import JobSpec, JobSpecError
from gpulab.live_push import MAX_INTERVAL_S, check_interval, interval_for, push_due
from gpulab.settings import ConfigError, GpulabSettings

from ..support.jobspecs import parse


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), ("0", 0.0), (60, 60.0), ("15m", 900.0), ("1d", MAX_INTERVAL_S), (90.5, 90.5)],
)
def test_an_interval_is_0_or_between_the_floor_and_a_day(value, seconds):
    assert check_interval(value, "sync_interval", 60) == seconds


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (30, r"must be 0 \(off\) or at least 1m"),
        ("59s", "at least 1m"),
        (86401, "at most 1d"),
        (-5, "longer than zero"),
        ("soon", "a number of seconds or a duration"),
        (True, "a number of seconds or a duration"),
        ("9" * 40, "too long"),
    ],
)
def test_a_bad_interval_is_refused_naming_the_field(value, words):
    with pytest.raises(FieldError, match=words) as e:
        check_interval(value, "sync_interval", 60)
    assert e.value.field == "sync_interval"


def test_the_jobs_own_interval_wins_then_its_flavors_then_the_sites():
    assert interval_for(120, 600, 300) == 120
    assert interval_for(0, 600, 300) == 0  # the job said never
    assert interval_for(None, 600, 300) == 600
    assert interval_for(None, None, 300) == 300


@pytest.mark.parametrize(
    ("now", "interval", "last", "in_flight", "requested", "due"),
    [
        (100, 60, None, False, False, None),  # started at 50: not yet one interval
        (110, 60, None, False, False, "interval"),
        (150, 60, 100, False, False, None),
        (160, 60, 100, False, False, "interval"),
        (160, 60, 100, True, False, None),  # one at a time
        (160, 60, 100, True, True, None),  # asked, but one runs: after it
        (101, 60, 100, False, True, "request"),  # on demand: whatever the interval
        (10_000, 0, None, False, False, None),  # off
        (101, 0, None, False, True, "request"),  # off, but asked
        (110, 60, 10, False, False, "interval"),  # a push before a restart: from the start
    ],
)
def test_when_a_live_push_is_due(now, interval, last, in_flight, requested, due):
    assert push_due(now, interval, 50, last, in_flight, requested) == due


def test_a_jobs_sync_interval_is_checked_against_the_sites_floor():
    spec = parse({"command": ["x"], "sync_interval": "5m"})
    assert spec.sync_interval == 300 and JobSpec.from_json(spec.to_json()).sync_interval == 300
    assert parse({"command": ["x"]}).sync_interval is None
    assert parse({"command": ["x"], "sync_interval": 0}).sync_interval == 0
    with pytest.raises(JobSpecError, match="at least 1m") as e:
        parse({"command": ["x"], "sync_interval": 10})
    assert e.value.field == "sync_interval"
    assert parse({"command": ["x"], "sync_interval": 10}, sync_floor=5).sync_interval == 10


def test_the_sites_and_flavors_intervals_are_checked_at_start_up():
    flavor = {"id": "f", "cpus": 1, "memory": "1G", "sync_interval": 600}
    s = GpulabSettings(sync_interval=300, flavors=[flavor, {**flavor, "id": "g", "gpus": 0}])
    assert s.sync_interval_for(None, "f") == 600 and s.sync_interval_for(120, "f") == 120
    s = GpulabSettings(sync_interval=300, flavors=[{**flavor, "sync_interval": None}])
    assert s.sync_interval_for(None, "f") == 300 and s.sync_interval_for(None, None) == 300
    with pytest.raises(ConfigError, match=r"c.GpulabSettings.sync_interval must be 0 \(off\)"):
        GpulabSettings(sync_interval=10)
    with pytest.raises(ConfigError, match="flavor 'f': sync_interval must be 0"):
        GpulabSettings(flavors=[{**flavor, "sync_interval": 30}])
    assert GpulabSettings(sync_interval=10, sync_interval_floor=5).sync_interval == 10
    with pytest.raises(ConfigError, match="sync_interval_floor must be a positive"):
        GpulabSettings(sync_interval_floor=0)


def test_the_job_page_offers_push_now_and_shows_the_last_live_push(tmp_path):
    from gpulab.db import Database
    from gpulab.jobs.records import JobRecords
    from gpulab.service.pages.base import _env

    records = JobRecords(Database(f"sqlite:///{tmp_path / 'db.sqlite'}"), "t")
    spec = parse({"command": ["x"], "volumes": ["team@s3/vision:/out:rw"], "sync_interval": 600})
    job = records.get(records.create("ann", spec.to_json(), "train", ())["id"])
    page = _env.get_template("job.html")
    common = dict(
        prefix="/p/", static="/s/", xsrf_form_html=lambda: "", workers=1, first_rank="",
        ended_states=["DONE"], can_manage=True, api="/api", me={"name": "ann"}, hub="/h/",
        request_path="/p/jobs", users_prefix="/u/", is_admin=False, xsrf_token="",
    )  # fmt: skip
    assert 'id="action-push"' not in page.render(job=job, ended=False, **common)  # QUEUED
    last = {"running": False, "at": "2026-11-27T09:00:00Z", "ok": True, "message": "sent 2"}
    running = {**job, "state": "RUNNING", "live_push": last}
    html = page.render(job=running, ended=False, **common)
    assert ">Push now</button>" in html and 'action="/p/jobs/' + job["id"] + '/push"' in html
    assert "every 10m" in html and "sent 2" in html and 'id="job-live-push"' in html
    busy = {**running, "live_push": {**last, "running": True, "started": last["at"]}}
    html = page.render(job=busy, ended=False, **common)
    assert 'id="action-push"' not in html and "running since" in html  # one at a time
    ro = parse({"command": ["x"], "volumes": ["datasets@s3:/in:ro"]}).to_json()
    html = page.render(job={**running, "spec": ro}, ended=False, **common)
    assert 'id="action-push"' not in html and 'id="job-sync-interval"' not in html
    failed = {**job, "state": "SYNC_FAILED"}
    assert ">Retry push</button>" in page.render(job=failed, ended=False, **common)
