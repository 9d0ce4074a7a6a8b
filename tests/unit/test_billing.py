"""Billing of jobs from hand-made histories (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from gpulab.billing import billed_minutes, billed_time, user_usage
from gpulab.lifecycle import HistoryEvent, JobState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def history(*steps: tuple[float, str]) -> list[HistoryEvent]:
    """(seconds after T0, state) pairs."""
    return [HistoryEvent(state=s, at=T0 + timedelta(seconds=t)) for t, s in steps]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_never_running_is_free():
    h = history((0, "QUEUED"), (10, "INITIALIZING"), (20, "PENDING"), (30, "FAILED"))
    assert billed_minutes(h, at(10_000)) == 0
    assert billed_minutes([], at(10)) == 0


def test_queued_initializing_pending_are_not_billed_and_finalizing_stops_the_meter():
    h = history(
        (0, "QUEUED"),
        (100, "INITIALIZING"),
        (200, "PENDING"),
        (300, "RUNNING"),
        (300 + 125, "FINALIZING"),
        (1000, "DONE"),
    )
    assert billed_time(h, at(5000)) == timedelta(seconds=125)
    assert billed_minutes(h, at(5000)) == 3  # 2 min 5 s: three commenced minutes


@pytest.mark.parametrize("seconds, minutes", [(1, 1), (59, 1), (60, 1), (60.001, 2), (120, 2)])
def test_per_commenced_minute(seconds, minutes):
    h = history((0, "RUNNING"), (seconds, "FINALIZING"))
    assert billed_minutes(h, at(10_000)) == minutes


def test_still_running_is_billed_up_to_now():
    h = history((0, "QUEUED"), (30, "RUNNING"))
    assert billed_minutes(h, at(30 + 3600)) == 60
    assert billed_minutes(h, at(30 + 3601)) == 61


def test_restarting_timeout_and_interrupting_are_billed():
    h = history(
        (0, "RUNNING"),
        (60, "RESTARTING"),
        (90, "RUNNING"),
        (120, "TIMEOUT"),
        (150, "INTERRUPTING"),
        (180, "FINALIZING"),
        (400, "INTERRUPTED"),
    )
    assert billed_time(h, at(1000)) == timedelta(seconds=180)
    assert billed_minutes(h, at(1000)) == 3


def test_requeued_preempted_job_sums_its_runs_and_skips_the_queue():
    h = history(
        (0, "QUEUED"),
        (10, "INITIALIZING"),
        (20, "PENDING"),
        (30, "RUNNING"),  # 30 -> 100: 70 s
        (100, "INTERRUPTING"),
        (130, "QUEUED"),  # billed until re-queued: 100 s in all
        (500, "INITIALIZING"),
        (510, "PENDING"),
        (520, "RUNNING"),  # 520 -> 600: 80 s
        (600, "FINALIZING"),
        (700, "DONE"),
    )
    assert billed_time(h, at(10_000)) == timedelta(seconds=180)
    assert billed_minutes(h, at(10_000)) == 3


def test_ends_without_finalizing_stop_billing():
    h = history((0, "RUNNING"), (61, "FAILED"))
    assert billed_minutes(h, at(10_000)) == 2
    h = history((0, "RUNNING"), (30, "ERROR"))
    assert billed_minutes(h, at(10_000)) == 1


def test_interruption_before_running_is_not_billed():
    h = history((0, "QUEUED"), (10, "INITIALIZING"), (20, "INTERRUPTING"), (500, "INTERRUPTED"))
    assert billed_minutes(h, at(10_000)) == 0


def test_cloned_or_rerun_job_bills_every_life():
    h = history(
        (0, "RUNNING"),
        (60, "FINALIZING"),
        (70, "DONE"),
        (100, "QUEUED"),
        (110, "INITIALIZING"),
        (120, "PENDING"),
        (130, "RUNNING"),
        (190, "FINALIZING"),
        (200, "FAILED"),
    )
    assert billed_minutes(h, at(10_000)) == 2


def test_enum_states_and_unsorted_history_and_duck_typed_events():
    @dataclass
    class Row:
        state: object
        at: datetime

    rows = [
        Row(JobState.FINALIZING, at(150)),
        Row(JobState.RUNNING, at(30)),
        Row(JobState.QUEUED, at(0)),
    ]
    assert billed_time(rows, at(1000)) == timedelta(seconds=120)
    assert billed_minutes(rows, at(1000)) == 2


def test_now_before_last_running_bills_nothing_negative():
    h = history((0, "RUNNING"))
    assert billed_minutes(h, at(-10)) == 0


def test_a_users_billed_total_is_their_jobs_and_their_notebooks():
    assert user_usage(7, 5) == {
        "jobs_billed_minutes": 7,
        "notebooks_billed_minutes": 5,
        "billed_minutes": 12,
    }
    assert user_usage(0, 0)["billed_minutes"] == 0
