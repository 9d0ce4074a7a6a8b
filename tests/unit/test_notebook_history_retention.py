"""Retention of notebooks' histories (gpulab.notebooks.records.prune_history): a long-lived
notebook's events older than the site's job_retention go, its newest HISTORY_KEPT stay, the
cut never crosses a billed period, and its usage is the same to the minute before and after
(what the deleted part billed is kept on its row). The cut as data (history_cut); the rest on a
SQLite database with a clock of the test's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from types import SimpleNamespace as E

import pytest

from gpulab.db import Database
from gpulab.lifecycle import NotebookState as N
from gpulab.notebooks import records as records_module
from gpulab.notebooks.records import HISTORY_KEPT, NotebookRecords, history_cut
from gpulab.service.tasks import retention as task
from tests.conftest import run_async

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ev(minute: int, state: N) -> E:
    return E(at=T0 + timedelta(minutes=minute), state=state.value)


# a notebook's day: started, ran, stopped (minutes)
DAY = [ev(0, N.STARTING), ev(1, N.RUNNING), ev(31, N.STOPPING), ev(32, N.STOPPED)]


@pytest.mark.parametrize(
    ("events", "before", "keep", "limit", "cut"),
    [
        (DAY, 100, 0, 100, 4),  # all of it, ending STOPPED
        (DAY, 100, 1, 100, 3),  # the newest kept: the cut ends at STOPPING (not billed)
        (DAY, 100, 2, 100, 1),  # RUNNING may not end the cut: back to STARTING
        (DAY, 100, 3, 100, 1),
        (DAY, 100, 4, 100, 0),  # no more than the kept ones
        (DAY, 31, 0, 100, 1),  # STOPPING is not older than the cut-off
        (DAY, 0, 0, 100, 0),  # nothing older
        (DAY, 100, 0, 2, 1),  # the batch's end on RUNNING: back to STARTING
        (DAY[1:3], 100, 0, 1, 0),  # only RUNNING within the batch: nothing
        ([], 100, 0, 100, 0),
    ],
)
def test_the_cut_of_a_history(events, before, keep, limit, cut):
    assert history_cut(events, T0 + timedelta(minutes=before), keep, limit) == cut


class Clock:
    def __init__(self, monkeypatch):
        self.at = T0
        monkeypatch.setattr(records_module, "utcnow", lambda: self.at)
        monkeypatch.setattr(task, "utcnow", lambda: self.at)


def days_of_use(records, clock, user: str, server: str, days: int, seconds: int) -> None:
    """A notebook started, run ``seconds`` and stopped once a day."""
    for _ in range(days):
        for state, after in ((N.STARTING, 10), (N.RUNNING, seconds), (N.STOPPING, 5)):
            records.transition(user, server, state)
            clock.at += timedelta(seconds=after)
        records.transition(user, server, N.STOPPED)
        clock.at += timedelta(days=1)


def test_old_history_goes_the_newest_stays_and_usage_is_unchanged(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    records = NotebookRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "lab")
    days_of_use(records, clock, "ann", "", days=60, seconds=95)  # 2 minutes a day, billed
    days_of_use(records, clock, "ann", "gpu", days=3, seconds=30)  # short: under HISTORY_KEPT
    days_of_use(records, clock, "bob", "", days=40, seconds=61)
    records.transition("ann", "", N.STARTING)  # running now, for longer than retention
    clock.at += timedelta(seconds=7)
    records.transition("ann", "", N.RUNNING)
    clock.at += timedelta(days=40, seconds=3)
    before = records.billed_minutes("ann"), records.billed_minutes_of(["ann", "bob", "cy"])
    # per notebook, commenced minutes of its total: 60 x 95 s + 40 days 3 s; 3 x 30 s
    ann = -(-(60 * 95 + 40 * 86400 + 3) // 60) + -(-(3 * 30) // 60)
    assert before == (ann, {"ann": ann, "bob": -(-(40 * 61) // 60), "cy": 0})
    histories = {(n["user"], n["server"]): n["history"] for n in records.list()}
    settings = SimpleNamespace(job_retention=30 * 86400.0, job_retention_batch=3)
    monkeypatch.setattr(task, "BATCH_PAUSE", 0)
    gone = run_async(task.prune_histories(settings, records))

    after = {(n["user"], n["server"]): n["history"] for n in records.list()}
    cutoff = clock.at - timedelta(days=30)
    for key, history in after.items():
        old = histories[key]
        assert history == old[len(old) - len(history) :]  # the newest, in order
        assert len(history) >= min(len(old), HISTORY_KEPT)
        dropped = old[: len(old) - len(history)]
        assert all(datetime.fromisoformat(e["at"]) < cutoff for e in dropped)
        assert not dropped or dropped[-1]["state"] != "RUNNING"  # no billed period cut
    assert after[("ann", "gpu")] == histories[("ann", "gpu")]  # 12 events: all kept
    # older than 30 days: every day of use. Kept: bob's newest 20 (5 whole days); ann's
    # newest 20 and the RUNNING before them (a cut may not end on RUNNING: it ends on that
    # day's STARTING)
    assert [len(after[k]) for k in (("ann", ""), ("bob", ""))] == [HISTORY_KEPT + 1, HISTORY_KEPT]
    assert after[("ann", "")][-1]["state"] == "RUNNING"
    assert gone == sum(len(histories[k]) - len(after[k]) for k in after) > 200
    assert (
        records.billed_minutes("ann"),
        records.billed_minutes_of(["ann", "bob", "cy"]),
    ) == before
    # and again later: the running period goes on being billed across the cut
    clock.at += timedelta(minutes=10)
    assert records.billed_minutes("ann") == before[0] + 10
    assert run_async(task.prune_histories(settings, records)) == 0  # nothing more may go


def test_without_a_site_retention_every_history_is_kept(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    records = NotebookRecords(Database(f"sqlite:///{tmp_path / 'g.sqlite'}"), "lab")
    days_of_use(records, clock, "ann", "", days=30, seconds=60)
    clock.at += timedelta(days=365)
    settings = SimpleNamespace(job_retention=None, job_retention_batch=100)
    assert run_async(task.prune_histories(settings, records)) == 0
    assert len(records.get("ann", "")["history"]) == 120
