"""Who a request came from, over which scheme and to which host, behind proxies: the trust
rule for ``X-Forwarded-For``, ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` (pure).

The chain in front of the gpulab service is: the browser -> a TLS front door (nginx,
deploy/nginx/gpulab.conf) -> the hub's proxy (configurable-http-proxy, on the hub's bind_url)
-> the service on 127.0.0.1. Each proxy appends the address it was connected from to
``X-Forwarded-For`` and the scheme it was reached over to ``X-Forwarded-Proto`` (nginx's site
sets the proto to its own ``$scheme``, which drops whatever the client claimed; the hub's
proxy appends ``http``, or ``ws`` for a websocket). So the lists line up from their right
end: the last entry of each is what the nearest proxy saw, the one before what the proxy
before it saw, and so on.

The rule: start at the address the request really came from (the TCP peer). While that
address is a trusted proxy, believe its entry (the client it names, the scheme it was reached
over) and step one hop out; stop at the first address that is not trusted. The scheme is the
one the outermost trusted proxy was reached over; the client is the first untrusted address.
What an untrusted client put in the headers is never read: its entries lie further out than
the point where the walk stops. A trusted proxy that names no scheme for its hop ends the
walk too (the scheme stays the last one known).

``X-Forwarded-Host`` is a single value that the hub's proxy passes on as it got it (and sets
from ``Host`` only when absent), so it is believed only when the request came through a
trusted proxy beyond the hub's own (``own_hops``): then that proxy set it, never the client.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: the default trusted proxies: this host's loopback, where the hub's proxy reaches the
#: service and where a front door on the same host (the shipped nginx site) reaches the proxy
DEFAULT_TRUSTED_PROXIES = ("127.0.0.1", "::1")
#: the proxies of gpulab's own between the front door and the service (the hub's proxy)
OWN_HOPS = 1
#: what a forwarded host may look like: a name or an address, and a port
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$")
#: a websocket's scheme, as the hub's proxy names it, and the HTTP scheme it rides on
_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Origin:
    """What a request is taken to be: the scheme and host the browser used, and its client."""

    scheme: str
    host: str
    client: str


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """The networks of ``entries`` (addresses or CIDRs); ValueError naming a bad one."""
    out = []
    for entry in entries:
        try:
            out.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"{entry!r} is not an IP address or network (e.g. 127.0.0.1, 10.0.0.0/8)"
            ) from None
    return tuple(out)


def is_trusted(address: str, networks: Iterable[Network]) -> bool:
    """Whether ``address`` (an IP, maybe IPv4-mapped IPv6) is in one of ``networks``."""
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in networks)


def _entries(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",")] if value else []


def forwarded_origin(
    peer: str,
    scheme: str,
    host: str,
    headers: Mapping[str, str],
    networks: Iterable[Network],
    own_hops: int = OWN_HOPS,
) -> Origin:
    """The origin of a request that came from ``peer`` over ``scheme`` with ``Host: host``,
    with its ``headers`` (``X-Forwarded-For``, ``-Proto``, ``-Host``: any case of a Mapping
    that folds case, such as tornado's HTTPHeaders), believing only ``networks``' proxies."""
    networks = tuple(networks)
    hops = _entries(headers.get("X-Forwarded-For"))
    protos = [p.lower() for p in _entries(headers.get("X-Forwarded-Proto"))]
    client, walked = peer, 0
    for k in range(1, len(hops) + 1):  # k-th entry from the right
        if not is_trusted(client, networks):
            break
        proto = _SCHEMES.get(protos[-k]) if k <= len(protos) else None
        if proto is None:
            break  # this trusted proxy named no scheme: stop at what is known
        scheme, client, walked = proto, hops[-k], k
    forwarded_host = (headers.get("X-Forwarded-Host") or "").strip()
    if walked > own_hops and _HOST.match(forwarded_host):
        host = forwarded_host
    return Origin(scheme=scheme, host=host, client=client)
