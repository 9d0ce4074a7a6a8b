"""The trust rule for X-Forwarded-* (gpulab.forwarded), as data: what the service believes of
a request that came through nginx and the hub's proxy, and what it never believes."""

from __future__ import annotations

import pytest

from gpulab.forwarded import Origin, forwarded_origin, is_trusted, trusted_networks
from gpulab.settings import GpulabSettings

LOOPBACK = trusted_networks(["127.0.0.1", "::1"])


def origin(headers: dict, peer: str = "127.0.0.1", networks=LOOPBACK) -> Origin:
    return forwarded_origin(peer, "http", "gpulab.example.org", headers, networks)


def test_through_nginx_and_the_hubs_proxy_the_browser_used_https():
    # nginx sets the proto to its $scheme and appends the browser to X-Forwarded-For; the
    # hub's proxy appends nginx's address and the scheme it was reached over (http)
    seen = origin(
        {
            "X-Forwarded-For": "203.0.113.7, 127.0.0.1",
            "X-Forwarded-Proto": "https,http",
            "X-Forwarded-Host": "gpulab.example.org",
        }
    )
    assert seen == Origin("https", "gpulab.example.org", "203.0.113.7")


def test_a_websocket_through_both_is_https_too():
    seen = origin({"X-Forwarded-For": "203.0.113.7,127.0.0.1", "X-Forwarded-Proto": "https,ws"})
    assert seen.scheme == "https" and seen.client == "203.0.113.7"


def test_a_client_at_the_hubs_proxy_claiming_https_is_not_believed():
    # straight to the hub's proxy (no nginx): its claims come before the proxy's own entries
    seen = origin(
        {
            "X-Forwarded-For": "10.9.9.9, 198.51.100.4",
            "X-Forwarded-Proto": "https,http",
            "X-Forwarded-Host": "evil.example",
        }
    )
    assert seen == Origin("http", "gpulab.example.org", "198.51.100.4")


def test_a_client_behind_nginx_cannot_smuggle_a_claim_past_it():
    # nginx overwrote the proto; the client's own X-Forwarded-For entries lie beyond its own
    seen = origin(
        {
            "X-Forwarded-For": "127.0.0.1, 10.0.0.1, 203.0.113.7, 127.0.0.1",
            "X-Forwarded-Proto": "https,http",
        }
    )
    assert seen.client == "203.0.113.7" and seen.scheme == "https"


def test_an_untrusted_peer_is_believed_in_nothing():
    seen = origin(
        {
            "X-Forwarded-For": "127.0.0.1",
            "X-Forwarded-Proto": "https",
            "X-Forwarded-Host": "evil.example",
        },
        peer="172.17.0.5",
    )
    assert seen == Origin("http", "gpulab.example.org", "172.17.0.5")


def test_no_forwarded_headers_is_the_connection_itself():
    assert origin({}) == Origin("http", "gpulab.example.org", "127.0.0.1")


def test_a_trusted_proxy_that_names_no_scheme_ends_the_walk():
    seen = origin({"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "http"})
    assert seen.scheme == "http" and seen.client == "127.0.0.1"
    # a scheme that is none of http, https, ws, wss is no scheme
    seen = origin({"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "gopher,http"})
    assert seen.scheme == "http"


def test_the_forwarded_host_is_believed_only_from_a_proxy_beyond_the_hubs_own():
    through = {"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "https,http"}
    assert origin({**through, "X-Forwarded-Host": "lab.example:8443"}).host == "lab.example:8443"
    # a value that is no host is ignored
    assert origin({**through, "X-Forwarded-Host": "a b/c"}).host == "gpulab.example.org"
    # the front door on another host, trusted by its network
    far = trusted_networks(["127.0.0.1", "10.0.0.0/8"])
    seen = origin(
        {
            "X-Forwarded-For": "203.0.113.7, 10.1.2.3",
            "X-Forwarded-Proto": "https,http",
            "X-Forwarded-Host": "lab.example",
        },
        networks=far,
    )
    assert seen == Origin("https", "lab.example", "203.0.113.7")
    # the same front door, not listed: nothing it says is believed
    seen = origin(
        {
            "X-Forwarded-For": "203.0.113.7, 10.1.2.3",
            "X-Forwarded-Proto": "https,http",
            "X-Forwarded-Host": "lab.example",
        }
    )
    assert seen == Origin("http", "gpulab.example.org", "10.1.2.3")


def test_trust_reads_addresses_and_networks():
    nets = trusted_networks(["127.0.0.1", "::1", "10.0.0.0/8"])
    assert is_trusted("10.200.0.1", nets)
    assert is_trusted("::ffff:127.0.0.1", nets)  # an IPv4-mapped peer
    assert is_trusted("::1", nets)
    assert not is_trusted("127.0.0.2", nets)
    assert not is_trusted("not-an-ip", nets)
    assert not is_trusted("", nets)


def test_the_setting_refuses_what_is_no_address():
    assert GpulabSettings().trusted_proxies == ["127.0.0.1", "::1"]
    with pytest.raises(Exception, match="trusted_proxies: 'proxy.local' is not an IP"):
        GpulabSettings(trusted_proxies=["127.0.0.1", "proxy.local"])
    settings = GpulabSettings(trusted_proxies=["192.0.2.0/24"])
    assert is_trusted("192.0.2.9", settings.trusted_proxy_networks)
