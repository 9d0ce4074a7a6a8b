"""The notices' sender (gpulab.notifier) against real receivers in this process: an HTTP
webhook receiver and aiosmtpd's SMTP server (tests/support/receivers.py). Retries on a
receiver that fails first, a forbidden address never contacted (checked on what the name
resolves to, when sending), no redirect followed, a full outbox dropping, the mail as sent;
and a job's transition that never waits for its notice (JobContext.move, the one door)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gpulab.db import Database
from gpulab.jobs.records import JobRecords
from gpulab.jobs.supervisor.context import JobContext
from gpulab.lifecycle import JobState
from gpulab.notices import Notify, NotifyRules
from gpulab.notifier import Notifier, SmtpServer
from gpulab.settings import GpulabSettings
from tests.conftest import run_async
from tests.support.receivers import MailServer, WebhookReceiver

LOOPBACK = NotifyRules(
    webhook_hosts=("127.0.0.1:*", "localhost:*"), webhook_networks=("127.0.0.1",)
)
FAST = (0.05, 0.05, 0.05)
NOTICE = {
    "kind": "job",
    "event": "done",
    "id": "j1",
    "name": "train",
    "owner": "ann",
    "state": "DONE",
    "reason": "EXITED",
    "message": "exit code 0",
    "exit_code": 0,
    "submitted": "2026-01-01T00:00:00Z",
    "at": "2026-01-01T01:00:00Z",
    "url": None,
}


def deliver(notifier: Notifier, notify: Notify) -> int:
    async def main():
        started = notifier.post(NOTICE, notify)
        await notifier.drain(timeout=10)
        await notifier.close()
        return started

    return run_async(main())


def test_a_webhook_is_retried_until_its_receiver_answers():
    with WebhookReceiver(fail_first=2) as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST)
        assert deliver(notifier, Notify(webhook=hooks.url("/h?t=1"))) == 1
        assert [p["status"] for p in hooks.posts] == [500, 500, 204]
        assert hooks.delivered() == [NOTICE]
        post = hooks.posts[-1]
        assert post["path"] == "/h?t=1" and post["headers"]["Content-Type"] == "application/json"
        assert notifier.tally == {"sent": 1, "failed": 0, "dropped": 0}


def test_a_receiver_that_never_answers_well_is_given_up_after_the_retries():
    with WebhookReceiver(fail_first=99) as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST)
        deliver(notifier, Notify(webhook=hooks.url()))
        assert len(hooks.posts) == 4 and notifier.tally["failed"] == 1


@pytest.mark.parametrize(
    "rules, host",
    [
        # the host is allowed, its address is not (no notify_webhook_networks)
        (NotifyRules(webhook_hosts=("127.0.0.1:*",)), "127.0.0.1"),
        # a name the rules allow, which resolves to loopback: refused when sending
        (NotifyRules(webhook_hosts=("localhost:*",)), "localhost"),
        # the admin closed the host since the job was accepted
        (NotifyRules(webhook_hosts=("hooks.example.org",)), "127.0.0.1"),
    ],
)
def test_a_forbidden_receiver_is_never_contacted(rules, host, caplog):
    with WebhookReceiver() as hooks:
        notifier = Notifier(rules, delays=FAST)
        deliver(notifier, Notify(webhook=f"http://{host}:{hooks.port}/secret-token"))
        assert hooks.posts == [] and notifier.tally["failed"] == 1
        # one try (a refusal is not retried), logged by host: never the URL's path
        assert "secret-token" not in caplog.text and f"webhook to {host}" in caplog.text


def test_a_redirect_is_not_followed_nor_retried():
    with WebhookReceiver(status=302) as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST)
        deliver(notifier, Notify(webhook=hooks.url()))
        assert len(hooks.posts) == 1 and notifier.tally["failed"] == 1


def test_the_outbox_is_bounded():
    with WebhookReceiver() as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST, capacity=1)

        async def main():
            first = notifier.post(NOTICE, Notify(webhook=hooks.url()))
            second = notifier.post(NOTICE, Notify(webhook=hooks.url()))
            await notifier.drain(timeout=10)
            await notifier.close()
            return first, second

        assert run_async(main()) == (1, 0)
        assert notifier.tally == {"sent": 1, "failed": 0, "dropped": 1}
        assert len(hooks.posts) == 1
        # and one owner's share of it: another owner's notice still goes
        notifier = Notifier(LOOPBACK, delays=FAST, per_owner=1)

        async def two_owners():
            sent = [
                notifier.post({**NOTICE, "owner": o}, Notify(webhook=hooks.url())) for o in "aab"
            ]
            await notifier.drain(timeout=10)
            await notifier.close()
            return sent

        assert run_async(two_owners()) == [1, 0, 1]
        assert notifier._owners == {}  # every pending delivery counted out once ended
        # and one owner's deliveries in an hour: a loop of interrupts floods no one
        notifier = Notifier(LOOPBACK, delays=FAST, per_owner_hour=2)

        async def a_loop():
            sent = [
                notifier.post({**NOTICE, "owner": o}, Notify(webhook=hooks.url())) for o in "aaab"
            ]
            await notifier.drain(timeout=10)
            await notifier.close()
            return sent

        assert run_async(a_loop()) == [1, 1, 0, 1]


def test_a_mail_goes_through_the_sites_smtp_server():
    with MailServer() as mail:
        smtp = SmtpServer("127.0.0.1", mail.port, security="none", sender="gpulab@lab.example")
        rules = NotifyRules(mail=True, mail_domains=("example.org",))
        notifier = Notifier(rules, smtp, delays=FAST)
        deliver(notifier, Notify(email="ann@example.org"))
        assert notifier.tally["sent"] == 1
        [(sender, to, msg)] = mail.messages
        assert sender == "gpulab@lab.example" and to == ["ann@example.org"]
        assert msg["Subject"] == "[gpulab] job train: DONE"
        assert msg["Auto-Submitted"] == "auto-generated"
        assert "Your job train (j1) is DONE." in msg.get_payload()
        # a domain the admin does not (or no longer) allows is not mailed
        deliver(Notifier(rules, smtp, delays=FAST), Notify(email="ann@evil.org"))
        assert len(mail.messages) == 1


def test_mail_to_a_server_that_is_down_is_retried_then_given_up():
    smtp = SmtpServer("127.0.0.1", 1, security="none", sender="gpulab@lab.example")
    notifier = Notifier(NotifyRules(mail=True, mail_domains=("*",)), smtp, delays=FAST)
    deliver(notifier, Notify(email="ann@example.org"))
    assert notifier.tally["failed"] == 1


def test_a_jobs_transition_never_waits_for_its_notice(tmp_path):
    """A receiver that hangs for 1 s: the job's move is recorded at once, the notice (one,
    naming the job) arrives later, in the background."""
    settings = GpulabSettings(instance="t", public_url="https://lab.example.org/")
    records = JobRecords(Database(f"sqlite:///{tmp_path / 'db.sqlite'}"), "t")
    with WebhookReceiver(delay=1.0) as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST)
        ctx = JobContext(settings, records, None, None, None, None, Path("."), notifier=notifier)
        spec = {
            "image": "i",
            "command": ["x"],
            "notify": {"on": ["interrupted"], "webhook": hooks.url(), "email": None},
        }
        job_id = records.create("ann", spec, "train", ())["id"]

        async def main():
            began = time.monotonic()
            job = await ctx.move(
                job_id, JobState.INTERRUPTED, expect=JobState.QUEUED, reason="USER_INTERRUPT"
            )
            took = time.monotonic() - began
            await asyncio.sleep(0.3)  # the receiver has it now, and holds the answer
            assert len(hooks.posts) == 1 and notifier.tally["sent"] == 0
            await notifier.drain(timeout=10)
            await notifier.close()
            return job, took

        job, took = run_async(main())
        assert job["state"] == "INTERRUPTED" and took < 0.5
        [body] = hooks.delivered()
        assert body["id"] == job_id and body["event"] == "interrupted"
        assert body["url"] == f"https://lab.example.org/services/gpulab/jobs/{job_id}"
        assert "spec" not in body and "x" not in body.values()


def test_a_notebooks_stop_is_told_through_its_records(tmp_path):
    """NotebookRecords.transition (the one door of a notebook's states, in the hub) tells
    the announcer, which hands the notice to the notifier on the loop: one for STOPPED, none
    for the states before it."""
    from gpulab.lifecycle import NotebookState as S
    from gpulab.notebooks.announce import Announcer
    from gpulab.notebooks.records import NotebookRecords
    from gpulab.resources import Limits, Resources

    settings = GpulabSettings(instance="t", public_url="https://lab.example.org/")
    with WebhookReceiver() as hooks:
        notifier = Notifier(LOOPBACK, delays=FAST)

        async def main():
            loop = asyncio.get_running_loop()
            db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
            records = NotebookRecords(db, "t", observer=Announcer(settings, notifier, loop))
            notify = {"on": ["done"], "webhook": hooks.url("/nb"), "email": None}
            options = {"resources": {"cpus": 1.0, "memory": "1G", "gpus": 0}, "notify": notify}
            records.start(
                "ann", "", Resources(1, 1024**3, 0), Limits(4, 8 * 1024**3, 0), options=options
            )
            for state in (S.RUNNING, S.STOPPING, S.STOPPED):
                await asyncio.to_thread(records.transition, "ann", "", state, reason="IDLE")
            await asyncio.sleep(0.05)  # the hop onto the loop
            await notifier.drain(timeout=10)
            await notifier.close()

        run_async(main())
        [body] = hooks.delivered()
        assert (body["kind"], body["event"], body["state"]) == ("notebook", "done", "STOPPED")
        assert body["owner"] == "ann" and body["reason"] == "IDLE"
        assert body["url"] == "https://lab.example.org/hub/home"
        assert "options" not in body
