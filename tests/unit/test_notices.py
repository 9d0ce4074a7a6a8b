"""Notices (gpulab.notices), as data: the ``notify`` field, where a webhook or a mail may go
(the admin's host patterns, public addresses only), which transition is which event, and
what a notice says (never the job's spec or output)."""

from __future__ import annotations

import pytest

from gpulab.errors import FieldError
from gpulab.notices import (
    EVENTS,
    Notify,
    NotifyRules,
    check_host_patterns,
    check_networks,
    job_event,
    job_notice,
    mail_text,
    parse_notify,
)

ANY = NotifyRules(webhook_hosts=("*",), mail=True, mail_domains=("example.org",))


def refused(value, rules=ANY) -> tuple[str, str]:
    with pytest.raises(FieldError) as e:
        parse_notify(value, rules)
    return e.value.field, str(e.value)


def test_a_request_parses_with_all_events_by_default_and_round_trips():
    n = parse_notify({"webhook": "https://hooks.example.com/T1/x?k=1"}, ANY)
    assert n == Notify(on=EVENTS, webhook="https://hooks.example.com/T1/x?k=1")
    n = parse_notify({"on": ["failed", "done", "failed"], "email": "ann.b+x@example.org"}, ANY)
    assert n.on == ("done", "failed") and n.email == "ann.b+x@example.org" and not n.webhook
    assert Notify.from_json(n.to_json()) == n
    assert parse_notify(None, ANY) is None and Notify.from_json(None) is None
    assert n.wants("done") and not n.wants("preempted") and not n.wants(None)


@pytest.mark.parametrize(
    "value, field, words",
    [
        ("https://x.org", "notify", "must be an object"),
        ({}, "notify", "needs a webhook or an email"),
        ({"webhook": "", "email": None}, "notify", "needs a webhook or an email"),
        ({"webhook": "https://a.org", "sms": "1"}, "notify.sms", "unknown field"),
        ({"webhook": "https://a.org", "on": []}, "notify.on", "list of events"),
        ({"webhook": "https://a.org", "on": "done"}, "notify.on", "list of events"),
        ({"webhook": "https://a.org", "on": ["ended"]}, "notify.on", "unknown event"),
        ({"webhook": "https://a.org", "on": ["done"] * 9}, "notify.on", "list of events"),
        ({"webhook": 5}, "notify.webhook", "must be a string"),
        ({"webhook": "ftp://a.org/x"}, "notify.webhook", "https://"),
        ({"webhook": "https://"}, "notify.webhook", "https://"),
        ({"webhook": "https://u:p@a.org/"}, "notify.webhook", "no user name or password"),
        ({"webhook": "https://a.org/#x"}, "notify.webhook", "fragment"),
        ({"webhook": "https://a.org/ x"}, "notify.webhook", "printable ASCII"),
        ({"webhook": "https://a.org/\r\nX: y"}, "notify.webhook", "printable ASCII"),
        ({"webhook": "https://bücher.de/"}, "notify.webhook", "printable ASCII"),
        ({"webhook": "https://a.org:99999/"}, "notify.webhook", "not a URL"),
        ({"webhook": "https://a_b.org/"}, "notify.webhook", "not a host name"),
        ({"webhook": "https://" + "a" * 2100 + ".org"}, "notify.webhook", "at most 2048"),
        ({"email": "ann"}, "notify.email", "not an e-mail address"),
        ({"email": "ann@localhost"}, "notify.email", "not an e-mail address"),
        ({"email": "a\r\nBcc: x@example.org"}, "notify.email", "not an e-mail address"),
        ({"email": "a b@example.org"}, "notify.email", "not an e-mail address"),
        ({"email": "ann@evil.org"}, "notify.email", "may not go to evil.org"),
        ({"email": "ann@example.org.evil.org"}, "notify.email", "may not go to"),
        ({"email": "x" * 65 + "@example.org"}, "notify.email", "not an e-mail address"),
    ],
)
def test_refusals_name_the_field(value, field, words):
    got_field, message = refused(value)
    assert got_field == field and words in message, message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",  # loopback: the service, the proxy, the engine's TCP socket
        "http://127.0.0.1:8081/hub/api/users",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",  # IPv4-mapped loopback
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata
        "http://[fe80::1]/",
        "http://10.0.0.1/",
        "http://172.17.0.1:8081/",  # the Docker bridge's gateway: the hub's API
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
        "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
        "http://2130706433/",  # 127.0.0.1 as one number: a resolver would take it
        "http://127.1/",
        "http://0x7f.0.0.1/",
        "http://0177.0.0.1/",
    ],
)
def test_no_webhook_to_a_private_address_even_when_any_host_is_allowed(url):
    field, message = refused({"webhook": url})
    assert field == "notify.webhook", message


def test_the_admins_networks_open_private_addresses():
    rules = NotifyRules(webhook_hosts=("10.1.2.3", "[::1]:*"), webhook_networks=("10.1.2.0/24",))
    assert parse_notify({"webhook": "http://10.1.2.3/x"}, rules).webhook == "http://10.1.2.3/x"
    assert refused({"webhook": "http://[::1]:9000/"}, rules)[0] == "notify.webhook"
    assert rules.address_refusal("10.1.2.200") is None
    assert rules.address_refusal("::ffff:10.1.2.7") is None  # mapped: judged as IPv4
    assert "not a public address" in rules.address_refusal("10.1.3.1")
    assert rules.address_refusal("93.184.215.14") is None  # public
    assert rules.address_refusal("2606:4700::1111") is None
    assert "not an IP address" in rules.address_refusal("example.org")


