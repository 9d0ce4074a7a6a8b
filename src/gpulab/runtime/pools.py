"""Room in an engine's address pools for one network per user (pure: what ``Runtime.survey``
read in, a judgement out).

Every user with a notebook or a job holds one bridge network (``runtime/network.py``), and a
Docker engine cuts each network's subnet from its *default address pools*. Docker's built-in
pools hold 31 networks (below), some of them already taken (the default bridge, Compose
projects...): past that, the engine refuses the next network and that user's notebook or job
cannot start. The operator's fix is ``default-address-pools`` in daemon.json.

One rule, asked in two places: ``gpulab doctor``'s "address pools" check and the service's
start-up warning (``gpulab.service.__main__``): :func:`pool_room` counts, and
:meth:`PoolRoom.short_of` judges against the users counted on (:func:`users_counted`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .base import EngineSurvey

#: Docker's built-in default address pools (moby's ipamutils): 172.17-19/16 and 172.20/14,
#: 172.24/14, 172.28/14 cut in /16s (15 networks), 192.168.0.0/16 cut in /20s (16): 31 bridges
DOCKER_DEFAULT_POOLS = (
    ("172.17.0.0/16", 16),
    ("172.18.0.0/16", 16),
    ("172.19.0.0/16", 16),
    ("172.20.0.0/14", 16),
    ("172.24.0.0/14", 16),
    ("172.28.0.0/14", 16),
    ("192.168.0.0/16", 20),
)
#: the users counted on when no limit is configured (JupyterHub's active_server_limit)
DEFAULT_USERS = 50
#: what to put in daemon.json for more networks (256 bridges of 254 addresses)
POOLS_EXAMPLE = '{"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]}'
#: what the operator does when the pools are too small (the doctor's advice, the warning's)
POOLS_FIX = (
    f"give Docker more, smaller pools in /etc/docker/daemon.json: {POOLS_EXAMPLE} "
    "(256 networks), then restart dockerd"
)

#: what engines answer when no subnet is left for a new network (Engine 20.10-24;
#: Engine 25 and later; before 18.06)
POOLS_EXHAUSTED = (
    "could not find an available, non-overlapping ipv4 address pool",
    "all predefined address pools have been fully subnetted",
    "could not find an available predefined network",
)


def pools_exhausted(engine_said: str) -> bool:
    """True when the engine refused a network because its address pools are used up."""
    text = engine_said.lower()
    return any(t in text for t in POOLS_EXHAUSTED)


def _pool_networks(pools: Iterable[tuple[str, int]]) -> list[tuple[ipaddress.IPv4Network, int]]:
    out = []
    for base, size in pools:
        try:
            net = ipaddress.ip_network(base, strict=False)
        except ValueError:
            continue
        if size >= net.prefixlen:
            out.append((net, size))
    return out


def pool_capacity(pools: Iterable[tuple[str, int]]) -> int:
    """How many networks the pools hold: each base cut into subnets of its size."""
    return sum(2 ** (size - net.prefixlen) for net, size in _pool_networks(pools))


def _in_pools(subnet: str, pools: list[tuple[ipaddress.IPv4Network, int]]) -> bool:
    try:
        net = ipaddress.ip_network(subnet, strict=False)
    except ValueError:
        return False
    return any(net.version == p.version and net.subnet_of(p) for p, _ in pools)


@dataclass(frozen=True)
class PoolRoom:
    """What the engine's pools hold: ``total`` networks, ``others`` taken by networks that
    are not this installation's, ``ours`` held by gpulab's now; ``described``: which pools."""

    total: int
    others: int
    ours: int
    described: str

    @property
    def room(self) -> int:
        """Networks gpulab's users may hold (theirs now included)."""
        return max(self.total - self.others, 0)

    def short_of(self, users: int) -> bool:
        """The rule: fewer networks than users who may each need one."""
        return self.room < users

    def found(self) -> str:
        return (
            f"room for {self.room} user networks: {self.total} in {self.described}, "
            f"{self.others} taken by other networks, {self.ours} by gpulab's now"
        )


def pool_room(engine: EngineSurvey) -> PoolRoom:
    """Count the room in the pools ``engine`` reported (Docker's built-in ones when it named
    none)."""
    pools = engine.address_pools or DOCKER_DEFAULT_POOLS
    described = (
        ", ".join(f"{b} by /{s}" for b, s in pools) + f" ({engine.pools_from})"
        if engine.address_pools
        else "Docker's built-in pools"
    )
    split = _pool_networks(pools)
    others = sum(
        1 for n in engine.networks if not n.ours and any(_in_pools(s, split) for s in n.subnets)
    )
    ours = sum(1 for n in engine.networks if n.ours)
    return PoolRoom(pool_capacity(pools), others, ours, described)


def users_counted(config: Mapping, given: int | None = None) -> tuple[int, str]:
    """How many users may each hold a network at once, and where that number comes from:
    ``given`` (the doctor's ``--users``), else JupyterHub's active_server_limit in the hub's
    ``config`` (traitlets' Config), else DEFAULT_USERS ("")."""
    if given:
        return given, "--users"
    section = config.get("JupyterHub") if "JupyterHub" in config else None
    limit = section.get("active_server_limit") if section is not None else None
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return limit, "JupyterHub.active_server_limit"
    return DEFAULT_USERS, ""


def pools_warning(engine: EngineSurvey, users: int, users_from: str) -> str | None:
    """The service's start-up warning when the pools are short of ``users`` (None: they are
    not, or the engine did not answer)."""
    if engine.error:
        return None
    room = pool_room(engine)
    if not room.short_of(users):
        return None
    counted = users_from or f"active_server_limit unset, so {DEFAULT_USERS}"
    return (
        f"the address pools of the engine at {engine.address} are short of networks for "
        f"{users} users ({counted}): {room.found()}. Each user with a notebook or a job holds "
        "one network, and once none is left their workloads cannot start. To fix: "
        f"{POOLS_FIX} (docs/scale-out.md#address-pools); or set "
        "c.JupyterHub.active_server_limit to the users you expect at once"
    )
