"""Sends notices (:mod:`gpulab.notices`) in the background: a webhook's JSON POST, an
e-mail through the site's SMTP server.

:meth:`Notifier.post` is what a workload's transition calls: it checks nothing slow, starts
one delivery task per channel and returns at once, so a job's lifecycle never waits for a
notice nor fails because of one. The outbox is bounded (:data:`CAPACITY` deliveries
pending, :data:`PER_OWNER` of one owner, and :data:`PER_OWNER_HOUR` started for one owner
in an hour; past them a notice is dropped and logged), at most
:data:`CONCURRENCY` attempts run at once, and a delivery is tried again after each of
:data:`DELAYS` when it failed for a reason that may pass (no answer, a time-out, a 5xx, 408
or 429); a refusal (the rules, a 4xx, a redirect, the mail server's 5xx) is not retried.
Pending notices are lost when the service stops: they are a courtesy, the job's record is
the truth.

A webhook is sent by tornado's own HTTP client with short time-outs, no redirect followed,
no proxy, and the answer's body read and thrown away; its host name is resolved by
:class:`CheckedResolver`, which refuses the connection unless every address is allowed
(:meth:`gpulab.notices.NotifyRules.address_refusal`), and the connection goes to the very
addresses checked (no second resolution for a rebinding DNS server to answer otherwise).
Only a webhook's host and a mail's domain are logged, never the URL (its path may hold a
token), the address's local part or the SMTP password.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import smtplib
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from email.utils import formatdate, make_msgid
from pathlib import Path
from urllib.parse import urlsplit

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.netutil import DefaultLoopResolver, Resolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from . import __version__
from .notices import Notify, NotifyRules, mail_text

log = logging.getLogger("gpulab.notifier")

#: seconds before each new attempt: four attempts in all, over about two and a half minutes
DELAYS = (5.0, 30.0, 120.0)
#: deliveries pending at once (attempting or waiting to retry); a notice past it is dropped
CAPACITY = 256
#: deliveries pending for one owner: one user's many jobs (or a slow receiver of theirs) never
#: fill the outbox that everyone's notices share
PER_OWNER = 32
#: deliveries one owner may start in an hour: an interrupt/resume loop cannot make the site's
#: mail server (or its webhooks) flood anyone
PER_OWNER_HOUR = 120
#: attempts running at once (a slow receiver holds one of them, for its time-out at most)
CONCURRENCY = 4
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 10.0
SMTP_TIMEOUT = 15.0
#: an answer's status that says "try again later"
_TRANSIENT = frozenset({408, 429})
_SMTP_PORTS = {"starttls": 587, "tls": 465, "none": 25}


class Undeliverable(Exception):
    """A notice that no retry can deliver (the rules refuse it, the receiver refused it)."""


class CheckedResolver(Resolver):
    """Resolves a webhook's host as the system does, then refuses it (:class:`Undeliverable`)
    unless every address is one the rules allow: a host with one private address among
    public ones is refused whole."""

    def initialize(self, rules: NotifyRules) -> None:  # tornado's Configurable
        self.rules = rules
        self.inner = DefaultLoopResolver()

    async def resolve(self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC):
        addresses = await self.inner.resolve(host, port, family)
        for _, address in addresses:
            why = self.rules.address_refusal(address[0])
            if why:
                raise Undeliverable(f"{host} resolves to {address[0]}: {why}")
        if not addresses:
            raise OSError(f"{host} has no address")
        return addresses


@dataclass(frozen=True)
class SmtpServer:
    """The site's mail server, as the ``notify_smtp_*`` settings give it."""

    host: str
    port: int = 0
    security: str = "starttls"
    user: str = ""
    password_env: str = ""
    password_file: str = ""
    sender: str = ""

    @classmethod
    def from_settings(cls, s) -> SmtpServer | None:
        if not s.notify_smtp_host:
            return None
        return cls(
            host=s.notify_smtp_host,
            port=s.notify_smtp_port or _SMTP_PORTS[s.notify_smtp_security],
            security=s.notify_smtp_security,
            user=s.notify_smtp_user,
            password_env=s.notify_smtp_password_env,
            password_file=s.notify_smtp_password_file,
            sender=s.notify_mail_from or f"gpulab@{socket.getfqdn()}",
        )

    def password(self) -> str:
        """The password, read now (a rotated file is read again): from the environment
        variable named, else the file's first line; "" for none."""
        if self.password_env:
            return os.environ.get(self.password_env, "")
        if self.password_file:
            lines = Path(self.password_file).read_text().splitlines()
            return lines[0] if lines else ""
        return ""

    def send(self, to: str, subject: str, body: str) -> None:
        """Send one mail (blocking: run in a thread). Raises :class:`Undeliverable` for what
        no retry mends, anything else (OSError, smtplib's errors) for what may pass."""
        msg = EmailMessage(policy=SMTP_POLICY)
        msg["From"] = self.sender
        msg["To"] = to
        msg["Subject"] = subject
        msg["Date"] = formatdate(localtime=False, usegmt=True)
        msg["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
        msg.set_content(body)
        context = ssl.create_default_context()
        try:
            if self.security == "tls":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                    self.host, self.port, timeout=SMTP_TIMEOUT, context=context
                )
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=SMTP_TIMEOUT)
            with smtp:
                if self.security == "starttls":
                    smtp.starttls(context=context)
                if self.user:
                    smtp.login(self.user, self.password())
                smtp.send_message(msg, from_addr=self.sender, to_addrs=[to])
        except (smtplib.SMTPNotSupportedError, smtplib.SMTPAuthenticationError) as e:
            raise Undeliverable(f"the mail server refused: {_smtp_words(e)}") from None
        except smtplib.SMTPRecipientsRefused as e:
            codes = [code for code, _ in e.recipients.values()]
            if all(c >= 500 for c in codes):
                raise Undeliverable(f"the mail server refused the address ({codes})") from None
            raise
        except smtplib.SMTPResponseException as e:
            if e.smtp_code >= 500:
                raise Undeliverable(f"the mail server refused: {_smtp_words(e)}") from None
            raise