@pytest.mark.parametrize(
    "hosts, url, allowed",
    [
        ((), "https://hooks.example.org/x", False),  # the default: webhooks off
        (("hooks.example.org",), "https://hooks.example.org/x", True),
        (("hooks.example.org",), "http://hooks.example.org/x", True),
        (("hooks.example.org",), "https://HOOKS.example.org./x", True),
        (("hooks.example.org",), "https://hooks.example.org:443/x", True),
        (("hooks.example.org",), "https://hooks.example.org:8443/x", False),
        (("hooks.example.org",), "http://hooks.example.org:443/x", False),
        (("hooks.example.org:8443",), "https://hooks.example.org:8443/x", True),
        (("hooks.example.org:8443",), "https://hooks.example.org/x", False),
        (("hooks.example.org:*",), "https://hooks.example.org:22/x", True),
        (("hooks.example.org",), "https://evil.org/hooks.example.org", False),
        (("hooks.example.org",), "https://hooks.example.org.evil.org/", False),
        (("*.example.org",), "https://a.b.example.org/", True),
        (("*.example.org",), "https://example.org/", False),
        (("*.example.org",), "https://badexample.org/", False),
        (("*",), "https://anything.example.net/", True),
        (("*",), "https://anything.example.net:8080/", False),
        (("*:*",), "https://anything.example.net:8080/", True),
        (("93.184.215.14",), "https://93.184.215.14/", True),
        (("93.184.215.14",), "https://93.184.215.15/", False),
    ],
)
def test_the_admins_host_patterns(hosts, url, allowed):
    why = NotifyRules(webhook_hosts=hosts).webhook_refusal(url)
    assert (why is None) is allowed, why


def test_host_patterns_and_networks_are_checked_as_settings():
    check_host_patterns(["*", "*.example.org", "a.example.org:8443", "[::1]:*", "10.0.0.1:*"])
    for bad in ["http://a.org", "a.org/x", "a.org:0", "a.org:x", "[zz]", "a_b.org", "*a.org"]:
        with pytest.raises(ValueError):
            check_host_patterns([bad])
    check_networks(["10.0.0.0/8", "127.0.0.1", "fd00::/8"])
    with pytest.raises(ValueError, match="not an address or a network"):
        check_networks(["10.0.0.0/33"])


def test_mail_is_off_without_a_server_or_domains():
    for rules in (NotifyRules(mail=True), NotifyRules(mail_domains=("*",))):
        assert "not enabled" in refused({"email": "ann@example.org"}, rules)[1]
    wide = NotifyRules(mail=True, mail_domains=("*",))
    assert parse_notify({"email": "ann@any.example.net"}, wide).email == "ann@any.example.net"
    sub = NotifyRules(mail=True, mail_domains=("*.example.org",))
    assert sub.mail_refusal("ann@lab.example.org") is None
    assert sub.mail_refusal("ann@example.org") is not None


def test_which_transition_is_which_event():
    assert job_event("DONE", "EXITED") == "done"
    for state in ("FAILED", "ERROR", "SYNC_FAILED"):
        assert job_event(state, "X") == "failed"
    assert job_event("INTERRUPTED", "USER_INTERRUPT") == "interrupted"
    assert job_event("INTERRUPTED", "TIMEOUT") == "interrupted"
    assert job_event("INTERRUPTING", "PREEMPTED") == "preempted"
    for state, reason in [
        ("INTERRUPTING", "USER_INTERRUPT"),
        ("QUEUED", "PREEMPTED"),  # the re-queue after a preemption: told once, at its start
        ("RUNNING", ""),
        ("RESTARTING", "EXITED"),
        ("FINALIZING", "EXITED"),
    ]:
        assert job_event(state, reason) is None


def test_a_notice_says_what_happened_and_nothing_of_the_spec_or_output():
    job = {
        "id": "j1",
        "name": "train",
        "owner": "ann",
        "state": "FAILED",
        "reason": "EXITED",
        "message": "exit code 3" + "x" * 600,
        "exit_code": 3,
        "restarts": 1,
        "submitted": "2026-01-01T00:00:00Z",
        "updated": "2026-01-02T00:00:00Z",
        "billed_minutes": 7,
        "spec": {"env": {"TOKEN": "s3cr3t"}, "command": ["python", "t.py"]},
        "history": [{"message": "log line"}],
    }
    n = job_notice(job, "failed", "https://lab.example.org/services/gpulab/jobs/j1")
    assert n["event"] == "failed" and n["state"] == "FAILED" and n["exit_code"] == 3
    assert len(n["message"]) == 500
    assert "s3cr3t" not in repr(n) and "t.py" not in repr(n) and "log line" not in repr(n)
    subject, body = mail_text(n)
    assert subject == "[gpulab] job train: FAILED"
    assert "Exit code: 3" in body and "/jobs/j1" in body and "s3cr3t" not in body
    # a header never carries a line break, whatever a name holds
    subject, _ = mail_text({**n, "name": "a\r\nBcc: x@example.org"})
    assert "\r" not in subject and "\n" not in subject
