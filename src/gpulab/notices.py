"""Notices (pure): what a user asks to be told of a workload's end, where a notice may go,
and what it says.

A job spec's ``notify`` field (``{"on": [...], "webhook": URL, "email": ADDRESS}``) becomes a
:class:`Notify`; :func:`parse_notify` refuses what the site's :class:`NotifyRules` forbid,
naming the field (``notify.webhook``...). The rules are the admin's settings:

- webhooks go only to the hosts the admin lists (``notify_webhook_hosts``: ``*`` any host,
  ``*.example.org`` its subdomains, ``hooks.example.org`` that host; a pattern without a port
  allows the scheme's default port only, ``host:8443`` or ``host:*`` others), none by default;
- whatever the host, a webhook connects only to a public address (:func:`public`), or to one
  in the networks the admin lists (``notify_webhook_networks``): no loopback, private,
  link-local (169.254.169.254, the clouds' metadata), shared, reserved or multicast address,
  checked on the literal at submission and on every resolved address at send time
  (:mod:`gpulab.notifier`), so a name that resolves to the hub's own network is refused too;
- e-mail goes through the site's SMTP server, only when one is configured, and only to the
  domains the admin lists (``notify_mail_domains``, same patterns; none by default).

:func:`job_event` says which event a job's transition is; :func:`job_notice` builds what is
sent: the job's id, name, owner, state, reason, message, exit code and times, never its spec
(no environment value, no secret reference, no command) nor any of its output.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .bounds import shown
from .checks import first_unknown, key_text
from .errors import FieldError

#: what a user may ask to be told of, in this order: a job ended DONE; it ended FAILED,
#: ERROR or SYNC_FAILED; it ended INTERRUPTED (by its owner, an admin or its time-out); its
#: GPUs are taken back by in-quota work (SIGTERM, the grace period to checkpoint)
EVENTS = ("done", "failed", "interrupted", "preempted")
NOTIFY_FIELDS = ("on", "webhook", "email")
MAX_URL_CHARS = 2048
#: RFC 5321's longest path, and a local part's
MAX_EMAIL_CHARS = 254
MAX_LOCAL_PART_CHARS = 64
MAX_HOST_CHARS = 253
#: a notice's message, cut (a transition's message is written by gpulab, for the owner)
MAX_NOTICE_MESSAGE = 500
#: the job states that end in an event (an INTERRUPTING one for a preemption: job_event)
_JOB_EVENTS = {
    "DONE": "done",
    "FAILED": "failed",
    "ERROR": "failed",
    "SYNC_FAILED": "failed",
    "INTERRUPTED": "interrupted",
}
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_LOCAL_RE = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
#: the shape of a webhook URL and an e-mail address, for the JSON Schema (the parser says more)
URL_PATTERN = r"^$|^[hH][tT][tT][pP][sS]?://[!-~]+$"
EMAIL_PATTERN = r"^$|^[!-?A-~]+@[A-Za-z0-9.-]+$"


def public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is a public unicast address: not loopback, private, link-local (the
    clouds' metadata at 169.254.169.254), shared (100.64/10), reserved, multicast or
    unspecified; an IPv6 address that embeds an IPv4 one (mapped, 6to4, Teredo, NAT64) is
    judged by the IPv4 address it carries."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and ip in ipaddress.IPv6Network("64:ff9b::/96"):
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and not public(inner):
            return False
    return ip.is_global and not (
        ip.is_multicast
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_unspecified
    )


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None


def _host_pattern(pattern: str) -> tuple[str, str | None]:
    """``host[:port]`` (an IPv6 literal in brackets) -> (host, port or "*" or None); raises
    ValueError naming what is wrong."""
    p = pattern.strip().lower()
    port: str | None = None
    if p.startswith("["):
        host, _, rest = p[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{pattern!r}: write an IPv6 address as [addr] or [addr]:port")
            port = rest[1:]
        if _ip(host) is None:
            raise ValueError(f"{pattern!r}: {host!r} is not an IPv6 address")
        host = str(_ip(host))
    else:
        host, colon, port_text = p.partition(":")
        port = port_text if colon else None
        if host not in ("*",) and _ip(host) is None:
            name = host[2:] if host.startswith("*.") else host
            if not _HOST_RE.fullmatch(name) or len(name) > MAX_HOST_CHARS:
                raise ValueError(
                    f"{pattern!r}: a host pattern is *, *.domain, a host name or an address, "
                    "with :port or :* if not the scheme's default port"
                )
    if port is not None and port != "*" and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{pattern!r}: the port is a number from 1 to 65535, or *")
    return host, port


def check_host_patterns(patterns) -> None:
    """Raise ValueError naming the first host pattern that is not one (the settings' check)."""
    for p in patterns:
        _host_pattern(p)


def check_networks(networks) -> None:
    """Raise ValueError naming the first entry that is not an address or a network (CIDR)."""
    for n in networks:
        try:
            ipaddress.ip_network(n, strict=False)
        except ValueError:
            raise ValueError(f"{n!r} is not an address or a network such as 10.1.2.0/24") from None


def _name_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    literal = _ip(pattern)
    if literal is not None:
        return _ip(host) == literal
    return host == pattern


@dataclass(frozen=True)
class NotifyRules:
    """Where notices may go on this site (the admin's settings; nothing by default)."""

    #: host patterns a webhook may name; empty: webhooks are off
    webhook_hosts: tuple[str, ...] = ()
    #: networks (CIDR) a webhook may connect to besides public addresses
    webhook_networks: tuple[str, ...] = ()
    #: whether an SMTP server is configured
    mail: bool = False
    #: domain patterns an e-mail may go to; empty: e-mail is off
    mail_domains: tuple[str, ...] = ()

    def address_refusal(self, address: str) -> str | None:
        """Why a webhook may not connect to ``address`` (an IP address), or None."""
        ip = _ip(address)
        if ip is None:
            return f"{address!r} is not an IP address"
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        for n in self.webhook_networks:
            net = ipaddress.ip_network(n, strict=False)
            if net.version == ip.version and ip in net:
                return None
        if public(ip):
            return None
        return (
            f"{ip} is not a public address, and not in the networks the admin allows for "
            "webhooks (notify_webhook_networks)"
        )

    def webhook_refusal(self, url: str) -> str | None:
        """Why ``url`` may not receive webhooks here, or None: its syntax (http or https, no
        user name or password, no fragment, printable ASCII), then the admin's host patterns,
        then an address literal's network. A name's addresses are checked when sending."""
        if not self.webhook_hosts:
            return "webhooks are not enabled on this platform (the admin lists no host)"
        if len(url) > MAX_URL_CHARS:
            return f"a webhook URL is at most {MAX_URL_CHARS} characters"
        if not re.fullmatch(r"[!-~]+", url):
            return "a webhook URL is printable ASCII without spaces (percent-encode the rest)"
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            return f"not a URL: {e}"
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.netloc:
            return "a webhook URL starts with https:// (or http://) and a host"
        if "@" in parts.netloc:
            return (
                "a webhook URL has no user name or password (user:password@host): "
                "a token goes in its path or query"
            )
        if parts.fragment or url.endswith("#"):
            return "a webhook URL has no #fragment"
        host = (parts.hostname or "").rstrip(".")
        literal = _ip(host)
        if literal is None:
            last = host.rsplit(".", 1)[-1]
            if not _HOST_RE.fullmatch(host) or len(host) > MAX_HOST_CHARS:
                return f"{shown(host)} is not a host name"
            if last.isdigit() or last.startswith("0x"):
                return f"{shown(host)} is neither a host name nor an address written in full"
        port = port or _DEFAULT_PORTS[scheme]
        allowed = False
        for pattern in self.webhook_hosts:
            p_host, p_port = _host_pattern(pattern)
            if not _name_matches(p_host, host):
                continue
            wanted = _DEFAULT_PORTS[scheme] if p_port is None else p_port
            if wanted == "*" or int(wanted) == port:
                allowed = True
        if not allowed:
            where = host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
            return (
                f"webhooks may not go to {where}: the admin allows "
                f"{', '.join(self.webhook_hosts)} (notify_webhook_hosts)"
            )
        if literal is not None:
            return self.address_refusal(str(literal))
        return None

    def mail_refusal(self, address: str) -> str | None:
        """Why ``address`` may not be mailed here, or None."""
        if not self.mail or not self.mail_domains:
            return "e-mail notices are not enabled on this platform"
        if len(address) > MAX_EMAIL_CHARS:
            return f"an e-mail address is at most {MAX_EMAIL_CHARS} characters"
        local, at, domain = address.rpartition("@")
        domain = domain.lower()
        if (
            not at
            or len(local) > MAX_LOCAL_PART_CHARS
            or not _LOCAL_RE.fullmatch(local)
            or not _HOST_RE.fullmatch(domain)
            or "." not in domain
        ):
            return f"{shown(address)} is not an e-mail address such as ann@example.org"
        if not any(_name_matches(p.strip().lower(), domain) for p in self.mail_domains):
            return (
                f"e-mail notices may not go to {domain}: the admin allows "
                f"{', '.join(self.mail_domains)} (notify_mail_domains)"
            )
        return None

    def check(self, notify: Notify) -> tuple[str, str] | None:
        """(field, why) a parsed request is no longer allowed (the rules changed since it
        was accepted), or None: what the sender asks before each notice."""
        if notify.webhook and (why := self.webhook_refusal(notify.webhook)):
            return "webhook", why
        if notify.email and (why := self.mail_refusal(notify.email)):
            return "email", why
        return None


@dataclass(frozen=True)
class Notify:
    """Tell the owner of these events by webhook and/or e-mail."""

    on: tuple[str, ...] = EVENTS
    webhook: str = ""
    email: str = ""

    def wants(self, event: str | None) -> bool:
        return event is not None and event in self.on

    def to_json(self) -> dict:
        return {"on": list(self.on), "webhook": self.webhook or None, "email": self.email or None}

    @classmethod
    def from_json(cls, d: Mapping | None) -> Notify | None:
        """A stored request (:meth:`to_json`), trusted; None when there is none."""
        if not d:
            return None
        return cls(
            on=tuple(e for e in d.get("on") or EVENTS if e in EVENTS),
            webhook=d.get("webhook") or "",
            email=d.get("email") or "",
        )


def parse_notify(
    value: object, rules: NotifyRules, error: type[FieldError] = FieldError, key: str = "notify"
) -> Notify | None:
    """``{"on": [...], "webhook": URL, "email": ADDRESS}`` (null: none) as a :class:`Notify`,
    or ``error`` naming the field at fault (``notify.on``, ``notify.webhook``...)."""
    if value is None:
        return None
    help_ = (
        f'{key} must be an object such as {{"on": ["done", "failed"], "webhook": '
        '"https://hooks.example.org/...", "email": "ann@example.org"}'
    )
    if not isinstance(value, Mapping):
        raise error(key, f"{help_}, not {shown(value)}")
    unknown = first_unknown(value, NOTIFY_FIELDS)
    if unknown is not None:
        raise error(
            f"{key}.{key_text(unknown)}",
            f"unknown field {shown(unknown)}; {key} takes: {', '.join(NOTIFY_FIELDS)}",
        )
    on = value.get("on")
    events = EVENTS
    if on is not None:
        if not isinstance(on, list | tuple) or not on or len(on) > 2 * len(EVENTS):
            raise error(
                f"{key}.on",
                f"{key}.on must be a list of events from {', '.join(EVENTS)}, not {shown(on)}",
            )
        for e in on:
            if e not in EVENTS:
                raise error(
                    f"{key}.on", f"{key}.on: unknown event {shown(e)}; events: {', '.join(EVENTS)}"
                )
        events = tuple(e for e in EVENTS if e in on)
    found = {}
    for name, refusal in (("webhook", rules.webhook_refusal), ("email", rules.mail_refusal)):
        field = f"{key}.{name}"
        text = value.get(name)
        if text is None or text == "":
            found[name] = ""
            continue
        if not isinstance(text, str):
            raise error(field, f"{field} must be a string, not {shown(text)}")
        why = refusal(text)
        if why:
            raise error(field, f"{field}: {why}")
        found[name] = text
    if not found["webhook"] and not found["email"]:
        raise error(key, f"{key} needs a webhook or an email (or both); leave it out for none")
    return Notify(on=events, webhook=found["webhook"], email=found["email"])


# --- what is sent --------------------------------------------------------------------------


def job_event(state: str, reason: str) -> str | None:
    """The event a job's transition to ``state`` (for ``reason``) is, or None: an ended
    state, or the start of a preemption (INTERRUPTING for PREEMPTED)."""
    if state == "INTERRUPTING" and reason == "PREEMPTED":
        return "preempted"
    return _JOB_EVENTS.get(state)


def job_notice(job: Mapping, event: str, url: str | None = None) -> dict:
    """What a notice of ``job`` (its record, as the API shows it) says: never its spec, its
    environment or its output. ``url``: its page, where the site's address is known."""
    message = str(job.get("message") or "")
    if len(message) > MAX_NOTICE_MESSAGE:
        message = message[: MAX_NOTICE_MESSAGE - 3] + "..."
    return {
        "kind": "job",
        "event": event,
        "id": job.get("id"),
        "name": job.get("name"),
        "owner": job.get("owner"),
        "state": job.get("state"),
        "reason": job.get("reason") or "",
        "message": message,
        "exit_code": job.get("exit_code"),
        "restarts": job.get("restarts") or 0,
        "submitted": job.get("submitted"),
        "at": job.get("updated"),
        "billed_minutes": job.get("billed_minutes"),
        "url": url,
    }


#: the notebook states that are events: it ended (stopped by its owner, for idleness or its
#: maximum run time), or it failed
_NOTEBOOK_EVENTS = {
    "STOPPED": "done",
    "FAILED": "failed",
    "ERROR": "failed",
    "SYNC_FAILED": "failed",
}


def notebook_event(state: str) -> str | None:
    """The event a notebook's transition to ``state`` is, or None."""
    return _NOTEBOOK_EVENTS.get(state)


def notebook_notice(nb: Mapping, event: str, url: str | None = None) -> dict:
    """What a notice of a notebook (its record) says: its user, server name, state and the
    transition's reason and message; never its options (volumes, image) nor its output."""
    last = (nb.get("history") or [{}])[-1]
    message = str(last.get("message") or "")
    if len(message) > MAX_NOTICE_MESSAGE:
        message = message[: MAX_NOTICE_MESSAGE - 3] + "..."
    server = nb.get("server") or ""
    return {
        "kind": "notebook",
        "event": event,
        "id": f"{nb.get('user')}/{server}" if server else str(nb.get("user")),
        "name": server or "default",
        "owner": nb.get("user"),
        "state": nb.get("state"),
        "reason": last.get("reason") or "",
        "message": message,
        "exit_code": last.get("exit_code"),
        "submitted": nb.get("created"),
        "at": nb.get("updated"),
        "url": url,
    }


def _plain(text: object) -> str:
    """One line of plain text: control characters (a header's CR LF above all) as spaces."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(text))


def mail_text(notice: Mapping) -> tuple[str, str]:
    """(subject, body) of the e-mail that carries ``notice``."""
    what = f"{notice['kind']} {notice.get('name') or notice['id']}"
    subject = _plain(f"[gpulab] {what}: {notice['state']}")
    lines = [
        f"Your {what} ({notice['id']}) is {notice['state']}.",
        "",
        f"Event:     {notice['event']}",
        f"Reason:    {notice.get('reason') or '-'}",
        f"Message:   {notice.get('message') or '-'}",
    ]
    if notice.get("exit_code") is not None:
        lines.append(f"Exit code: {notice['exit_code']}")
    lines += [f"Submitted: {notice.get('submitted') or '-'}", f"At:        {notice.get('at')}"]
    if notice.get("url"):
        lines += ["", str(notice["url"])]
    lines += ["", "-- gpulab: you asked to be told of this (notify)."]
    return subject, "\n".join(_plain(line) for line in lines) + "\n"