def _smtp_words(e: Exception) -> str:
    """What an SMTP error says, short (a server's answer, never the password sent)."""
    if isinstance(e, smtplib.SMTPResponseException):
        text = e.smtp_error.decode(errors="replace") if isinstance(e.smtp_error, bytes) else ""
        return f"{e.smtp_code} {text[:200]}".strip()
    return type(e).__name__


def _where(channel: str, target: str) -> str:
    """What a log line names of a target: a webhook's host, a mail's domain."""
    if channel == "webhook":
        return f"webhook to {urlsplit(target).hostname}"
    return f"mail to ...@{target.rpartition('@')[2]}"


class Notifier:
    """The outbox and its two senders. One per process (the service's supervisor holds one);
    :meth:`post` from the event loop's thread."""

    def __init__(
        self,
        rules: NotifyRules,
        smtp: SmtpServer | None = None,
        *,
        delays: Sequence[float] = DELAYS,
        capacity: int = CAPACITY,
        per_owner: int = PER_OWNER,
        per_owner_hour: int = PER_OWNER_HOUR,
        concurrency: int = CONCURRENCY,
        timeout: float = REQUEST_TIMEOUT,
    ):
        self.rules, self.smtp = rules, smtp
        self.delays, self.capacity, self.timeout = tuple(delays), capacity, timeout
        self.per_owner, self.per_owner_hour = per_owner, per_owner_hour
        self._recent: dict[str, collections.deque[float]] = {}  # owner -> start times
        self._owners: dict[str, int] = {}  # owner -> deliveries pending
        self._slots = asyncio.Semaphore(concurrency)
        self._pending: set[asyncio.Task] = set()
        self._http: SimpleAsyncHTTPClient | None = None
        #: deliveries ended, by outcome ("sent", "failed", "dropped"): the tests' and logs' tally
        self.tally: dict[str, int] = {"sent": 0, "failed": 0, "dropped": 0}

    @classmethod
    def from_settings(cls, settings) -> Notifier:
        return cls(settings.notify_rules, SmtpServer.from_settings(settings))

    def post(self, notice: dict, notify: Notify) -> int:
        """Start delivering ``notice`` to where ``notify`` says; the deliveries started. Never
        raises, never waits: the caller is a workload's transition."""
        started = 0
        for channel, target in (("webhook", notify.webhook), ("email", notify.email)):
            if not target:
                continue
            owner = str(notice.get("owner") or "")
            why = self._no_room(owner)
            if why:
                self.tally["dropped"] += 1
                log.warning(
                    "notice of %s %s dropped: %s", notice.get("kind"), notice.get("id"), why
                )
                continue
            try:
                task = asyncio.get_running_loop().create_task(
                    self._deliver(channel, target, notice)
                )
            except RuntimeError:  # no loop: nothing to send it with
                self.tally["dropped"] += 1
                continue
            self._pending.add(task)
            self._owners[owner] = self._owners.get(owner, 0) + 1
            task.add_done_callback(lambda t, o=owner: self._done(t, o))
            started += 1
        return started

    def _no_room(self, owner: str) -> str | None:
        """Why another delivery for ``owner`` may not start now, or None (and it is counted
        as started)."""
        if len(self._pending) >= self.capacity:
            return f"{len(self._pending)} notices are pending already"
        if self._owners.get(owner, 0) >= self.per_owner:
            return f"{self.per_owner} notices of {owner} are pending already"
        now = time.monotonic()
        recent = self._recent.setdefault(owner, collections.deque())
        while recent and recent[0] < now - 3600:
            recent.popleft()
        if len(recent) >= self.per_owner_hour:
            return f"{owner} was sent {self.per_owner_hour} notices in the last hour"
        recent.append(now)
        return None

    def _done(self, task: asyncio.Task, owner: str) -> None:
        self._pending.discard(task)
        left = self._owners.get(owner, 1) - 1
        if left > 0:
            self._owners[owner] = left
        else:
            self._owners.pop(owner, None)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for every pending delivery to end (the tests; a clean stop)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)

    async def close(self) -> None:
        """Drop what is pending and close the HTTP client."""
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        if self._http is not None:
            self._http.close()
            self._http = None

    async def _deliver(self, channel: str, target: str, notice: dict) -> None:
        what = f"notice of {notice.get('kind')} {notice.get('id')} ({notice.get('event')})"
        where = _where(channel, target)
        attempts = len(self.delays) + 1
        for attempt in range(1, attempts + 1):
            try:
                # the rules of now: the admin may have closed a host since the job was accepted
                why = self.rules.check(
                    Notify(webhook=target) if channel == "webhook" else Notify(email=target)
                )
                if why:
                    raise Undeliverable(why[1])
                async with self._slots:
                    if channel == "webhook":
                        await self._post_json(target, notice)
                    else:
                        await self._mail(target, notice)
            except asyncio.CancelledError:
                raise
            except Undeliverable as e:
                self.tally["failed"] += 1
                log.warning("%s not sent (%s): %s", what, where, e)
                return
            except Exception as e:
                if attempt == attempts:
                    self.tally["failed"] += 1
                    log.warning("%s not sent (%s) after %d tries: %s", what, where, attempts, e)
                    return
                delay = self.delays[attempt - 1]
                log.info("%s (%s) failed, trying again in %g s: %s", what, where, delay, e)
                await asyncio.sleep(delay)
                continue
            self.tally["sent"] += 1
            log.info("%s sent (%s)", what, where)
            return

    def _client(self) -> SimpleAsyncHTTPClient:
        if self._http is None:
            self._http = SimpleAsyncHTTPClient(
                force_instance=True,
                resolver=CheckedResolver(rules=self.rules),
                max_clients=CONCURRENCY,
            )
        return self._http

    async def _post_json(self, url: str, notice: dict) -> None:
        request = HTTPRequest(
            url,
            method="POST",
            body=json.dumps(notice),
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"gpulab/{__version__} (notice)",
            },
            connect_timeout=min(CONNECT_TIMEOUT, self.timeout),
            request_timeout=self.timeout,
            follow_redirects=False,
            decompress_response=False,
            streaming_callback=lambda chunk: None,  # the answer's body is not read
            validate_cert=True,
        )
        try:
            response = await self._client().fetch(request, raise_error=False)
        except HTTPClientError as e:  # 599: no connection, a time-out
            raise OSError(f"no answer: {e}") from None
        code = response.code
        if 200 <= code < 300:
            return
        if code >= 500 or code in _TRANSIENT:
            raise OSError(f"answered {code}")
        raise Undeliverable(
            f"answered {code}" + (" (redirects are not followed)" if code < 400 else "")
        )

    async def _mail(self, to: str, notice: dict) -> None:
        if self.smtp is None:
            raise Undeliverable("no mail server is configured (notify_smtp_host)")
        subject, body = mail_text(notice)
        await asyncio.to_thread(self.smtp.send, to, subject, body)
